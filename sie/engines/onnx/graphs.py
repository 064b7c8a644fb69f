"""What an ONNX engine loads: the sentence-transformers pipeline it reproduces, the
precision it runs at, and the graph files (float32, then int8 when asked).

``read_st_pipeline``: ``modules.json`` (a ``Transformer``, then optionally ``Pooling``
and ``Normalize``; a directory without it is read as sentence-transformers reads a
plain Hugging Face one: mean pooling) and the pooling module's ``config.json`` (mean
or CLS pooling; the other modes are refused), ``sentence_bert_config.json``
(``do_lower_case``). Any other module (``Dense``, ``LayerNorm``, ...) is refused: its
work is not in the graph.

``precision``: the profile's ``compute_precision``: unset or ``float32`` → float32,
``int8`` → dynamic int8 (``sie.engines.onnx.quantize``); ``float16``/``bfloat16``
are refused (CONFIG).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import ModelLoadFailed
from sie.engines.generators.gguf import model_cache_root, safe_name
from sie.engines.onnx.export import (
    FP32_FILE,
    cached_graph_dir,
    export_graph,
    file_digest,
    shipped_onnx,
    weights_digest,
)
from sie.engines.onnx.quantize import ACTIVATION_SCALES, int8_file, quantize_int8

__all__ = [
    "StPipeline",
    "export_module",
    "fp32_graph",
    "int8_graph",
    "int8_scales",
    "module_inputs",
    "precision",
    "read_st_pipeline",
]

#: Precisions the ONNX engines run (``compute_precision``; ``None`` means float32).
PRECISIONS = ("float32", "int8")


@dataclass(frozen=True)
class StPipeline:
    """The sentence-transformers pipeline around the transformer."""

    pooling: str  # "mean" | "cls"
    normalize: bool  # a Normalize module: dense vectors are always unit length
    lowercase: bool  # do_lower_case: texts are lower-cased before tokenisation


def _json(path: Path, sie_id: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadFailed(
            f"model {sie_id!r}: cannot read {str(path)!r}: {exc}",
            error_class="CONFIG",
            permanent=True,
        ) from exc


def _refuse(sie_id: str, what: str) -> ModelLoadFailed:
    return ModelLoadFailed(
        f"model {sie_id!r}: {what}; the ONNX engines cannot reproduce it (use a torch profile)",
        error_class="CONFIG",
        permanent=True,
    )


def read_st_pipeline(root: Path, sie_id: str) -> StPipeline:
    """The pipeline ``root`` describes (module docstring).

    Raises:
        ModelLoadFailed: (CONFIG, permanent) an unreadable file, a module or pooling
            mode the engines do not reproduce.
    """
    lowercase = False
    if (root / "sentence_bert_config.json").is_file():
        lowercase = bool(_json(root / "sentence_bert_config.json", sie_id).get("do_lower_case"))
    if not (root / "modules.json").is_file():
        return StPipeline("mean", False, lowercase)
    modules = _json(root / "modules.json", sie_id)
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if not kinds or kinds[0] != "Transformer":
        raise _refuse(sie_id, f"modules.json starts with {kinds[:1]}, not a Transformer")
    extra = [k for k in kinds[1:] if k not in ("Pooling", "Normalize")]
    if extra:
        raise _refuse(sie_id, f"the pipeline has module(s) {extra}")
    pooling = "mean"
    for m in modules:
        if str(m.get("type", "")).endswith("Pooling"):
            cfg = _json(root / str(m.get("path", "")) / "config.json", sie_id)
            mode = cfg.get("pooling_mode")  # newer sentence-transformers write one name
            modes = (
                {str(mode)}
                if mode
                else {k.removeprefix("pooling_mode_") for k, v in cfg.items() if v is True}
            )
            modes = {
                "mean" if x == "mean_tokens" else "cls" if x == "cls_token" else x for x in modes
            }
            if len(modes) != 1 or not modes <= {"mean", "cls"}:
                raise _refuse(sie_id, f"pooling {sorted(modes)} is not one of mean, cls")
            pooling = modes.pop()
    return StPipeline(pooling, "Normalize" in kinds, lowercase)


def precision(profile: ResolvedProfile, sie_id: str) -> str:
    """``float32`` or ``int8`` (module docstring).

    Raises:
        ModelLoadFailed: (CONFIG, permanent) another ``compute_precision``.
    """
    value = profile.compute_precision or "float32"
    if value not in PRECISIONS:
        raise ModelLoadFailed(
            f"model {sie_id!r}: profile {profile.name!r} asks for compute_precision "
            f"{value!r}; the ONNX engines run {' or '.join(PRECISIONS)}",
            error_class="CONFIG",
            permanent=True,
        )
    return value


def module_inputs(module: Any, names: Sequence[str]) -> list[str]:
    """The ``names`` that ``module.forward`` accepts, in order."""
    params = inspect.signature(module.forward).parameters
    return [n for n in names if n in params]


def fp32_graph(
    config: ModelConfig,
    profile: ResolvedProfile,
    root: Path,
    model_cache_dir: str | Path | None,
    *,
    head: str,
    export: Callable[[Path], None],
    allow_shipped: bool = True,
) -> tuple[Path, bool]:
    """The float32 graph to serve (``sie.engines.onnx.export`` order: shipped, unless
    ``allow_shipped`` is false; cached; exported now by ``export(target)``) and whether
    it is shipped."""
    shipped = shipped_onnx(root, profile.loadtime, config.sie_id) if allow_shipped else None
    if shipped is not None:
        return shipped, True
    target = (
        cached_graph_dir(model_cache_dir, config.sie_id, weights_digest(root), head) / FP32_FILE
    )
    if not target.is_file():
        export(target)
    return target, False


def export_module(
    module: Any,
    example: Mapping[str, Any],
    names: Sequence[str],
    output_name: str,
    output_key: str,
    info: Mapping[str, Any],
) -> Callable[[Path], None]:
    """``fp32_graph``'s ``export`` for a Hugging Face ``module`` (``export_graph``)."""
    inputs = module_inputs(module, names)

    def run(target: Path) -> None:
        export_graph(module, example, inputs, output_name, output_key, target, info)

    return run


def int8_scales(profile: ResolvedProfile, sie_id: str) -> str:
    """The profile's loadtime ``int8_activation_scales``: ``tensor`` (default) or
    ``token`` (``sie.engines.onnx.quantize``).

    Raises:
        ModelLoadFailed: (CONFIG, permanent) another value.
    """
    value = profile.loadtime.get("int8_activation_scales", "tensor")
    if value not in ACTIVATION_SCALES:
        raise ModelLoadFailed(
            f"model {sie_id!r}: loadtime.int8_activation_scales must be one of "
            f"{', '.join(ACTIVATION_SCALES)}, not {str(value)[:40]!r}",
            error_class="CONFIG",
            permanent=True,
        )
    return str(value)


def int8_graph(
    fp32: Path,
    shipped: bool,
    model_cache_dir: str | Path | None,
    sie_id: str,
    scales: str = "tensor",
) -> Path:
    """The int8 graph made from ``fp32`` with ``scales`` activation scales, quantised
    now unless cached: beside an exported graph, or for a shipped one under the model
    cache keyed by that file's digest."""
    if shipped:
        short = file_digest(fp32)[:16]
        target = model_cache_root(model_cache_dir) / "onnx" / f"{safe_name(sie_id)}--{short}"
        target = target / int8_file(scales)
    else:
        target = fp32.parent / int8_file(scales)
    if not target.is_file():
        quantize_int8(fp32, target, token_scales=scales == "token")
    return target
