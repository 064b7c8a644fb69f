"""Large payloads on the worker (docs/api.md §12): fetching a work item sent by
reference (``payload_ref``), and publishing a result too large for one bus message as
``result_chunk_v1`` envelopes (``sie.core.chunks``)."""

from __future__ import annotations

import time
from typing import Any

from sie.core.chunks import ChunkError, split_result
from sie.core.errors import PayloadTooLarge, PayloadUnavailable, SieError
from sie.core.wire import WorkItem, WorkResult, packb
from sie.telemetry import Metrics
from sie.transport.base import Bus, data_limit
from sie.transport.payloads import PayloadStore

__all__ = ["ENVELOPE_OVERHEAD_BYTES", "error_result", "fetch_item", "publish_result"]

#: Bytes of a chunk envelope besides its data (ids, digest, counts).
ENVELOPE_OVERHEAD_BYTES = 1024

_IDENTITY = ("work_item_id", "request_id", "item_index", "reply_subject", "operation", "model_id")


async def fetch_item(
    store: PayloadStore, slim: WorkItem, metrics: Metrics
) -> tuple[WorkItem, float]:
    """The whole work item ``slim.payload_ref`` names, and the fetch time (ms).

    Raises:
        PayloadUnavailable: the payload is missing, unreadable, or is not this item
            (its identity fields differ from ``slim``'s).
    """
    t0 = time.monotonic()
    assert slim.payload_ref is not None
    try:
        data = await store.get(slim.payload_ref)
        item = WorkItem.from_bytes(data)
    except SieError as exc:
        metrics.payload_refs.labels("worker", "fetch_failed").inc()
        raise PayloadUnavailable(f"work item payload unavailable: {exc.message}") from exc
    if any(getattr(item, f) != getattr(slim, f) for f in _IDENTITY):
        metrics.payload_refs.labels("worker", "fetch_failed").inc()
        raise PayloadUnavailable("work item payload belongs to another item")
    metrics.payload_refs.labels("worker", "fetched").inc()
    item.payload_ref = None
    return item, (time.monotonic() - t0) * 1000.0


async def publish_result(bus: Bus, item: WorkItem, result: WorkResult) -> None:
    """Publish ``result`` on ``item.reply_subject``: in one message when it fits the
    bus's ``max_payload``, else as ``result_chunk_v1`` envelopes when the gateway
    accepts them; a result that cannot travel becomes a 413 ``PAYLOAD_TOO_LARGE``
    error result for that item.

    Raises:
        BusError: a publish failed (the caller NAKs the item for redelivery).
    """
    data = result.to_bytes()
    limit = data_limit(bus.max_payload)
    if len(data) <= limit:
        await bus.publish(item.reply_subject, data)
        return
    why = "the gateway does not accept chunked results"
    if item.accepts_result_chunks:
        try:
            envelopes = split_result(
                data,
                request_id=item.request_id,
                work_item_id=item.work_item_id,
                item_index=item.item_index,
                max_chunk_bytes=limit - ENVELOPE_OVERHEAD_BYTES,
            )
        except ChunkError as exc:
            why = str(exc)
        else:
            for envelope in envelopes:
                await bus.publish(item.reply_subject, packb(envelope))
            return
    error = PayloadTooLarge(
        f"the result of item {item.item_index} is {len(data)} bytes, more than one bus "
        f"message holds ({limit}), and {why}; send fewer or shorter inputs or output types"
    )
    failed = error_result(item, result.worker_id, error.code, error.message)
    await bus.publish(item.reply_subject, failed.to_bytes())


#: Error fields a failed result carries to the gateway (the MODEL_LOAD_FAILED body, §2).
DETAIL_FIELDS = ("error_class", "attempts", "permanent")


def error_result(
    item: WorkItem,
    worker_id: str | None,
    code: str,
    message: str,
    field: object = None,
    fields: dict[str, Any] | None = None,
) -> WorkResult:
    """A failed ``WorkResult`` for ``item`` (``field``: the request field an
    ``INVALID_INPUT`` names, when it is a string; ``fields``: the error's fields, of
    which ``DETAIL_FIELDS`` travel)."""
    details = {k: fields[k] for k in DETAIL_FIELDS if k in fields} if fields else None
    return WorkResult(
        error_details=details or None,
        error_field=field if isinstance(field, str) else None,
        work_item_id=item.work_item_id,
        request_id=item.request_id,
        item_index=item.item_index,
        success=False,
        error=message,
        error_code=code,
        worker_id=worker_id,
    )
