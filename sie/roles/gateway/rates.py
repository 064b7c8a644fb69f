"""Request rate over a sliding window, for ``/health``'s ``cluster.total_qps``."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

__all__ = ["RateMeter"]


class RateMeter:
    """Events per second over the last ``window_s`` seconds (memory: one float per
    event in the window, at most ``max_events``)."""

    def __init__(
        self,
        window_s: float = 60.0,
        max_events: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._events: deque[float] = deque(maxlen=max_events)

    def tick(self) -> None:
        """One event, now."""
        self._events.append(self._clock())

    def rate(self) -> float:
        """Events per second over the window."""
        cutoff = self._clock() - self.window_s
        while self._events and self._events[0] < cutoff:
            self._events.popleft()
        return len(self._events) / self.window_s
