"""TokenBudgetBatcher (reference §4.6) with a recording fake run_batch."""

import threading
import time
from collections.abc import Hashable, Sequence

import anyio
import pytest

from sie.engines.runtime.batching import ItemFailure, TokenBudgetBatcher

pytestmark = pytest.mark.anyio


class Recorder:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[Hashable, list[str]]] = []
        self.delay_s = delay_s
        self.threads: set[int] = set()
        self.started = threading.Event()  # set when the first engine call begins

    def __call__(self, key: Hashable, payloads: Sequence[str]) -> list[str]:
        self.threads.add(threading.get_ident())
        self.calls.append((key, list(payloads)))
        self.started.set()
        if self.delay_s:
            time.sleep(self.delay_s)
        return [p.upper() for p in payloads]


async def run_with(batcher: TokenBudgetBatcher, jobs: list[tuple[str, int, Hashable]]) -> list[str]:
    results: list[str] = [""] * len(jobs)
    async with anyio.create_task_group() as tg:
        await tg.start(batcher.run)

        async def one(i: int, text: str, cost: int, key: Hashable) -> None:
            results[i], _ = await batcher.submit(text, cost, key)

        async with anyio.create_task_group() as inner:
            for i, (text, cost, key) in enumerate(jobs):
                inner.start_soon(one, i, text, cost, key)
        tg.cancel_scope.cancel()
    return results


async def test_concurrent_items_coalesce_and_results_map_back() -> None:
    rec = Recorder()
    b = TokenBudgetBatcher(rec, max_batch_tokens=1000, max_wait_s=0.05)
    jobs = [(f"t{i}", 3, None) for i in range(20)]
    assert await run_with(b, jobs) == [f"T{i}" for i in range(20)]
    assert len(rec.calls) < 5  # cross-request batching happened
    assert sum(len(c[1]) for c in rec.calls) == 20


async def test_token_budget_caps_each_batch() -> None:
    rec = Recorder(delay_s=0.01)
    b = TokenBudgetBatcher(rec, max_batch_tokens=10, max_wait_s=0.05)
    await run_with(b, [(f"t{i}", 4, None) for i in range(9)])
    assert all(len(c[1]) <= 2 for c in rec.calls)  # 2 * 4 <= 10 < 3 * 4


async def test_oversized_item_runs_alone() -> None:
    rec = Recorder()
    b = TokenBudgetBatcher(rec, max_batch_tokens=5, max_wait_s=0.01)
    assert await run_with(b, [("big", 100, None)]) == ["BIG"]


async def test_request_cap_and_grouping_by_key() -> None:
    rec = Recorder()
    b = TokenBudgetBatcher(rec, max_batch_tokens=10_000, max_batch_requests=4, max_wait_s=0.05)
    jobs = [(f"q{i}", 1, "query") for i in range(6)] + [(f"d{i}", 1, "doc") for i in range(6)]
    out = await run_with(b, jobs)
    assert out == [j[0].upper() for j in jobs]
    for key, payloads in rec.calls:
        assert len(payloads) <= 4
        assert all(p.startswith(key[0]) for p in payloads)


async def test_engine_error_reaches_every_item_of_the_group() -> None:
    def boom(key: Hashable, payloads: Sequence[str]) -> list[str]:
        raise RuntimeError("kaput")

    b = TokenBudgetBatcher(boom, max_batch_tokens=100)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        with pytest.raises(RuntimeError, match="kaput"):
            await b.submit("x", 1)
        tg.cancel_scope.cancel()


async def test_an_item_failure_fails_only_its_own_item() -> None:
    def picky(key: Hashable, payloads: Sequence[str]) -> list[object]:
        return [ItemFailure(ValueError(p)) if p.startswith("bad") else p.upper() for p in payloads]

    b = TokenBudgetBatcher(picky, max_batch_tokens=100, max_wait_s=0.05)
    outcomes: dict[str, object] = {}
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)

        async def one(text: str) -> None:
            try:
                outcomes[text], _ = await b.submit(text, 1)
            except ValueError as exc:
                outcomes[text] = exc

        async with anyio.create_task_group() as inner:
            for text in ("a", "bad1", "b", "bad2"):
                inner.start_soon(one, text)
        tg.cancel_scope.cancel()
    assert outcomes["a"] == "A" and outcomes["b"] == "B"
    assert isinstance(outcomes["bad1"], ValueError) and str(outcomes["bad1"]) == "bad1"
    assert isinstance(outcomes["bad2"], ValueError) and str(outcomes["bad2"]) == "bad2"


async def test_cancelled_items_are_dropped_before_the_engine() -> None:
    rec = Recorder(delay_s=0.05)
    b = TokenBudgetBatcher(rec, max_batch_tokens=100, max_wait_s=0.001, coalesce_s=0.0005)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        first = anyio.Event()

        async def busy() -> None:
            await b.submit("first", 1)
            first.set()

        tg.start_soon(busy)
        await anyio.to_thread.run_sync(rec.started.wait, 5.0)  # "first" is on the thread now
        with anyio.move_on_after(0.001):
            await b.submit("abandoned", 1)
        await first.wait()
        out, _ = await b.submit("after", 1)
        assert out == "AFTER"
        tg.cancel_scope.cancel()
    flat = [p for _, ps in rec.calls for p in ps]
    assert "abandoned" not in flat


def test_padding_plan_is_a_permutation_and_saves_padding() -> None:
    import random

    from sie.engines.runtime.batching import plan_padding_chunks

    rng = random.Random(7)
    for n in (1, 3, 9, 32, 64):
        lengths = [rng.randint(5, 300) for _ in range(n)]
        chunks = plan_padding_chunks(lengths)
        assert sorted(i for c in chunks for i in c) == list(range(n))
        padded = sum(len(c) * max(lengths[i] for i in c) for c in chunks)
        assert padded <= n * max(lengths)
    # uniform lengths: one pass; two length clusters: two passes
    assert len(plan_padding_chunks([20] * 32)) == 1
    chunks = plan_padding_chunks([5] * 20 + [200] * 12)
    assert sorted(len(c) for c in chunks) == [12, 20]


class Overlap:
    """run_batch that sleeps and records how many calls overlapped at most."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.active = 0
        self.most = 0
        self.finished = 0
        self.two_running = threading.Event()

    def __call__(self, key: Hashable, payloads: Sequence[str]) -> list[str]:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            if self.active >= 2:
                self.two_running.set()
        time.sleep(self.delay_s)
        with self.lock:
            self.active -= 1
            self.finished += 1
        return [p.upper() for p in payloads]


@pytest.mark.parametrize("slots", [1, 2])
async def test_engine_slots_bound_concurrent_engine_calls(slots: int) -> None:
    """sie.engines.runtime.threads: up to ``limiter.total_tokens`` engine calls at once."""
    engine = Overlap(0.15)
    b = TokenBudgetBatcher(
        engine,
        max_batch_tokens=100,
        max_batch_requests=2,
        max_wait_s=0.001,
        limiter=anyio.CapacityLimiter(slots),
    )
    t0 = time.monotonic()
    out = await run_with(b, [(f"t{i}", 1, None) for i in range(6)])
    elapsed = time.monotonic() - t0
    assert out == [f"T{i}" for i in range(6)]
    assert engine.most == slots
    if slots == 1:  # 3 calls of 0.15 s, one after another
        assert elapsed >= 0.44


async def test_a_batch_forms_only_when_a_slot_is_free() -> None:
    """While every slot is busy, arrivals wait and then leave together in one call."""
    rec = Recorder(delay_s=0.2)
    b = TokenBudgetBatcher(rec, max_batch_tokens=100, max_wait_s=0.001, coalesce_s=0.0005)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        async with anyio.create_task_group() as inner:
            inner.start_soon(b.submit, "first", 1)
            await anyio.to_thread.run_sync(rec.started.wait, 5.0)  # "first" is on the engine now
            for i in range(5):
                inner.start_soon(b.submit, f"later{i}", 1)
        tg.cancel_scope.cancel()
    assert [len(ps) for _, ps in rec.calls] == [1, 5]


async def test_cancelling_the_loop_waits_for_engine_calls_in_flight() -> None:
    engine = Overlap(0.3)
    b = TokenBudgetBatcher(
        engine, max_batch_tokens=100, max_batch_requests=1, limiter=anyio.CapacityLimiter(2)
    )
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        tg.start_soon(b.submit, "a", 1)
        tg.start_soon(b.submit, "b", 1)
        # both calls are running on threads
        assert await anyio.to_thread.run_sync(engine.two_running.wait, 2)
        tg.cancel_scope.cancel()
    assert engine.finished == 2 and engine.active == 0  # run returned after both ended


async def test_round_robin_over_owners_a_small_request_rides_the_next_batch() -> None:
    """Batches are filled one item per owner in turn: a one-item request queued behind
    a 1,000-item one leaves in the next batch, not after the whole large request."""
    rec = Recorder(delay_s=0.01)
    b = TokenBudgetBatcher(rec, max_batch_tokens=10_000, max_batch_requests=8, max_wait_s=0.001)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        async with anyio.create_task_group() as inner:
            for i in range(1000):
                inner.start_soon(b.submit, f"big{i}", 1, None, "big")
            await until_queued(b, 500)  # the big request is queued (a batch may be out)
            inner.start_soon(b.submit, "small", 1, None, "small")
        tg.cancel_scope.cancel()
    batches = [ps for _, ps in rec.calls]
    at = next(i for i, ps in enumerate(batches) if "SMALL" in [p.upper() for p in ps])
    assert at <= 2, f"the small request left in batch {at} of {len(batches)}"
    # within one owner, first come first served
    bigs = [p for ps in batches for p in ps if p.startswith("big")]
    assert bigs == [f"big{i}" for i in range(1000)]
    assert all(len(ps) <= 8 for ps in batches)


async def test_owners_share_batches_evenly() -> None:
    rec = Recorder(delay_s=0.005)
    b = TokenBudgetBatcher(rec, max_batch_tokens=10_000, max_batch_requests=6, max_wait_s=0.001)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        async with anyio.create_task_group() as inner:
            for owner in ("a", "b", "c"):
                for i in range(30):
                    inner.start_soon(b.submit, f"{owner}{i}", 1, None, owner)
        tg.cancel_scope.cancel()
    # once all three are queued, every full batch holds two items of each
    full = [ps for _, ps in rec.calls if len(ps) == 6]
    assert full and all(
        sorted(p[0] for p in ps) == ["a", "a", "b", "b", "c", "c"] for ps in full[1:-1]
    )


async def until_queued(b: TokenBudgetBatcher, n: int) -> None:
    with anyio.fail_after(5):
        while b.queued < n:  # noqa: ASYNC110 - polling the batcher's own count
            await anyio.sleep(0.001)
