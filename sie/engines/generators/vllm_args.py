"""The engine arguments the vLLM engine (``vllm_engine``) starts vLLM with, built from a
model config and its profile's loadtime options. No vLLM import here."""

from __future__ import annotations

from typing import Any

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import ModelLoadFailed
from sie.engines.options import loadtime_positive_int
from sie.engines.weights import resolve_weights

__all__ = ["model_source", "vllm_engine_args"]


def model_source(config: ModelConfig) -> str:
    """The ``model`` argument for vLLM: a local weights path, else the ``hf_id``."""
    cfg = config
    try:
        return str(resolve_weights(cfg))
    except ModelLoadFailed:
        if cfg.weights_path or not cfg.hf_id:
            raise
        return cfg.hf_id  # vLLM resolves it through the hub (or its offline cache)


def vllm_engine_args(config: ModelConfig, profile: ResolvedProfile) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` keywords for ``config`` / ``profile`` (the loadtime options
    ``vllm_engine``'s module docstring lists, then ``engine_args`` as is).

    Raises:
        ModelLoadFailed: (CONFIG) a malformed option; (NOT_FOUND) a ``weights_path``
            that does not resolve.
    """
    lt = profile.loadtime
    sid = config.sie_id

    def bad(name: str, what: str) -> ModelLoadFailed:
        return ModelLoadFailed(
            f"model {sid!r}: loadtime.{name} must be {what}, got {lt.get(name)!r}",
            error_class="CONFIG",
            permanent=True,
        )

    args: dict[str, Any] = {
        "model": model_source(config),
        "served_model_name": sid,
        "disable_log_stats": False,  # vLLM's gauges feed state()
    }
    if config.hf_revision and args["model"] == config.hf_id:
        args["revision"] = config.hf_revision
    if "max_num_seqs" in lt:
        args["max_num_seqs"] = loadtime_positive_int(lt, "max_num_seqs", 1, sid)
    if "max_model_len" in lt:
        args["max_model_len"] = loadtime_positive_int(lt, "max_model_len", 1, sid)
    elif config.max_sequence_length:
        args["max_model_len"] = config.max_sequence_length
    if "gpu_memory_utilization" in lt:
        g = lt["gpu_memory_utilization"]
        if isinstance(g, bool) or not isinstance(g, int | float) or not 0.0 < g <= 1.0:
            raise bad("gpu_memory_utilization", "a number in (0, 1]")
        args["gpu_memory_utilization"] = float(g)
    dtype = lt.get("dtype", profile.compute_precision)
    if dtype is not None:
        if not isinstance(dtype, str) or not dtype:
            raise bad("dtype", "a non-empty string")
        args["dtype"] = dtype
    for flag in ("trust_remote_code", "enforce_eager"):
        if flag in lt:
            if not isinstance(lt[flag], bool):
                raise bad(flag, "a boolean")
            args[flag] = lt[flag]
    extra = lt.get("engine_args", {})
    if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
        raise bad("engine_args", "a mapping of vLLM engine arguments")
    args.update(extra)
    return args
