"""Publishing a request's work items on its lane's subject with overlapping JetStream
acks (architecture §8.2), keeping the pool's pending count exact."""

from __future__ import annotations

import anyio
import anyio.lowlevel
from opentelemetry import propagate, trace

from sie.core.errors import Backpressure, SieError
from sie.roles.gateway.lanes import Lane, LaneTelemetry
from sie.roles.gateway.pending import StreamPending
from sie.roles.gateway.work import YIELD_EVERY
from sie.telemetry import tracer, tracing_active
from sie.transport.base import Bus, NoStreamError, StreamFullError

__all__ = ["PUBLISH_CONCURRENCY", "PublishSpan", "WorkPublisher"]

#: Most JetStream publishes of one request awaiting their acks at once (§8.2).
PUBLISH_CONCURRENCY = 64


class WorkPublisher:
    """Publishes work items; a full stream records ``queue_full`` demand on the lane."""

    def __init__(self, bus: Bus, pending: StreamPending, lanes: LaneTelemetry) -> None:
        self.bus = bus
        self.pending = pending
        self.lanes = lanes

    async def publish_all(
        self,
        subject: str,
        lane: Lane,
        pool: str,
        work: list[tuple[str, bytes]],
        unsent: list[int],
        credits: anyio.Semaphore | None = None,
    ) -> None:
        """Publish a request's work items with overlapping JetStream acks (at most
        ``PUBLISH_CONCURRENCY`` in flight, architecture §8.2); the first failure
        cancels the rest and is raised. With ``credits``, each item waits for one (a
        request's publishing window: ``sie.roles.gateway.collect.window_credits``)."""
        if len(work) == 1:
            await self.publish_one(subject, lane, pool, *work[0], unsent)
            return
        items = iter(work)
        failures: list[SieError] = []

        async def publisher() -> None:
            # a few long-lived publishers instead of a task per item: thousands of
            # tasks per request would crowd the event loop's ready queue
            for sent, (work_item_id, data) in enumerate(items, 1):
                if credits is not None:
                    await credits.acquire()
                try:
                    await self.publish_one(subject, lane, pool, work_item_id, data, unsent)
                except SieError as exc:
                    failures.append(exc)
                    tg.cancel_scope.cancel()
                    return
                if sent % YIELD_EVERY == 0:
                    await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for _ in range(min(PUBLISH_CONCURRENCY, len(work))):
                tg.start_soon(publisher)
        if failures:
            raise failures[0]

    async def publish_one(
        self,
        subject: str,
        lane: Lane,
        pool: str,
        work_item_id: str,
        data: bytes,
        unsent: list[int],
    ) -> None:
        """One JetStream publish; ``work_item_id`` is the ``Nats-Msg-Id`` (dedupe). On
        success the item moves from the request's ``unsent`` to the pool's published
        count."""
        try:
            await self.bus.js_publish(subject, data, msg_id=work_item_id)
        except StreamFullError as exc:
            self.lanes.record_demand(lane, "queue_full")
            raise Backpressure(f"work queue for pool {pool!r} is full; retry later") from exc
        except NoStreamError:
            await self.pending.stream_gone(pool)
            await self.bus.js_publish(subject, data, msg_id=work_item_id)
        unsent[0] -= 1
        self.pending.published(pool)


class PublishSpan:
    """The ``gateway.publish`` span of one request (architecture §15.1; attributes
    ``sie.endpoint``, ``sie.model``, ``sie.pool``, ``sie.publish_ms``), a child of the
    request's current context; ``traceparent`` / ``tracestate`` are its W3C context for the work items, so
    ``worker.run_batch`` joins the trace. Without trace export it carries the caller's
    context through unchanged."""

    def __init__(self, endpoint: str, model: str, pool: str) -> None:
        self._open = True
        self.traceparent: str | None = None
        self.tracestate: str | None = None
        if not tracing_active() and not trace.get_current_span().get_span_context().is_valid:
            self.span: trace.Span = trace.INVALID_SPAN  # no trace to join or record
            return
        attributes = {"sie.endpoint": endpoint, "sie.model": model, "sie.pool": pool}
        self.span = tracer.start_span("gateway.publish", attributes=attributes)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self.span))
        self.traceparent = carrier.get("traceparent")
        self.tracestate = carrier.get("tracestate")

    def end(self, publish_ms: float | None = None) -> None:
        """End the span (once; later calls do nothing)."""
        if self._open:
            self._open = False
            if publish_ms is not None:
                self.span.set_attribute("sie.publish_ms", publish_ms)
            self.span.end()
