"""Requests their gateway abandoned (``work_cancel.{router_id}.{request_id}``,
architecture §8): a bounded set of tombstones, so items still queued are dropped
before any work, and the cancel scopes of the items running, so they stop."""

from __future__ import annotations

from collections import OrderedDict

import anyio

__all__ = ["CANCEL_TOMBSTONES", "Cancellations"]

#: Cancelled request ids remembered (oldest forgotten first).
CANCEL_TOMBSTONES = 10_000


class Cancellations:
    """Tombstones of cancelled requests and the live work of each request."""

    def __init__(self, tombstones: int = CANCEL_TOMBSTONES) -> None:
        self.tombstones = tombstones
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        self._active: dict[str, set[anyio.CancelScope]] = {}

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._cancelled

    def cancel(self, request_id: str) -> None:
        """Tombstone ``request_id`` and cancel its running work."""
        self._cancelled[request_id] = None
        while len(self._cancelled) > self.tombstones:
            self._cancelled.popitem(last=False)
        for scope in self._active.get(request_id, ()):
            scope.cancel()

    def open(self, request_id: str) -> anyio.CancelScope:
        """A scope that ``cancel(request_id)`` cancels; ``close`` it when done."""
        scope = anyio.CancelScope()
        self._active.setdefault(request_id, set()).add(scope)
        return scope

    def close(self, request_id: str, scope: anyio.CancelScope) -> None:
        scopes = self._active.get(request_id)
        if scopes is not None:
            scopes.discard(scope)
            if not scopes:
                del self._active[request_id]
