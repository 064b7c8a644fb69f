"""The engine-state admission gate against a fake engine-metrics server
(admission-gate.md; issue 6 acceptance item 2).

The fake engine is a Starlette app served by hypercorn on a loopback port; each test
sets the exposition text (or an HTTP status) the observer reads. Intervals are short
(poll 0.1 s) so the suite runs in seconds; in-process (heartbeat-fed) observers are
driven with ``update`` where exact control of the readings matters.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial

import anyio
import pytest
from hypercorn.asyncio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from sie.core.admission import (
    REASON_HEADROOM,
    REASON_UNGATED,
    REASON_UNKNOWN,
    AdmissionConfig,
    Decision,
    EngineState,
)
from sie.core.errors import AdmissionRejected
from sie.engines.runtime.observer import EngineObserver
from sie.http.errors import error_headers
from sie.roles.gateway.admission import AdmissionGate
from sie.telemetry import Metrics
from tests.loopback import loopback_config

pytestmark = pytest.mark.anyio

MODEL = "llama"
#: poll interval, seconds (the per-read timeout is 0.8 of it: 80 ms on a busy CI box)
POLL = 0.1
BASE = AdmissionConfig(
    kv_threshold=0.90,
    max_inflight=4,
    max_park_s=5.0,
    poll_interval_s=POLL,
    stale_after_failures=3,
    keepalive_s=15.0,
    observe_models=frozenset({MODEL}),
)
#: for heartbeat-fed (pushed) observers driven by ``update``: never stale by silence here
PUSHED = replace(BASE, stale_after_failures=1000)


def exposition(running: int = 0, waiting: int = 0, kv: float = 0.1) -> str:
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} {waiting}\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} {kv}\n'
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="9527"} 1.0\n'
    )


@dataclass
class FakeEngine:
    """What the fake ``/metrics`` answers; tests mutate it."""

    text: str = field(default_factory=exposition)
    status: int = 200
    scrapes: int = 0
    url: str = ""

    def set(self, **kw: float) -> None:
        self.text = exposition(**kw)  # type: ignore[arg-type]
        self.status = 200


@asynccontextmanager
async def fake_engine() -> AsyncIterator[FakeEngine]:
    engine = FakeEngine()

    async def metrics(request: Request) -> PlainTextResponse:
        engine.scrapes += 1
        return PlainTextResponse(engine.text, status_code=engine.status)

    app = Starlette(routes=[Route("/metrics", metrics)])
    stop = anyio.Event()
    with loopback_config(0.1) as (config, base_url):
        engine.url = f"{base_url}/metrics"
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(serve, app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
            yield engine
            stop.set()


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


@asynccontextmanager
async def running_gate(
    cfg: AdmissionConfig, url: str | None, *, metrics: Metrics | None = None, read: bool = True
) -> AsyncIterator[AdmissionGate]:
    """A gate polling ``url``; with ``read`` it yields once a good reading is in (the
    first connection to a fresh server may outlast one short per-read timeout)."""
    gate = AdmissionGate(cfg, metrics or Metrics())
    if url is not None:
        gate.observe(MODEL, url)
    async with anyio.create_task_group() as tg:
        await tg.start(gate.run)
        if read and url is not None:
            await until(lambda: gate.observer(MODEL).current() is not None)
        yield gate
        tg.cancel_scope.cancel()


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    """A series' value; 0 for a labelled series never touched."""
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def until(pred: Callable[[], object], timeout_s: float = 5.0) -> None:
    with anyio.fail_after(timeout_s):
        while not pred():  # noqa: ASYNC110 - polling a test predicate
            await anyio.sleep(0.005)


async def next_reading(obs: EngineObserver, after: int | None = None) -> None:
    """Wait for a reading newer than version ``after`` (default: now)."""
    v = obs.version if after is None else after
    await until(lambda: obs.version > v and obs.current() is not None)


@dataclass
class Outcome:
    decision: Decision | None = None
    error: BaseException | None = None
    at: float = 0.0


def start_admit(
    tg: anyio.abc.TaskGroup,
    gate: AdmissionGate,
    model: str = MODEL,
    on_keepalive: Callable[[], Awaitable[None]] | None = None,
    done: list[int] | None = None,
    tag: int = 0,
) -> Outcome:
    out = Outcome()

    async def go() -> None:
        try:
            out.decision = await gate.admit(model, on_keepalive=on_keepalive)
            if done is not None:
                done.append(tag)
        except Exception as exc:
            out.error = exc
        out.at = time.monotonic()

    tg.start_soon(go)
    return out


# -- admit ---------------------------------------------------------------------------


async def test_admit_when_the_engine_has_room() -> None:
    metrics = Metrics()
    async with fake_engine() as engine:
        engine.set(running=1, waiting=1, kv=0.25)
        async with running_gate(BASE, engine.url, metrics=metrics) as gate:
            obs = gate.observer(MODEL)
            d = await gate.admit(MODEL)
            assert d.admit and d.reason == REASON_HEADROOM and d.max_inflight == 4
            # the gate's own reading is exported
            assert sample(metrics, "sie_vllm_requests_running", model=MODEL) == 1
            assert sample(metrics, "sie_vllm_kv_cache_usage_ratio", model=MODEL) == 0.25
            assert sample(metrics, "sie_observer_degraded", model=MODEL) == 0
            assert obs.current().state.kv_capacity_tokens == 9527 * 16  # type: ignore[union-attr]
            assert gate.parked(MODEL) == 0
            assert sample(metrics, "sie_admission_parked_total", model=MODEL) == 0


async def test_park_then_admit_when_the_reading_drops() -> None:
    metrics = Metrics()
    async with fake_engine() as engine:
        engine.set(running=1, kv=0.95)
        async with (
            running_gate(BASE, engine.url, metrics=metrics) as gate,
            anyio.create_task_group() as tg,
        ):
            out = start_admit(tg, gate)
            await until(lambda: gate.parked(MODEL) == 1)
            obs = gate.observer(MODEL)
            await next_reading(obs)
            await next_reading(obs)
            assert out.decision is None and gate.parked(MODEL) == 1  # still kv-bound
            engine.set(running=1, kv=0.5)
            t0 = time.monotonic()
            await until(lambda: out.decision is not None)
            assert out.decision == Decision(True, REASON_HEADROOM, 4)
            assert time.monotonic() - t0 < 1.0  # within a few polls
            assert gate.parked(MODEL) == 0
            assert sample(metrics, "sie_admission_parked_total", model=MODEL) == 1


async def test_park_timeout_is_a_503_with_retry_after_5() -> None:
    metrics = Metrics()
    cfg = replace(BASE, max_park_s=0.3)
    async with fake_engine() as engine:
        engine.set(running=0, kv=0.97)
        async with running_gate(cfg, engine.url, metrics=metrics) as gate:
            t0 = time.monotonic()
            with pytest.raises(AdmissionRejected) as info:
                await gate.admit(MODEL)
            waited = time.monotonic() - t0
    exc = info.value
    assert 0.3 <= waited < 1.5
    assert (exc.status, exc.code, exc.retry_after_s) == (503, "ENGINE_SATURATED", 5)
    assert error_headers(exc)["Retry-After"] == "5"
    assert exc.fields["reason"] == "kv_cache" and exc.fields["model"] == MODEL
    assert sample(metrics, "sie_admission_rejected_total", model=MODEL, reason="kv_cache") == 1
    assert gate.parked(MODEL) == 0


async def test_inflight_park_timeout_reason() -> None:
    metrics = Metrics()
    gate = AdmissionGate(replace(PUSHED, max_park_s=0.1), metrics)
    gate.update(MODEL, EngineState(running=4, waiting=0, kv_usage=0.1))
    with pytest.raises(AdmissionRejected) as info:
        await gate.admit(MODEL)
    assert info.value.fields["reason"] == "inflight"
    assert sample(metrics, "sie_admission_rejected_total", model=MODEL, reason="inflight") == 1


# -- keep-alive ----------------------------------------------------------------------


async def test_keepalive_every_interval_while_parked_then_timeout() -> None:
    cfg = replace(BASE, keepalive_s=0.1, max_park_s=0.55)
    calls: list[float] = []

    async def keepalive() -> None:  # a streaming handler writes ": keep-alive\n\n"
        calls.append(time.monotonic())

    async with fake_engine() as engine:
        engine.set(running=0, kv=0.99)
        async with running_gate(cfg, engine.url) as gate:
            t0 = time.monotonic()
            with pytest.raises(AdmissionRejected):
                await gate.admit(MODEL, on_keepalive=keepalive)
            end = time.monotonic()
    # ideally 5 calls (0.1 .. 0.5 s); a loaded CI box may stall the loop and skip one,
    # but a late callback never causes a burst and none comes after the deadline
    assert 3 <= len(calls) <= 5, calls
    # on a fixed 0.1 s schedule from the park: never early, and on time (median lateness)
    late = [c - t0 - 0.1 * (i + 1) for i, c in enumerate(calls)]
    assert all(x >= 0 for x in late), late
    assert sorted(late)[len(late) // 2] < 0.08, late
    assert all(c - t0 < 0.56 for c in calls) and 0.55 <= end - t0 < 1.5


async def test_no_keepalive_when_admitted_at_once_or_before_the_interval() -> None:
    calls: list[float] = []

    async def keepalive() -> None:
        calls.append(time.monotonic())

    gate = AdmissionGate(replace(PUSHED, keepalive_s=0.2), Metrics())
    gate.update(MODEL, EngineState(running=0, waiting=0, kv_usage=0.1))
    await gate.admit(MODEL, on_keepalive=keepalive)
    gate.update(MODEL, EngineState(running=4, waiting=0, kv_usage=0.1))
    async with anyio.create_task_group() as tg:
        out = start_admit(tg, gate, on_keepalive=keepalive)
        await until(lambda: gate.parked(MODEL) == 1)
        gate.update(MODEL, EngineState(running=0, waiting=0, kv_usage=0.1))
    assert out.decision is not None and out.decision.admit and calls == []


async def test_keepalive_failure_leaves_the_queue() -> None:
    class ClientGone(Exception):
        pass

    async def keepalive() -> None:
        raise ClientGone

    gate = AdmissionGate(replace(PUSHED, keepalive_s=0.05), Metrics())
    gate.update(MODEL, EngineState(running=4, waiting=0, kv_usage=0.1))
    with pytest.raises(ClientGone):
        await gate.admit(MODEL, on_keepalive=keepalive)
    assert gate.parked(MODEL) == 0


# -- fail open -----------------------------------------------------------------------


async def test_stale_after_three_failed_polls_fails_open_and_counts_once() -> None:
    metrics = Metrics()
    async with fake_engine() as engine:
        engine.set(running=4, kv=0.95)
        async with (
            running_gate(BASE, engine.url, metrics=metrics) as gate,
            anyio.create_task_group() as tg,
        ):
            obs = gate.observer(MODEL)
            out = start_admit(tg, gate)
            await until(lambda: gate.parked(MODEL) == 1)
            engine.status = 500
            await until(lambda: out.decision is not None)
            assert out.decision == Decision(True, REASON_UNKNOWN, 4)
            assert obs.failures >= 3 and not obs.healthy and obs.current() is None
            # more failures do not count the transition again
            n = engine.scrapes
            await until(lambda: engine.scrapes >= n + 3)
            assert sample(metrics, "sie_engine_state_stale_total", model=MODEL) == 1
            assert (await gate.admit(MODEL)).reason == REASON_UNKNOWN
            # a good read gates again; a second outage is a second transition
            engine.set(running=4, kv=0.95)
            await until(lambda: obs.healthy and obs.current() is not None)
            assert obs.failures == 0
            parked = start_admit(tg, gate)
            await until(lambda: gate.parked(MODEL) == 1)
            engine.status = 503
            await until(lambda: parked.decision is not None)
            assert parked.decision is not None and parked.decision.reason == REASON_UNKNOWN
            assert sample(metrics, "sie_engine_state_stale_total", model=MODEL) == 2


async def test_stale_when_the_engine_is_unreachable() -> None:
    metrics = Metrics()
    gate = AdmissionGate(BASE, metrics)
    obs = gate.observe(MODEL, dead_url())
    obs.update(EngineState(running=4, waiting=0, kv_usage=0.95))  # an earlier good read
    assert not (await _try_admit_now(gate))
    for _ in range(2):
        assert await obs.poll_once() is None
        assert obs.healthy  # two failures: the last reading still stands
    assert await obs.poll_once() is None
    assert not obs.healthy and obs.failures == 3
    assert (await gate.admit(MODEL)).reason == REASON_UNKNOWN
    await obs.poll_once()
    assert sample(metrics, "sie_engine_state_stale_total", model=MODEL) == 1


async def _try_admit_now(gate: AdmissionGate) -> bool:
    with anyio.move_on_after(0.02):
        await gate.admit(MODEL)
        return True
    return False


async def test_garbled_exposition_counts_as_a_failed_poll() -> None:
    metrics = Metrics()
    async with fake_engine() as engine:
        engine.set(running=4, kv=0.95)
        async with running_gate(BASE, engine.url, metrics=metrics) as gate:
            obs = gate.observer(MODEL)
            engine.text = "<html><body>upstream connect error</body></html>"
            await until(lambda: obs.failures >= 1)
            assert obs.healthy and obs.current() is not None  # one bad page is not stale yet
            await until(lambda: not obs.healthy)
            assert obs.failures == 3
            assert sample(metrics, "sie_engine_state_stale_total", model=MODEL) == 1
            assert (await gate.admit(MODEL)).reason == REASON_UNKNOWN
            engine.text = "vllm:num_requests_running 1\n"  # parses, but incomplete
            await until(lambda: obs.failures >= 5)
            assert not obs.healthy


async def test_never_read_engine_fails_open() -> None:
    gate = AdmissionGate(BASE, Metrics())
    assert (await gate.admit(MODEL)).reason == REASON_UNKNOWN


async def test_silent_heartbeat_source_goes_stale_once() -> None:
    metrics = Metrics()
    gate = AdmissionGate(BASE, metrics)
    gate.update(MODEL, EngineState(running=4, waiting=0, kv_usage=0.1))
    async with anyio.create_task_group() as tg:
        out = start_admit(tg, gate)
        await until(lambda: gate.parked(MODEL) == 1)
        # no update for stale_after_failures * poll_interval_s = 0.15 s: fail open
        await until(lambda: out.decision is not None, timeout_s=2.0)
    assert out.decision is not None and out.decision.reason == REASON_UNKNOWN
    assert not gate.observer(MODEL).healthy
    assert sample(metrics, "sie_engine_state_stale_total", model=MODEL) == 1
    gate.update(MODEL, EngineState(running=4, waiting=0, kv_usage=0.1))
    assert gate.observer(MODEL).healthy


# -- startup self-check --------------------------------------------------------------


async def test_failed_self_check_sets_degraded_and_logs_error_until_a_read_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    caplog.set_level(logging.INFO, logger="sie.engines.runtime.observer")
    async with fake_engine() as engine:
        engine.status = 500
        async with running_gate(BASE, engine.url, metrics=metrics, read=False) as gate:
            obs = gate.observer(MODEL)
            assert obs.degraded
            assert sample(metrics, "sie_observer_degraded", model=MODEL) == 1
            errors = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1 and "self-check" in errors[0].getMessage()
            assert MODEL in errors[0].getMessage()
            assert (await gate.admit(MODEL)).reason == REASON_UNKNOWN  # fails open
            engine.set(running=0, kv=0.1)
            await until(lambda: not obs.degraded)
            assert sample(metrics, "sie_observer_degraded", model=MODEL) == 0
            assert (await gate.admit(MODEL)).reason == REASON_HEADROOM
    assert any("max_inflight=4" in r.getMessage() for r in caplog.records)


async def test_self_check_on_an_unreachable_engine(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    obs = EngineObserver(dead_url(), model=MODEL, cfg=BASE, metrics=metrics)
    with caplog.at_level(logging.ERROR, logger="sie.engines.runtime.observer"):
        assert await obs.self_check() is False
    assert obs.degraded and sample(metrics, "sie_observer_degraded", model=MODEL) == 1
    assert any(r.levelno == logging.ERROR for r in caplog.records)


async def test_successful_self_check_is_not_degraded() -> None:
    metrics = Metrics()
    async with fake_engine() as engine:
        obs = EngineObserver(engine.url, model=MODEL, cfg=BASE, metrics=metrics)
        assert await obs.self_check() is True
    assert not obs.degraded and sample(metrics, "sie_observer_degraded", model=MODEL) == 0


# -- gated vs ungated ----------------------------------------------------------------


async def test_only_observed_models_are_gated() -> None:
    metrics = Metrics()
    async with fake_engine() as engine:
        engine.set(running=4, kv=0.99)
        async with running_gate(BASE, engine.url, metrics=metrics) as gate:
            gate.update("other", EngineState(running=99, waiting=99, kv_usage=1.0))
            assert gate.gated(MODEL) and not gate.gated("other")
            assert await gate.admit("other") == Decision(True, REASON_UNGATED)
            assert not await _try_admit_now(gate)  # the observed model parks
        # the same saturated engine with ADMISSION_OBSERVE_MODELS unset: nobody is gated
        async with running_gate(replace(BASE, observe_models=None), engine.url) as gate:
            assert gate.observer(MODEL).current() is not None
            assert (await gate.admit(MODEL)).reason == REASON_UNGATED
    assert sample(metrics, "sie_admission_parked_total", model="other") == 0


# -- cross-request headroom accounting -----------------------------------------------


async def test_own_admissions_count_against_the_headroom_until_a_new_reading() -> None:
    gate = AdmissionGate(PUSHED, Metrics())  # max_inflight 4
    gate.update(MODEL, EngineState(running=2, waiting=0, kv_usage=0.1))
    assert (await gate.admit(MODEL)).reason == REASON_HEADROOM
    assert (await gate.admit(MODEL)).reason == REASON_HEADROOM
    assert gate.local_admits(MODEL) == 2
    async with anyio.create_task_group() as tg:
        third = start_admit(tg, gate)
        await until(lambda: gate.parked(MODEL) == 1)
        await anyio.sleep(3 * POLL)  # periodic re-checks do not release it
        assert third.decision is None
        gate.update(MODEL, EngineState(running=2, waiting=0, kv_usage=0.1))  # a new reading
        await until(lambda: third.decision is not None, timeout_s=1.0)
    assert gate.local_admits(MODEL) == 1  # counted against the new reading


async def test_headroom_accounting_over_http() -> None:
    async with fake_engine() as engine:
        engine.set(running=2, waiting=0, kv=0.1)
        async with running_gate(BASE, engine.url) as gate, anyio.create_task_group() as tg:
            obs = gate.observer(MODEL)
            await next_reading(obs)
            before = time.monotonic()
            a1, a2 = await gate.admit(MODEL), await gate.admit(MODEL)
            assert a1.admit and a2.admit
            v = obs.version
            third = start_admit(tg, gate)
            await until(lambda: third.decision is not None or gate.parked(MODEL) == 1)
            assert third.decision is None  # parks: 2 + 2 own admissions = 4
            await until(lambda: third.decision is not None)
            # released by a reading taken after the two admissions, not before
            assert obs.version > v
            reading = obs.current()
            assert reading is not None and reading.taken_at > before
            # the engine now reports them: 4 in flight, later requests park
            engine.set(running=4, waiting=0, kv=0.1)
            await next_reading(obs)
            await next_reading(obs)
            fourth = start_admit(tg, gate)
            for _ in range(3):
                await next_reading(obs)
            assert fourth.decision is None and gate.parked(MODEL) == 1
            engine.set(running=3, waiting=0, kv=0.1)
            await until(lambda: fourth.decision is not None)
            assert gate.local_admits(MODEL) <= 1


# -- FIFO and cancellation -----------------------------------------------------------


async def test_parked_requests_are_admitted_in_arrival_order() -> None:
    gate = AdmissionGate(replace(PUSHED, poll_interval_s=0.02), Metrics())
    full = EngineState(running=4, waiting=0, kv_usage=0.1)
    gate.update(MODEL, full)
    done: list[int] = []
    async with anyio.create_task_group() as tg:
        for i in range(4):
            start_admit(tg, gate, done=done, tag=i)
            await until(lambda i=i: gate.parked(MODEL) == i + 1)  # type: ignore[misc]
        # one slot at a time: exactly one admitted per reading, the oldest
        gate.update(MODEL, EngineState(running=3, waiting=0, kv_usage=0.1))
        await until(lambda: done == [0])
        await anyio.sleep(0.1)
        assert done == [0] and gate.parked(MODEL) == 3
        # a newcomer while others are parked goes to the back, even when there is room
        gate.update(MODEL, EngineState(running=1, waiting=0, kv_usage=0.1))  # room for 3
        start_admit(tg, gate, done=done, tag=99)
        await until(lambda: len(done) == 4)
        assert done == [0, 1, 2, 3]
        assert gate.parked(MODEL) == 1  # the newcomer waits for the next reading
        gate.update(MODEL, EngineState(running=0, waiting=0, kv_usage=0.1))
        await until(lambda: len(done) == 5)
    assert done == [0, 1, 2, 3, 99]


async def test_a_cancelled_parked_request_leaves_the_queue() -> None:
    gate = AdmissionGate(PUSHED, Metrics())
    gate.update(MODEL, EngineState(running=4, waiting=0, kv_usage=0.1))
    done: list[int] = []
    scopes: list[anyio.CancelScope] = []

    async def parked(tag: int) -> None:
        with anyio.CancelScope() as scope:  # a client disconnect cancels the handler
            scopes.append(scope)
            await gate.admit(MODEL)
            done.append(tag)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(parked, i)
            await until(lambda i=i: gate.parked(MODEL) == i + 1)  # type: ignore[misc]
        scopes[1].cancel()  # the middle one disconnects
        await until(lambda: gate.parked(MODEL) == 2)
        scopes[0].cancel()  # the head disconnects: the next one becomes head
        await until(lambda: gate.parked(MODEL) == 1)
        gate.update(MODEL, EngineState(running=3, waiting=0, kv_usage=0.1))
        await until(lambda: done == [2], timeout_s=1.0)
    assert gate.parked(MODEL) == 0 and done == [2]
    # the freed slot went to the only live request; nothing stale holds the headroom
    assert gate.local_admits(MODEL) == 1
