"""The gateway's inbox: every worker result for this gateway arrives on
``_INBOX.{router_id}.{request_id}`` and goes to its request's ``Collector``
(architecture §16.2 step 4), whole or as ``result_chunk_v1`` pieces (docs/api.md §12).

Late results (the request finished or was abandoned) are dropped before decoding. A
chunked result is put back together by the request's ``Reassembly`` under the
process-wide ``ChunkBudget``; a transfer that does not fit together fails its request
at once with 503 ``TRANSPORT_FAILURE`` (the reason goes to the log and to
``sie_gateway_queue_result_chunk_rejections_total``, never to the client).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sie.core.chunks import ChunkBudget, ChunkError, Reassembly, is_chunk
from sie.core.errors import PayloadTooLarge, SieError, TransportFailure
from sie.core.wire import WorkResult, unpackb
from sie.roles.gateway.collect import Collector
from sie.telemetry import Metrics

__all__ = ["ResultInbox"]

log = logging.getLogger(__name__)

#: What the client reads when a chunked result fails: nothing of what was sent.
TRANSPORT_FAILURE_MESSAGE = "a worker result could not be reassembled; the request was abandoned"


class ResultInbox:
    """Requests waiting for results (``pending``: request id → ``Collector``).

    ``saw(worker_id)`` is told of every worker a result came from (proof of life).
    """

    def __init__(
        self,
        metrics: Metrics,
        saw: Callable[[str], None],
        budget: ChunkBudget | None = None,
        max_result_bytes: int | None = None,
    ) -> None:
        """``max_result_bytes``: encoded results one request may collect (None: no
        bound); past it the request ends with 413 ``PAYLOAD_TOO_LARGE``."""
        self.max_result_bytes = max_result_bytes
        self.metrics = metrics
        self.saw = saw
        self.budget = budget if budget is not None else ChunkBudget()
        self.pending: dict[str, Collector] = {}
        self.late_results = 0

    def deliver(self, request_id: str, data: bytes) -> None:
        """One inbox message for ``request_id`` (from its subject)."""
        col = self.pending.get(request_id)
        if col is None or col.failure is not None:
            self.late_results += 1
            return
        try:
            message = unpackb(data)
        except SieError as exc:
            log.warning("dropping an undecodable result for %s: %s", request_id, exc.message)
            return
        if is_chunk(message):
            self._chunk(request_id, col, message)
            return
        try:
            result = WorkResult.from_map(message)
        except SieError as exc:
            log.warning("dropping an undecodable result for %s: %s", request_id, exc.message)
            return
        if result.request_id == request_id:
            self.accept(col, result)

    def _chunk(self, request_id: str, col: Collector, envelope: dict[str, Any]) -> None:
        if col.chunks is None:
            col.chunks = Reassembly(request_id, col.total, self.budget)
        try:
            whole = col.chunks.add(envelope)
            if whole is None:
                return
            try:
                result = WorkResult.from_bytes(whole)
            except SieError as exc:
                raise ChunkError("decode", exc.message) from exc
            if result.request_id != request_id or result.item_index != envelope["item_index"]:
                raise ChunkError("identity", "the reassembled result names another item")
        except ChunkError as exc:
            self.fail(request_id, col, exc.reason, str(exc))
            return
        finally:
            self.metrics.chunk_reserved_bytes.set(self.budget.reserved_bytes)
        self.accept(col, result)

    def fail(self, request_id: str, col: Collector, reason: str, detail: str) -> None:
        """End ``col`` with 503 ``TRANSPORT_FAILURE`` (its waiter raises it)."""
        log.warning("request %s: invalid chunked result (%s): %s", request_id, reason, detail)
        self.metrics.chunk_rejections.labels(reason).inc()
        _end(col, TransportFailure(TRANSPORT_FAILURE_MESSAGE, request_id=request_id))

    def accept(self, col: Collector, result: WorkResult) -> None:
        """Store ``result`` in its slot (the first answer for an item wins)."""
        if not 0 <= result.item_index < col.total:
            return  # stale or foreign: drop (architecture §16.2 step 4)
        if result.worker_id is not None:  # a result is proof of life (docs/security.md)
            self.saw(result.worker_id)
        if result.direct_origin and result.item_index in col.fallback:
            return  # republished to the pool: only that copy may answer (§8)
        if col.results[result.item_index] is None:
            col.result_bytes += len(result.result_msgpack or b"")
            if self.max_result_bytes is not None and col.result_bytes > self.max_result_bytes:
                self._too_big(col)
                return
            col.results[result.item_index] = result
            col.remaining -= 1
            if col.credits is not None:
                col.credits.release()  # room for one more of its items in the stream
            if col.remaining == 0:
                col.done.set()

    def _too_big(self, col: Collector) -> None:
        """End ``col``: its results outgrew ``max_result_bytes`` (its work is cancelled)."""
        too_big = PayloadTooLarge(
            f"the results of this request exceed {self.max_result_bytes} bytes "
            f"(SIE_MAX_RESPONSE_BYTES) after {col.total - col.remaining} of {col.total} "
            "items; send fewer items or fewer output types per request"
        )
        _end(col, too_big)

    def close(self, request_id: str) -> None:
        """The request ended: forget it and release its chunk reservations."""
        col = self.pending.pop(request_id, None)
        if col is not None and col.chunks is not None:
            col.chunks.close()
            self.metrics.chunk_reserved_bytes.set(self.budget.reserved_bytes)


def _end(col: Collector, failure: SieError) -> None:
    """End ``col`` with ``failure``: its waiter raises it, a windowed publisher stops."""
    col.failure = failure
    col.done.set()
    if col.credits is not None:
        for _ in range(col.total):
            col.credits.release()
