"""Where a machine's cores go while a server is under load (Linux ``/proc``).

``CpuWatch(pid)`` reads, at ``start`` and ``stop``, the CPU time (user + system) of
every thread of the server process ``pid`` (``/proc/{pid}/task/*/stat``) and the
machine's idle time (``/proc/stat``: idle + iowait). ``stop`` returns cores, that is
CPU seconds per wall second:

- ``server``: the whole process;
- ``main``: its main thread (for ``sie serve``, the asyncio event loop: HTTP, routing,
  the bus both ways, the worker role's per-item work);
- ``other``: its other threads (engine calls, ONNX Runtime's pass and intra-op
  threads, tokenisation);
- ``idle``: cores of the whole machine that nobody used.

``measure_during(pid, start_after, seconds)`` runs a watch on a thread while the
caller runs a load: it starts after the load's warm-up and stops when its measured
part ends. A benchmark helper (``bench_peers.py``), standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["CpuWatch", "measure_during"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` (an empty dict when it is gone)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended between the listing and the read
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def _machine_idle() -> tuple[float, float]:
    """``(idle, total)`` jiffies of all cores since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return values[3] + values[4], sum(values)


class CpuWatch:
    """CPU use of one process and the machine's idle cores between ``start`` and
    ``stop`` (module docstring)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._threads: dict[int, float] = {}
        self._idle = (0.0, 0.0)
        self._t0 = 0.0

    def start(self) -> None:
        self._threads = _thread_cpu(self.pid)
        self._idle = _machine_idle()
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        """``{server, main, other, idle}`` in cores, and ``seconds`` measured."""
        threads = _thread_cpu(self.pid)
        idle = _machine_idle()
        wall = max(1e-6, time.monotonic() - self._t0)
        used = {tid: cpu - self._threads.get(tid, 0.0) for tid, cpu in threads.items()}
        main = used.get(self.pid, 0.0)
        total = sum(used.values())
        cores = os.cpu_count() or 1
        jiffies = idle[1] - self._idle[1]
        idle_cores = (idle[0] - self._idle[0]) / jiffies * cores if jiffies else 0.0
        return {
            "server": round(total / wall, 3),
            "main": round(main / wall, 3),
            "other": round((total - main) / wall, 3),
            "idle": round(idle_cores, 3),
            "seconds": round(wall, 2),
        }


def measure_during(pid: int, start_after: float, seconds: float) -> tuple[threading.Thread, dict]:
    """Start a thread that watches ``pid`` from ``start_after`` seconds from now for
    ``seconds`` (the caller leaves margins so that the window lies inside the load's
    measured part). Join the thread, then read the dict (empty when ``/proc`` is
    unreadable)."""
    result: dict[str, float] = {}

    def watch() -> None:
        try:
            time.sleep(start_after)
            w = CpuWatch(pid)
            w.start()
            time.sleep(max(0.2, seconds))
            result.update(w.stop())
        except OSError:
            pass  # no /proc (not Linux): no CPU columns

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, result
