"""Token-budget dynamic batching across requests (docs/api.md §10).

Items from concurrent requests queue in one ``TokenBudgetBatcher`` per loaded
model. A batch is formed when the queued cost reaches ``max_batch_tokens``, or
``max_batch_requests`` items are queued, or ``max_wait_s`` has passed since the
oldest queued item, or no new item arrived for ``coalesce_s``. Items are taken
round-robin over their owners (the worker passes the request id): one item of each
request in turn, oldest request first, until the batch is full, and the next batch
starts with the request after the last one served; within a request, first come first
served. So a one-item request rides in the next batch however large the requests
queued before it, and no request starves. Items are grouped by a config
key (output types, instruction, is_query, options); one engine call runs per
group.

Engine calls run on the model's lanes: ``limiter.total_tokens`` threads (the model's
engine slots, see ``sie.engines.runtime.threads``), each of which forms a batch,
runs it, hands the results to the event loop and at once forms the next one from
what queued meanwhile (continuous batching). A lane never waits for the event loop
between two calls: on a loaded machine the loop's turnaround (results out, the next
batch in) left a core idle for a quarter of the time (docs/performance.md "Lanes
form their own batches"). Only one lane forms a batch at a time, and while every lane
is busy new items accumulate and leave together as soon as one ends. Cancelled
submitters' items are dropped before they reach the engine. Cancelling ``run`` waits
for the engine calls in flight (a thread cannot be interrupted), so the model may be
unloaded after it; items still queued then stay queued (their submitters are
cancelled with the model).

Each engine call runs in a ``worker.run_batch`` span (architecture §15.1; attributes
``sie.model``, ``sie.adapter``, ``sie.op``, ``sie.batch_id``, ``sie.batch_size``):
batch fan-in parents it on the first submitter's trace context and links the other
distinct ones (docs/observability.md "Traces").
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
from opentelemetry import context as otel_context
from opentelemetry import trace

from sie.telemetry import tracer, tracing_active

__all__ = ["BatchStats", "ItemFailure", "TokenBudgetBatcher", "plan_padding_chunks"]

log = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")


@dataclass(slots=True)
class _Pending(Generic[P, R]):
    payload: P
    cost: int
    key: Hashable
    enqueued_at: float
    #: resolved on the event loop once the item's engine call ended
    done: asyncio.Future[None]
    result: R | None = None
    error: BaseException | None = None
    cancelled: bool = False
    started_at: float = 0.0
    inference_s: float = 0.0
    batch_size: int = 0
    #: the submitter's trace context (the parent or a link of its batch's span)
    context: otel_context.Context | None = None


@dataclass(slots=True)
class ItemFailure:
    """A ``run_batch`` result that fails its own item only: its submitter gets
    ``error`` raised while the rest of the batch succeeds (an input the engine call
    refused, e.g. an over-long text with ``truncate: false``)."""

    error: BaseException


@dataclass(slots=True)
class BatchStats:
    """Timings for one submitted item. All values in seconds."""

    queue_s: float
    inference_s: float
    batch_size: int


class TokenBudgetBatcher(Generic[P, R]):
    """Coalesces submissions into batches for a synchronous ``run_batch``.

    Args:
        run_batch: ``(key, payloads) -> results`` (same length and order); runs on
            one of the model's lane threads; may raise (every item of the group gets
            the error), or fail single items by returning an ``ItemFailure`` in their
            place.
        max_batch_tokens: cost budget per batch (sum of item costs; >= 1 item always).
        max_batch_requests: item cap per batch.
        max_wait_s: longest time the oldest item waits for company (seconds).
        coalesce_s: dispatch early when no new item arrives for this long (seconds).
        limiter: the model's engine slots: its capacity is how many engine calls may
            run at once, one lane thread each (1 serialises them); default capacity 1.
            Read when ``run`` starts.
        on_batch: ``(items, cost, seconds)`` after each successful engine call, on the
            event loop.
    """

    def __init__(
        self,
        run_batch: Callable[[Hashable, Sequence[P]], Sequence[R]],
        *,
        max_batch_tokens: int,
        max_batch_requests: int = 64,
        max_wait_s: float = 0.010,
        coalesce_s: float = 0.002,
        limiter: anyio.CapacityLimiter | None = None,
        on_batch: Callable[[int, int, float], Any] | None = None,
        span_attributes: dict[str, str] | None = None,
    ) -> None:
        """``span_attributes``: on every ``worker.run_batch`` span (``sie.model``, ...)."""
        self._run_batch = run_batch
        self._span_attributes = span_attributes or {}
        self._batches = 0
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.max_wait_s = max_wait_s
        self.coalesce_s = coalesce_s
        self._limiter = limiter or anyio.CapacityLimiter(1)
        self._on_batch = on_batch
        #: owner -> its queued items (FIFO); owners in round-robin order. Guarded by
        #: ``_lock``: the event loop appends, the lanes take.
        self._owners: OrderedDict[Hashable, deque[_Pending[P, R]]] = OrderedDict()
        self._count = 0  # items queued (cancelled ones until they are skipped)
        self._cost = 0
        self._arrivals = 0  # items ever queued: a lane waiting for company sees news
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._forming = False  # a lane is forming a batch (the others wait their turn)
        self._closed = False
        self._waiting = 0  # lanes waiting on ``_wake``

    @property
    def queued(self) -> int:
        return self._count

    async def submit(
        self, payload: P, cost: int, key: Hashable = None, owner: Hashable = None
    ) -> tuple[R, BatchStats]:
        """Queue one item and wait for its result.

        ``owner``: whose item it is (the worker passes the request id). Batches are
        filled round-robin over owners, one item each in turn (module docstring), so a
        small request never waits behind a large one; None: the item is its own owner.

        Raises:
            TypeError: ``key`` or ``owner`` is not hashable.
            Whatever ``run_batch`` raised for this item's group.
        """
        hash(key)  # an unhashable key fails here, for this caller only (TypeError)
        who: Hashable = object() if owner is None else owner  # None: an owner of its own
        hash(who)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item: _Pending[P, R] = _Pending(payload, max(1, cost), key, time.monotonic(), done)
        item.context = otel_context.get_current()
        with self._lock:
            queue = self._owners.get(who)
            if queue is None:
                queue = self._owners[who] = deque()
            queue.append(item)
            self._count += 1
            self._cost += item.cost
            self._arrivals += 1
            if self._waiting:
                self._wake.notify_all()  # the forming lane, or an idle one
        try:
            await done
        except BaseException:
            item.cancelled = True
            raise
        if item.error is not None:
            raise item.error
        stats = BatchStats(item.started_at - item.enqueued_at, item.inference_s, item.batch_size)
        return item.result, stats  # type: ignore[return-value]

    def _pop(self, owner: Hashable) -> _Pending[P, R]:
        queue = self._owners[owner]
        item = queue.popleft()
        self._count -= 1
        self._cost -= item.cost
        if not queue:
            del self._owners[owner]
        return item

    def _oldest(self) -> float:
        return min(q[0].enqueued_at for q in self._owners.values())

    def _take(self) -> list[_Pending[P, R]]:
        """Round-robin over owners, one item each in turn, until the batch is full; the
        next batch starts with the owner after the last one served. Under ``_lock``."""
        batch: list[_Pending[P, R]] = []
        cost = 0
        while self._owners and len(batch) < self.max_batch_requests:
            took = False
            for owner in list(self._owners):
                if len(batch) >= self.max_batch_requests:
                    break
                queue = self._owners.get(owner)
                while queue and queue[0].cancelled:  # dropped before any work
                    self._pop(owner)
                    queue = self._owners.get(owner)
                if not queue:
                    continue
                if batch and cost + queue[0].cost > self.max_batch_tokens:
                    return batch
                item = self._pop(owner)
                batch.append(item)
                cost += item.cost
                took = True
                if owner in self._owners:  # served: to the back of the rotation
                    self._owners.move_to_end(owner)
            if not took:
                break
        return batch

    def _full(self) -> bool:
        return self._count >= self.max_batch_requests or self._cost >= self.max_batch_tokens

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the lanes and run until cancelled; on cancel, return once the engine
        calls in flight have finished."""
        loop = asyncio.get_running_loop()
        lanes = max(1, int(self._limiter.total_tokens))
        threads = anyio.CapacityLimiter(lanes)  # the lanes take none of anyio's default threads
        with self._lock:
            self._closed = False
        async with anyio.create_task_group() as tg:
            for _ in range(lanes):
                tg.start_soon(self._lane_task, loop, threads)
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                with self._lock:
                    self._closed = True
                    self._wake.notify_all()

    async def _lane_task(
        self, loop: asyncio.AbstractEventLoop, threads: anyio.CapacityLimiter
    ) -> None:
        # not abandoned on cancel: the task waits for the lane's engine call in flight
        await anyio.to_thread.run_sync(self._lane, loop, limiter=threads)

    def _wait(self, timeout: float | None = None) -> None:
        self._waiting += 1
        try:
            self._wake.wait(timeout)
        finally:
            self._waiting -= 1

    def _lane(self, loop: asyncio.AbstractEventLoop) -> None:
        """One lane: form a batch, run it, settle it on the loop, again; until closed."""
        while True:
            with self._lock:
                while not self._closed and (self._forming or not self._owners):
                    self._wait()
                if self._closed:
                    return
                self._forming = True
                try:
                    batch = self._form()
                finally:
                    self._forming = False
                    if self._owners and self._waiting:
                        self._wake.notify()  # the next lane may form from what is left
            if batch:
                self._execute(batch, loop)

    def _form(self) -> list[_Pending[P, R]]:
        """Wait for company (``max_wait_s`` after the oldest item, ``coalesce_s`` of
        quiet, or a full budget), then take the batch. Under ``_lock``."""
        deadline = self._oldest() + self.max_wait_s
        while not self._full() and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            seen = self._arrivals
            self._wait(min(self.coalesce_s, remaining))
            if self._arrivals == seen:  # quiet for coalesce_s
                break
        return self._take()

    def _execute(self, batch: list[_Pending[P, R]], loop: asyncio.AbstractEventLoop) -> None:
        """Run the batch's groups on this lane and hand each group's outcome to the loop."""
        groups: dict[Hashable, list[_Pending[P, R]]] = {}
        for p in batch:
            groups.setdefault(p.key, []).append(p)
        for key, items in groups.items():
            # Sort by cost inside the group: similar lengths pad less. Results map back by object.
            items.sort(key=lambda p: p.cost)
            start = time.monotonic()
            for p in items:
                p.started_at = start
            self._batches += 1
            outcome: Sequence[R] | BaseException
            try:
                outcome = self._call(key, items)
                if len(outcome) != len(items):
                    raise RuntimeError(
                        f"engine returned {len(outcome)} results for {len(items)} items"
                    )
            except Exception as exc:  # every item of the group gets it
                outcome = exc
            try:
                loop.call_soon_threadsafe(self._settle, items, outcome, time.monotonic() - start)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                log.debug("engine call ended after its event loop closed")

    def _call(self, key: Hashable, items: list[_Pending[P, R]]) -> Sequence[R]:
        payloads = [p.payload for p in items]
        contexts = [p.context for p in items]
        if not tracing_active() and not any(_has_span(c) for c in contexts):
            return self._run_batch(key, payloads)
        parent, links = fan_in(contexts)
        op = key[0] if isinstance(key, tuple) and key else key
        attributes: dict[str, str | int] = {
            **self._span_attributes,
            "sie.op": str(op),
            "sie.batch_id": self._batches,
            "sie.batch_size": len(items),
        }
        with tracer.start_as_current_span(
            "worker.run_batch", context=parent, links=links, attributes=attributes
        ):
            return self._run_batch(key, payloads)

    def _settle(
        self, items: list[_Pending[P, R]], outcome: Sequence[R] | BaseException, elapsed: float
    ) -> None:
        """On the event loop: give each submitter its result or error."""
        if isinstance(outcome, BaseException):
            for p in items:
                p.error = outcome
                if not p.done.done():
                    p.done.set_result(None)
            return
        if self._on_batch is not None:
            try:
                self._on_batch(len(items), sum(p.cost for p in items), elapsed)
            except Exception as exc:  # a metrics hook must not lose the batch's results
                log.warning("on_batch hook failed: %s", exc)
        for p, r in zip(items, outcome, strict=True):
            if isinstance(r, ItemFailure):
                p.error = r.error
            else:
                p.result = r
            p.inference_s = elapsed
            p.batch_size = len(items)
            if not p.done.done():
                p.done.set_result(None)


def _has_span(ctx: otel_context.Context | None) -> bool:
    return ctx is not None and trace.get_current_span(ctx).get_span_context().is_valid


def fan_in(
    contexts: Sequence[otel_context.Context | None],
) -> tuple[otel_context.Context, list[trace.Link]]:
    """A batch span's parent (the first context holding a valid span; else a new root)
    and links to the other distinct valid span contexts, in order."""
    parent: otel_context.Context | None = None
    seen: set[tuple[int, int]] = set()
    links: list[trace.Link] = []
    for ctx in contexts:
        if ctx is None:
            continue
        sc = trace.get_current_span(ctx).get_span_context()
        if not sc.is_valid or (sc.trace_id, sc.span_id) in seen:
            continue
        seen.add((sc.trace_id, sc.span_id))
        if parent is None:
            parent = ctx
        else:
            links.append(trace.Link(sc))
    return (parent if parent is not None else otel_context.Context()), links


def plan_padding_chunks(
    lengths: Sequence[int], *, call_overhead_tokens: int = 64, min_chunk: int = 4
) -> list[list[int]]:
    """Split one batch into forward passes that waste less padding.

    A padded forward pass costs about ``len(chunk) * max(length in chunk)`` tokens
    plus a fixed ``call_overhead_tokens``. Items are ordered by length and cut into
    contiguous chunks (each at least ``min_chunk`` items, unless the batch is
    smaller) minimising that total, by dynamic programming (O(n^2), n <= a batch).

    Args:
        lengths: token count of each item (>= 1).

    Returns:
        Chunks of indices into ``lengths``; together a permutation of ``range(n)``.
    """
    n = len(lengths)
    if n <= min_chunk:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: lengths[i])
    sorted_len = [lengths[i] for i in order]
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j sorted items
    cut = [0] * (n + 1)
    for j in range(min_chunk, n + 1):
        for i in range(0, j - min_chunk + 1):
            if best[i] == float("inf"):
                continue
            cost = best[i] + call_overhead_tokens + (j - i) * sorted_len[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    if best[n] == float("inf"):
        return [order]
    chunks: list[list[int]] = []
    j = n
    while j > 0:
        chunks.append(order[cut[j] : j])
        j = cut[j]
    return chunks[::-1]
