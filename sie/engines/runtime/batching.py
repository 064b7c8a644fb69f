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
group on a worker thread. Up to ``limiter.total_tokens`` batches run at once (the
model's engine slots, see ``sie.engines.runtime.threads``); a batch is formed only when a
slot is free, so while every slot is busy new items accumulate and leave together
as soon as one ends (continuous batching). Cancelled submitters' items are dropped
before they reach the engine. Cancelling ``run`` waits for the engine calls in
flight (a thread cannot be interrupted), so the model may be unloaded after it.

Each engine call runs in a ``worker.run_batch`` span (architecture §15.1; attributes
``sie.model``, ``sie.adapter``, ``sie.op``, ``sie.batch_id``, ``sie.batch_size``):
batch fan-in parents it on the first submitter's trace context and links the other
distinct ones (docs/observability.md "Traces").
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
from opentelemetry import context as otel_context
from opentelemetry import trace

from sie.telemetry import tracer

__all__ = ["BatchStats", "ItemFailure", "TokenBudgetBatcher", "plan_padding_chunks"]

P = TypeVar("P")
R = TypeVar("R")


@dataclass(slots=True)
class _Pending(Generic[P, R]):
    payload: P
    cost: int
    key: Hashable
    enqueued_at: float
    done: anyio.Event = field(default_factory=anyio.Event)
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
            a worker thread; may raise (every item of the group gets the error), or
            fail single items by returning an ``ItemFailure`` in their place.
        max_batch_tokens: cost budget per batch (sum of item costs; >= 1 item always).
        max_batch_requests: item cap per batch.
        max_wait_s: longest time the oldest item waits for company (seconds).
        coalesce_s: dispatch early when no new item arrives for this long (seconds).
        limiter: the model's engine slots: its capacity is how many engine calls may
            run at once (1 serialises them); default capacity 1.
        on_batch: ``(items, cost, seconds)`` after each successful engine call.
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
        #: owner -> its queued items (FIFO); owners in round-robin order
        self._owners: OrderedDict[Hashable, deque[_Pending[P, R]]] = OrderedDict()
        self._count = 0  # items queued (cancelled ones until they are skipped)
        self._cost = 0
        self._arrived = anyio.Event()

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
        item: _Pending[P, R] = _Pending(payload, max(1, cost), key, time.monotonic())
        item.context = otel_context.get_current()
        who: Hashable = object() if owner is None else owner  # None: an owner of its own
        hash(who)
        queue = self._owners.get(who)
        if queue is None:
            queue = self._owners[who] = deque()
        queue.append(item)
        self._count += 1
        self._cost += item.cost
        self._arrived.set()
        try:
            await item.done.wait()
        except BaseException:
            item.cancelled = True
            raise
        if item.error is not None:
            raise item.error
        stats = BatchStats(item.started_at - item.enqueued_at, item.inference_s, item.batch_size)
        return item.result, stats  # type: ignore[return-value]

    async def _wait_arrival(self, timeout_s: float) -> bool:
        self._arrived = anyio.Event()
        with anyio.move_on_after(timeout_s):
            await self._arrived.wait()
            return True
        return False

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
        next batch starts with the owner after the last one served."""
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
        """The batching loop; run it in a task group until cancelled. On cancel it
        returns once the engine calls in flight have finished."""
        slots = anyio.Semaphore(max(1, int(self._limiter.total_tokens)))
        async with anyio.create_task_group() as calls:
            task_status.started()
            while True:
                while not self._owners:
                    self._arrived = anyio.Event()
                    await self._arrived.wait()
                await slots.acquire()  # form the batch only once an engine slot is free
                try:
                    batch = await self._form()
                except BaseException:
                    slots.release()
                    raise
                if not batch:
                    slots.release()
                    continue
                calls.start_soon(self._execute_then_release, batch, slots)

    async def _form(self) -> list[_Pending[P, R]]:
        """Wait for company (``max_wait_s`` after the oldest item, ``coalesce_s`` of
        quiet, or a full budget), then take the batch."""
        if not self._owners:
            return []
        deadline = self._oldest() + self.max_wait_s
        while not self._full():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self._wait_arrival(min(self.coalesce_s, remaining)):
                break
        return self._take()

    async def _execute_then_release(
        self, batch: list[_Pending[P, R]], slots: anyio.Semaphore
    ) -> None:
        try:
            await self._execute(batch)
        except Exception as exc:  # never let one batch stop the loop
            for p in batch:
                if not p.done.is_set():
                    p.error = exc
                    p.done.set()
        finally:
            slots.release()

    async def _execute(self, batch: list[_Pending[P, R]]) -> None:
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
            parent, links = fan_in([p.context for p in items])
            op = key[0] if isinstance(key, tuple) and key else key
            attributes: dict[str, str | int] = {
                **self._span_attributes,
                "sie.op": str(op),
                "sie.batch_id": self._batches,
                "sie.batch_size": len(items),
            }
            try:
                with tracer.start_as_current_span(
                    "worker.run_batch", context=parent, links=links, attributes=attributes
                ):
                    results = await anyio.to_thread.run_sync(
                        self._run_batch, key, [p.payload for p in items], limiter=self._limiter
                    )
                if len(results) != len(items):
                    raise RuntimeError(
                        f"engine returned {len(results)} results for {len(items)} items"
                    )
            except Exception as exc:
                for p in items:
                    p.error = exc
                    p.done.set()
                continue
            elapsed = time.monotonic() - start
            if self._on_batch is not None:
                self._on_batch(len(items), sum(p.cost for p in items), elapsed)
            for p, r in zip(items, results, strict=True):
                if isinstance(r, ItemFailure):
                    p.error = r.error
                else:
                    p.result = r
                p.inference_s = elapsed
                p.batch_size = len(items)
                p.done.set()


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
