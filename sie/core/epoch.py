"""ConfigEpoch: the monotonic model-write counter (architecture §4.1-§4.3, §12).

On sie-config the epoch is authoritative (bumped once per write that creates
profiles). On gateways and workers it is a local caching counter: deltas and
bootstrap advance it with ``set_max`` (never backwards); only the poller's
recovery path (remote < local after a successful export) may ``force_set`` it.
"""

from __future__ import annotations

import threading

__all__ = ["ConfigEpoch"]


class ConfigEpoch:
    """A thread-safe non-negative integer that normally only moves forward."""

    def __init__(self, value: int = 0) -> None:
        if value < 0:
            raise ValueError("epoch must be >= 0")
        self._value = value
        self._lock = threading.Lock()

    def get(self) -> int:
        return self._value

    def set_max(self, value: int) -> bool:
        """Advance to ``value`` if it is higher; returns whether it moved (§4.3)."""
        with self._lock:
            if value > self._value:
                self._value = value
                return True
            return False

    def force_set(self, value: int) -> None:
        """Set unconditionally: the poller's remote < local recovery only (§4.2)."""
        if value < 0:
            raise ValueError("epoch must be >= 0")
        with self._lock:
            self._value = value

    def increment(self) -> int:
        """Add one and return the new value (the config authority's bump, §3 step 3.5)."""
        with self._lock:
            self._value += 1
            return self._value
