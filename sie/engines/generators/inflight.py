"""The in-flight request table every generation engine keeps (docs/architecture.md §2).

A generation engine tracks its live requests by ``request_id`` so that ``abort`` can
find one, a duplicate id is refused while the first is still running, and ``unload``
can end every stream. The table is shared by the transformers, vLLM and upstream
engines; what each keeps per request (a scheduler sequence, a vLLM stream, an HTTP
response) is the type parameter ``T``.

Thread-safe: requests start on event loops, ``unload`` runs on a worker thread.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

from sie.core.errors import InferenceError, InvalidInput

__all__ = ["InFlight"]

T = TypeVar("T")


class InFlight(Generic[T]):
    """Live requests of one engine, keyed by ``request_id``.

    ``closed`` is true between ``close()`` (unload) and the next ``open()`` (load):
    ``add`` then refuses new requests as "not loaded".
    """

    def __init__(self, sie_id: str) -> None:
        self._sie_id = sie_id
        self._lock = threading.Lock()
        self._live: dict[str, T] = {}
        self.closed = False

    def open(self) -> None:
        """Accept requests again (after a load)."""
        with self._lock:
            self.closed = False

    def add(self, request_id: str, live: T) -> None:
        """Register ``live`` as ``request_id``.

        Raises:
            InferenceError: the table is closed (the model is not loaded).
            InvalidInput: ``request_id`` is already in flight (field ``request_id``).
        """
        with self._lock:
            if self.closed:
                raise InferenceError(f"model {self._sie_id!r} is not loaded")
            if request_id in self._live:
                raise InvalidInput(
                    f"request_id {request_id!r} is already in flight", field="request_id"
                )
            self._live[request_id] = live

    def get(self, request_id: str) -> T | None:
        with self._lock:
            return self._live.get(request_id)

    def forget(self, request_id: str, live: T | None = None) -> T | None:
        """Remove ``request_id`` (only if it is still ``live``, when given); returns
        what was removed, or None."""
        with self._lock:
            cur = self._live.get(request_id)
            if cur is None or (live is not None and cur is not live):
                return None
            del self._live[request_id]
            return cur

    def close(self) -> dict[str, T]:
        """Refuse new requests; return (and drop) every live one by id, for the caller
        to end."""
        with self._lock:
            self.closed = True
            lives = dict(self._live)
            self._live.clear()
            return lives

    def values(self) -> list[T]:
        """A snapshot of the live requests."""
        with self._lock:
            return list(self._live.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)
