"""vLLM's own Prometheus gauges for one model, read from the process-wide registry the
in-process engine records them in (``sie.engines.generators.vllm_engine``'s ``state``):
``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and the KV-cache usage
(current and older names), filtered by the ``model_name`` label."""

from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Gauges", "default_registry", "read_gauges"]

log = logging.getLogger(__name__)

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current, older name


@dataclass
class Gauges:
    """This model's series in vLLM's registry (summed over engines; KV usage: the max)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float | None = None
    names: set[str] = field(default_factory=set)  # metric names found


def read_gauges(reg: Any, served_name: str) -> Gauges | None:
    """This model's series in vLLM's prometheus registry, or None when absent."""
    if reg is None:
        return None
    g = Gauges()
    kv: dict[str, list[float]] = {}
    try:
        families = list(reg.collect())
    except Exception as exc:  # a broken collector must not break state()
        log.debug("reading vLLM's prometheus registry failed: %s", exc)
        return None
    for fam in families:
        if fam.name not in (_RUNNING, _WAITING, *_KV_USAGE):
            continue
        for s in fam.samples:
            if s.labels.get("model_name") != served_name or not math.isfinite(s.value):
                continue
            g.names.add(fam.name)
            if fam.name == _RUNNING:
                g.running += max(0, round(s.value))
            elif fam.name == _WAITING:
                g.waiting += max(0, round(s.value))
            else:
                kv.setdefault(fam.name, []).append(min(1.0, max(0.0, s.value)))
    if _RUNNING not in g.names:
        return None
    for name in _KV_USAGE:
        if kv.get(name):
            g.kv_usage = max(kv[name])
            break
    return g


def default_registry() -> Any:
    """The process-wide ``prometheus_client.REGISTRY`` (vLLM's), or None without it."""
    try:
        return importlib.import_module("prometheus_client").REGISTRY
    except ImportError:
        return None
