"""CPU threads for engine calls: intra-op threads split among concurrent calls.

On a CPU a small forward pass does not scale across cores (each op's threads meet
at a barrier, and one preempted thread stalls the others), while two forward passes
on one core each do. So a worker may run several engine calls of one model at once
(the model's engine slots, ``engine_slots``) and gives each call
``cores // calls running`` torch intra-op threads: a lone call (light load) gets every
core, overlapping calls (heavy load) get one each. ``bench/bench_encode.py`` measures
the effect: on 2 cores two 1-thread calls encode about 1.15x more sentences/s than one
2-thread call at batch 16-32, and 1.4x more at batch 8.

Torch's thread count is per calling thread (OpenMP/MKL thread-local settings), so
each call sets its own before running. Engines that are not safe to call from two
threads at once keep a single slot (``Engine.concurrent_calls``, default 1).

Engine calls run at a lower CPU priority than the event loop (``nice``, default
``ENGINE_NICE``; Linux threads, and the OpenMP threads they start, inherit it):
on a saturated machine the loop that answers probes, publishes heartbeats and
collects results is scheduled first, and the engine takes every cycle left
(docs/security.md "Liveness").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

__all__ = ["ENGINE_NICE", "CallThreads", "cpu_cores", "engine_slots", "lower_priority"]

#: Nice value of threads that run engine calls (0 leaves them at the loop's priority).
ENGINE_NICE = 10

_local = threading.local()


def lower_priority(nice: int = ENGINE_NICE) -> None:
    """Lower the calling thread's CPU priority to ``nice`` (never raises it: that needs
    privileges); a no-op where threads have no priority of their own (not Linux)."""
    if getattr(_local, "nice", 0) >= nice:
        return
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        if current < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (AttributeError, OSError):
        pass
    _local.nice = nice


def cpu_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def engine_slots(engine: Any, device: str, configured: int) -> int:
    """How many calls of ``engine`` may run at once: ``configured`` (the worker's
    ``SIE_ENGINE_CONCURRENCY``), or more when the engine asks for more
    (``wanted_engine_slots``, default 0), capped by what the engine allows
    (``concurrent_calls``, default 1); always 1 on an accelerator, where calls
    queue on the device anyway.

    An engine asks for more slots when one call per core keeps every core busy without
    intra-op threads (ONNX int8, one text per pass, each call's passes on its own
    thread: ``sie.engines.onnx.runtime.Sessions``; docs/performance.md "Passes on the
    calling thread")."""
    if not device.startswith("cpu"):
        return 1
    allowed = int(getattr(engine, "concurrent_calls", 1) or 1)
    wanted = int(getattr(engine, "wanted_engine_slots", 0) or 0)
    return max(1, min(max(configured, wanted), allowed))


class CallThreads:
    """Counts engine calls in flight in this process and sizes each one's torch
    intra-op thread pool: ``max(1, cores // calls in flight)`` at its start.

    Args:
        cores: CPU cores to share (default: ``cpu_cores()``).
        nice: CPU priority of the threads that make the calls (``lower_priority``).
    """

    def __init__(self, cores: int | None = None, nice: int = ENGINE_NICE) -> None:
        self.cores = cores or cpu_cores()
        self.nice = nice
        self._lock = threading.Lock()
        self._running = 0

    @property
    def running(self) -> int:
        return self._running

    def wrap(
        self, run_batch: Callable[[Hashable, Sequence[Any]], Sequence[Any]]
    ) -> Callable[[Hashable, Sequence[Any]], Sequence[Any]]:
        """``run_batch`` with this call's thread count set on the calling thread."""

        def call(key: Hashable, payloads: Sequence[Any]) -> Sequence[Any]:
            with self._lock:
                self._running += 1
                threads = max(1, self.cores // self._running)
            try:
                lower_priority(self.nice)
                _set_torch_threads(threads)
                return run_batch(key, payloads)
            finally:
                with self._lock:
                    self._running -= 1

        return call


def _set_torch_threads(n: int) -> None:
    import sys

    torch = sys.modules.get("torch")  # engines without torch never import it here
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
