"""The generation contract (``CONTRACT`` of tests/contract/generation_contract.py) over
every generation engine, plus the mapping tests of those that cannot run a real model here:

- ``TransformersGenerator`` on the real SmolLM2-135M-Instruct: the whole contract (its
  own tests are in tests/unit/test_generation_engine.py).

- ``VllmGenerator`` with ``FakeAsyncLLM`` injected (tests/fakes/fake_vllm.py): the
  whole contract; SamplingParams / engine-argument mapping, finish reasons, usage, the
  stop guard, ``state()`` from vLLM's gauges and from counting, unload.
- ``OpenAIUpstreamGenerator`` against ``FakeVllmServer`` over real HTTP (hypercorn on a
  loopback port): the whole contract, with ``state_lag_s`` for its scraped state
  (up to one poll old); request mapping, upstream error mapping, abort
  closing the upstream stream, ``state()`` following the scraped ``/metrics``,
  fail-open. The fake server's wire format is checked with the official ``openai``
  client.
- real vLLM, only where ``import vllm`` works (a GPU machine with the ``vllm`` extra).
"""

from __future__ import annotations

import importlib.util
import math
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from sie.core.config import parse_model_config
from sie.core.errors import (
    GatewayTimeout,
    InferenceError,
    InvalidInput,
    ModelLoadFailed,
    ShuttingDown,
    UpstreamError,
    UpstreamUnavailable,
)
from sie.core.trust import ConfigTrust
from sie.engines.generation import EngineState, GenerationEngine, GenerationRequest
from sie.engines.generators.openai_upstream import OpenAIUpstreamGenerator
from sie.engines.generators.vllm_engine import VllmGenerator
from tests.conftest import MODEL_CACHE
from tests.contract.generation_contract import (
    CONTRACT,
    Harness,
    check_waiting_then_all_complete,
    collect,
    request,
    smollm_engine,
    smollm_harness,
    wait_until,
)
from tests.fakes.fake_vllm import (
    COUNTING,
    FRANCE,
    FRANCE_ANSWER,
    FakeAsyncLLM,
    FakeTokenizer,
    FakeVllm,
    FakeVllmServer,
    Fault,
    SamplingParams,
    serve,
)

pytestmark = pytest.mark.anyio

MODEL = "fake/model"
UPSTREAM_MODEL = "fake/upstream-model"
POLL = 0.1  # upstream metrics scrape interval in these tests (s)
TOK = FakeTokenizer()

#: checks that need requests to stay queued long enough to be seen: slower engine steps
SLOW_STEP_S = {check_waiting_then_all_complete.__name__: 0.05}
#: how long an upstream's scraped ``state()`` may lag a change (seconds; Harness.state_lag_s)
STATE_LAG_S = 5.0


def engine_config(adapter: str, loadtime: dict[str, Any], **doc: Any) -> Any:
    cfg = parse_model_config(
        {
            "sie_id": doc.pop("sie_id", MODEL),
            "hf_id": doc.pop("hf_id", MODEL),
            "tasks": {},
            "profiles": {
                "default": {
                    "adapter_path": adapter,
                    "max_batch_tokens": 8192,
                    "adapter_options": {"loadtime": loadtime},
                }
            },
            **doc,
        }
    )
    return cfg, cfg.resolve_profile()


def vllm_engine(
    fake: FakeVllm, loadtime: dict[str, Any] | None = None, **doc: Any
) -> VllmGenerator:
    cfg, profile = engine_config(
        "sie.engines.generators.vllm_engine:VllmGenerator",
        {"max_num_seqs": 4, **(loadtime or {})},
        **doc,
    )
    return VllmGenerator(cfg, profile, "cuda", vllm_module=fake, registry=fake.registry)


def upstream_trust(*urls: str, **keys: str) -> ConfigTrust:
    """The operator opt-in these tests need: the fake servers' URLs (and env keys)."""
    return ConfigTrust(
        upstream_base_urls=urls,
        upstream_api_key_envs=frozenset(keys),
        upstream_api_keys={k: SecretStr(v) for k, v in keys.items()},
    )


def upstream_engine(
    base_url: str, /, trust: ConfigTrust | None = None, **loadtime: Any
) -> OpenAIUpstreamGenerator:
    """An upstream engine for ``base_url``; unless ``trust`` is given, the operator allows
    exactly ``base_url`` and an explicit string ``metrics_url``."""
    if trust is None:
        metrics = loadtime.get("metrics_url")
        trust = upstream_trust(base_url, *([metrics] if isinstance(metrics, str) else []))
    opts = {
        "base_url": base_url,
        "upstream_model": UPSTREAM_MODEL,
        "max_num_seqs": 4,
        "metrics_interval_s": POLL,
        "api_key": "sk-test",
        **loadtime,
    }
    cfg, profile = engine_config(
        "sie.engines.generators.openai_upstream:OpenAIUpstreamGenerator", opts
    )
    return OpenAIUpstreamGenerator(cfg, profile, trust=trust)


def prompt_tokens(req: GenerationRequest) -> int:
    if req.messages is not None:
        text = TOK.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=False)
        assert isinstance(text, str)
        return len(TOK.encode(text, add_special_tokens=False))
    assert req.prompt is not None
    return len(TOK.encode(req.prompt))


def count_tokens(text: str) -> int:
    return len(TOK.encode(text, add_special_tokens=False))


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class step_time:
    """Temporarily slow a fake engine's steps (None: unchanged)."""

    def __init__(self, engine: FakeAsyncLLM, step_s: float | None) -> None:
        self.engine, self.step_s, self.old = engine, step_s, engine.step_s

    def __enter__(self) -> None:
        if self.step_s is not None:
            self.engine.step_s = self.step_s

    def __exit__(self, *exc: object) -> None:
        self.engine.step_s = self.old


# ================================================================ vLLM adapter + fake


@pytest.fixture(scope="module")
def vllm_fake() -> Iterator[VllmGenerator]:
    eng = vllm_engine(FakeVllm(registry=CollectorRegistry()))
    eng.load()
    try:
        yield eng
    finally:
        eng.unload()


def fake_of(eng: VllmGenerator) -> FakeAsyncLLM:
    engine = eng._engine
    assert isinstance(engine, FakeAsyncLLM)
    return engine


@pytest.fixture(scope="module")
def vllm_harness(vllm_fake: VllmGenerator) -> Harness:
    return Harness(engine=vllm_fake, prompt_tokens=prompt_tokens, count_tokens=count_tokens)


@pytest.mark.parametrize("check", CONTRACT, ids=lambda f: f.__name__.removeprefix("check_"))
async def test_vllm_fake_contract(vllm_harness: Harness, check: Callable[[Harness], Any]) -> None:
    assert isinstance(vllm_harness.engine, VllmGenerator)
    with step_time(fake_of(vllm_harness.engine), SLOW_STEP_S.get(check.__name__)):
        await check(vllm_harness)


def test_vllm_implements_the_port(vllm_fake: VllmGenerator) -> None:
    assert isinstance(vllm_fake, GenerationEngine)


async def test_vllm_request_mapping(vllm_fake: VllmGenerator) -> None:
    """SamplingParams go to vLLM exactly; the prompt is the ids we counted; usage and
    finish reasons come back from vLLM's outputs."""
    fake = fake_of(vllm_fake)
    req = request("The capital of France is", max_tokens=5, top_p=0.9, seed=3, stop=["Eiffel"])
    r = await collect(vllm_fake, req)
    rec = fake.requests[-1]
    ids = TOK.encode("The capital of France is")
    assert rec.request_id == req.request_id
    assert rec.prompt == {"prompt_token_ids": ids}
    assert rec.params == SamplingParams(
        n=1, max_tokens=5, temperature=0.0, top_p=0.9, seed=3, stop=["Eiffel"]
    )
    assert r.final.finish_reason == "length" and r.final.completion_tokens == 5
    assert r.final.prompt_tokens == len(ids)

    # chat: the template's ids; max_tokens null = the room left in the window
    r = await collect(vllm_fake, request(messages=FRANCE, temperature=0.7))
    rec = fake.requests[-1]
    chat_ids = rec.prompt["prompt_token_ids"]
    assert len(chat_ids) == prompt_tokens(request(messages=FRANCE))
    assert rec.params.max_tokens == 2048 - len(chat_ids)
    assert rec.params.temperature == 0.7 and rec.params.seed is None and rec.params.stop == []

    # EOS: "stop", the EOS counted as vLLM counts it
    r = await collect(vllm_fake, request(messages=FRANCE))
    assert r.text == FRANCE_ANSWER and r.final.finish_reason == "stop"
    assert r.final.completion_tokens == count_tokens(FRANCE_ANSWER) + 1
    assert r.final.prompt_tokens == len(chat_ids)


async def test_vllm_stop_guard_when_the_engine_streams_a_stop() -> None:
    """An engine that ignores stop strings (streams them): nothing of the stop leaks,
    the finish is "stop", and the request is aborted inside the engine."""
    eng = vllm_engine(FakeVllm(honour_stop=False))
    await anyio.to_thread.run_sync(eng.load)
    try:
        fake = fake_of(eng)
        req = request(COUNTING, max_tokens=200, stop=[" 8,"])
        r = await collect(eng, req)
        assert r.text == " 5, 6, 7,"
        assert all(" 8" not in d.text for d in r.deltas)
        assert r.final.finish_reason == "stop"
        assert sum(d.num_tokens for d in r.deltas) == r.final.completion_tokens
        await wait_until(lambda: req.request_id in fake.aborted, 5)
        await wait_until(lambda: fake.stats().running == 0, 5)
    finally:
        eng.unload()


async def test_vllm_state_from_gauges_bounded_by_inflight(vllm_fake: VllmGenerator) -> None:
    fake = fake_of(vllm_fake)
    cap = fake.num_gpu_blocks * fake.block_size
    assert vllm_fake.state() == EngineState(0, 0, 0.0, cap, 4)
    it = vllm_fake.generate(request(COUNTING, max_tokens=300))
    try:
        await it.__anext__()
        assert vllm_fake.state().running == 1
        fake.metrics_override = {"kv_usage": 0.42, "running": 7}  # gauges say so
        st = vllm_fake.state()
        assert st.kv_usage == 0.42
        assert st.running == 1 and st.waiting == 0  # a stale/foreign count is capped
    finally:
        await it.aclose()
    # the gauges still claim 7 running / 42 %: nothing is in flight, so 0 and 0.0
    assert vllm_fake.state() == EngineState(0, 0, 0.0, cap, 4)
    fake.metrics_override = {}


async def test_vllm_state_by_counting_without_gauges() -> None:
    """No series for this model in the registry (stats off, or another engine's):
    running = requests with output, KV = their block-rounded tokens over capacity."""
    other = FakeAsyncLLM(model="someone/else")
    registry = CollectorRegistry()
    registry.register(other.collector())
    fake = FakeVllm()
    cfg, profile = engine_config(
        "sie.engines.generators.vllm_engine:VllmGenerator", {"max_num_seqs": 2}
    )
    eng = VllmGenerator(cfg, profile, "cuda", vllm_module=fake, registry=registry)
    await anyio.to_thread.run_sync(eng.load)
    try:
        cap = 256 * 16
        assert eng.state() == EngineState(0, 0, 0.0, cap, 2)
        it = eng.generate(request(COUNTING, max_tokens=300))
        try:
            await it.__anext__()
            st = eng.state()
            assert st.running == 1 and st.waiting == 0
            n_prompt = prompt_tokens(request(COUNTING))
            assert st.kv_usage is not None
            assert st.kv_usage * cap >= n_prompt
            assert st.kv_usage * cap == math.ceil(st.kv_usage * cap / 16) * 16  # whole blocks
        finally:
            await it.aclose()
        assert eng.state().running == 0
    finally:
        eng.unload()
        other.shutdown()


async def test_vllm_engine_arguments(tmp_path: Path) -> None:
    fake = FakeVllm(num_gpu_blocks=100, block_size=32)
    eng = vllm_engine(
        fake,
        {
            "max_num_seqs": 3,
            "gpu_memory_utilization": 0.5,
            "max_model_len": 512,
            "dtype": "float16",
            "enforce_eager": True,
            "engine_args": {"enable_prefix_caching": False},
        },
        weights_path=str(tmp_path),
    )
    await anyio.to_thread.run_sync(eng.load)
    try:
        assert fake.engine_args == {
            "model": str(tmp_path),
            "served_model_name": MODEL,
            "disable_log_stats": False,
            "max_num_seqs": 3,
            "max_model_len": 512,
            "gpu_memory_utilization": 0.5,
            "dtype": "float16",
            "enforce_eager": True,
            "enable_prefix_caching": False,
        }
        assert eng.window == 512
        assert eng.state() == EngineState(0, 0, 0.0, 3200, 3)
        with pytest.raises(InvalidInput) as info:  # the window, checked before vLLM
            await collect(eng, request("word " * 600))
        assert info.value.fields["field"] == "prompt"
    finally:
        eng.unload()
    # the hf_id when no local weights exist; the config's window by default
    fake = FakeVllm()
    eng = vllm_engine(fake, max_sequence_length=1024)
    await anyio.to_thread.run_sync(eng.load)
    eng.unload()
    assert fake.engine_args["model"] == MODEL and fake.engine_args["max_model_len"] == 1024
    with pytest.raises(ModelLoadFailed) as err:
        vllm_engine(FakeVllm(), {"gpu_memory_utilization": 1.5}).load()
    assert err.value.fields["error_class"] == "CONFIG"
    assert "gpu_memory_utilization" in err.value.message


def test_vllm_missing_is_a_dependency_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    cfg, profile = engine_config("sie.engines.generators.vllm_engine:VllmGenerator", {})
    with pytest.raises(ModelLoadFailed) as info:
        VllmGenerator(cfg, profile).load()
    assert info.value.fields["error_class"] == "DEPENDENCY"
    assert "vllm" in info.value.message.lower()


async def test_vllm_rejections_and_unload() -> None:
    eng = vllm_engine(FakeVllm())
    await anyio.to_thread.run_sync(eng.load)
    try:
        fake = fake_of(eng)
        # vLLM's own validation error (its window smaller than ours here) -> InvalidInput
        fake.max_model_len = 5
        with pytest.raises(InvalidInput):
            await collect(eng, request("one two three four five six seven", max_tokens=2))
        fake.max_model_len = 2048
        # vLLM aborting a request on its own: an error, never a silent end
        it = eng.generate(request(COUNTING, max_tokens=300))
        await it.__anext__()
        await fake.abort(fake.requests[-1].request_id)
        with pytest.raises(InferenceError, match="abort"):
            async for _ in it:
                pass
        assert eng.state().load == 0
        # a request id already in flight
        req = request(COUNTING, max_tokens=300)
        it = eng.generate(req)
        await it.__anext__()
        with pytest.raises(InvalidInput) as info:
            await collect(eng, GenerationRequest(req.request_id, prompt="x"))
        assert info.value.fields["field"] == "request_id"
        # unload with a request in flight: its stream ends with ShuttingDown
        await anyio.to_thread.run_sync(eng.unload)
        with pytest.raises(ShuttingDown):
            async for _ in it:
                pass
        assert req.request_id in fake.aborted
        with pytest.raises(InferenceError):
            await collect(eng, request("x"))
    finally:
        eng.unload()


# ================================================================ upstream proxy + fake server


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeVllmServer]:
    engine = FakeAsyncLLM(model=UPSTREAM_MODEL, max_num_seqs=4)
    with serve(FakeVllmServer(engine)) as server:
        yield server
    engine.shutdown()


@pytest.fixture(scope="module")
def upstream(fake_server: FakeVllmServer) -> Iterator[OpenAIUpstreamGenerator]:
    eng = upstream_engine(fake_server.base_url)
    eng.load()
    try:
        yield eng
    finally:
        eng.unload()


@pytest.fixture
def server(fake_server: FakeVllmServer) -> Iterator[FakeVllmServer]:
    """The shared fake server, reset after each test."""
    yield fake_server
    fake_server.faults.clear()
    fake_server.metrics_status, fake_server.metrics_text = 200, None
    fake_server.engine.metrics_override = {}


@pytest.fixture(scope="module")
def upstream_harness(upstream: OpenAIUpstreamGenerator) -> Harness:
    return Harness(
        engine=upstream,
        prompt_tokens=prompt_tokens,
        count_tokens=count_tokens,
        state_lag_s=STATE_LAG_S,
    )


@pytest.mark.parametrize("check", CONTRACT, ids=lambda f: f.__name__.removeprefix("check_"))
async def test_upstream_contract(
    upstream_harness: Harness, server: FakeVllmServer, check: Callable[[Harness], Any]
) -> None:
    # start from an idle reading: the scrape of the previous check's requests may lag
    await wait_until(lambda: upstream_harness.engine.state().load == 0, 5)
    with step_time(server.engine, SLOW_STEP_S.get(check.__name__)):
        await check(upstream_harness)


async def test_upstream_request_mapping(
    upstream: OpenAIUpstreamGenerator, server: FakeVllmServer
) -> None:
    r = await collect(
        upstream,
        request(messages=FRANCE, max_tokens=7, temperature=0.5, top_p=0.9, seed=11, stop=["zz"]),
    )
    assert server.bodies[-1] == {
        "model": UPSTREAM_MODEL,
        "messages": FRANCE,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 11,
        "stop": ["zz"],
    }
    assert server.headers[-1]["authorization"] == "Bearer sk-test"
    assert r.final.completion_tokens == 7 and r.final.finish_reason == "length"
    r = await collect(upstream, request("The capital of France is"))
    assert server.bodies[-1] == {
        "model": UPSTREAM_MODEL,
        "prompt": "The capital of France is",
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "top_p": 1.0,
    }
    assert r.final.finish_reason == "stop"  # EOS
    assert r.final.prompt_tokens == prompt_tokens(request("The capital of France is"))
    assert r.final.completion_tokens == count_tokens(r.text) + 1
    assert sum(d.num_tokens for d in r.deltas) == r.final.completion_tokens


async def test_upstream_error_mapping(
    upstream: OpenAIUpstreamGenerator, server: FakeVllmServer
) -> None:
    async def fails(fault: Fault | None = None, eng: Any = upstream) -> Exception:
        if fault is not None:
            server.faults.append(fault)
        with pytest.raises(Exception) as info:
            await collect(eng, request(COUNTING, max_tokens=50))
        return info.value

    err = await fails(Fault(status=400, message="max_tokens is too large"))
    assert isinstance(err, InvalidInput) and "max_tokens is too large" in err.message
    assert err.fields["upstream_status"] == 400
    err = await fails(Fault(status=500, message="CUDA error"))
    assert type(err) is UpstreamError and err.status == 502 and "CUDA error" in err.message
    err = await fails(Fault(status=503))
    assert isinstance(err, UpstreamUnavailable) and err.status == 503 and err.retry_after_s
    err = await fails(Fault(status=504))
    assert isinstance(err, GatewayTimeout)
    err = await fails(Fault(cut_after=2))  # connection dropped mid-stream
    assert type(err) is UpstreamError
    err = await fails(Fault(error_after=1, error_status=400, message="bad stop"))
    assert isinstance(err, InvalidInput) and "bad stop" in err.message
    err = await fails(Fault(error_after=1, error_status=500, message="engine died"))
    assert type(err) is UpstreamError and "engine died" in err.message
    await wait_until(lambda: server.engine.stats().running == 0, 5)

    wrong = upstream_engine(server.base_url, upstream_model="no/such-model", metrics_url=False)
    wrong.load()
    try:
        err = await fails(eng=wrong)
        assert type(err) is UpstreamError and "no/such-model" in err.message
    finally:
        wrong.unload()
    dead = upstream_engine(dead_url(), metrics_url=False)
    dead.load()
    try:
        assert isinstance(await fails(eng=dead), UpstreamUnavailable)
    finally:
        dead.unload()


async def test_upstream_stop_guard_when_the_upstream_streams_a_stop(
    upstream: OpenAIUpstreamGenerator, server: FakeVllmServer
) -> None:
    """An upstream that ignores stop strings: nothing of the stop leaks, the finish is
    "stop" (token counts from the chunks, prompt unknown) and the upstream request is
    aborted by closing its stream."""
    engine = server.engine
    engine.honour_stop = False
    try:
        aborted = len(engine.aborted)
        r = await collect(upstream, request(COUNTING, max_tokens=200, stop=[" 8,"]))
        assert server.bodies[-1]["stop"] == [" 8,"]
        assert r.text == " 5, 6, 7,"
        assert all(" 8" not in d.text for d in r.deltas)
        assert r.final.finish_reason == "stop" and r.final.prompt_tokens is None
        # " 5" "," " 6" "," " 7" "," " 8" ",": the chunk completing the stop counts, as in vLLM
        assert r.final.completion_tokens == sum(d.num_tokens for d in r.deltas) == 8
        await wait_until(lambda: len(engine.aborted) == aborted + 1, 5)
        await wait_until(lambda: engine.stats().running == 0, 5)
    finally:
        engine.honour_stop = True


async def test_upstream_abort_closes_the_upstream_stream(
    upstream: OpenAIUpstreamGenerator, server: FakeVllmServer
) -> None:
    engine = server.engine
    # abort while the consumer waits for the next delta
    req = request(COUNTING, max_tokens=300)
    got: list[Any] = []

    async def consume() -> None:
        async for d in upstream.generate(req):
            got.append(d)

    aborted = len(engine.aborted)
    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await wait_until(lambda: bool(got))
        assert engine.stats().running == 1
        await upstream.abort(req.request_id)
    assert all(d.finish_reason is None for d in got) and len(got) < 300
    await wait_until(lambda: engine.stats().running == 0, 5)  # the server aborted it
    assert len(engine.aborted) == aborted + 1
    await wait_until(lambda: upstream.state().running == 0, 5)  # ... and the scrape shows it

    # abort while the consumer holds a delta (not reading), then closing the iterator
    for how in ("abort", "aclose"):
        req = request(COUNTING, max_tokens=300)
        it = upstream.generate(req)
        await it.__anext__()
        await wait_until(lambda: upstream.state().running == 1, 5)
        if how == "abort":
            await upstream.abort(req.request_id)
            with pytest.raises(StopAsyncIteration):
                await it.__anext__()
        else:
            await it.aclose()
        await wait_until(lambda: engine.stats().running == 0, 5)
        await wait_until(lambda: upstream.state().running == 0, 5)
    await upstream.abort("no-such-request")


async def test_upstream_state_follows_the_scraped_metrics(
    upstream: OpenAIUpstreamGenerator, server: FakeVllmServer
) -> None:
    engine = server.engine
    cap = engine.num_gpu_blocks * engine.block_size
    await wait_until(lambda: upstream.state() == EngineState(0, 0, 0.0, cap, 4), 5)
    assert upstream.state_known
    engine.metrics_override = {"running": 3, "waiting": 2, "kv_usage": 0.5}
    await wait_until(lambda: upstream.state() == EngineState(3, 2, 0.5, cap, 4), 5)
    engine.metrics_override = {}
    # a live request: running and KV usage follow within a few polls
    it = upstream.generate(request(COUNTING, max_tokens=300))
    try:
        await it.__anext__()
        await wait_until(lambda: upstream.state().running == 1, 5)
        st = upstream.state()
        assert st.kv_usage is not None and st.kv_usage * cap >= prompt_tokens(request(COUNTING))
    finally:
        await it.aclose()
    await wait_until(lambda: upstream.state() == EngineState(0, 0, 0.0, cap, 4), 5)


async def test_upstream_state_fails_open(
    upstream: OpenAIUpstreamGenerator, server: FakeVllmServer
) -> None:
    unknown = EngineState(0, 0, 0.0, None, 4)
    server.engine.metrics_override = {"running": 2, "waiting": 1}
    await wait_until(lambda: upstream.state().running == 2, 5)
    for break_it in ({"metrics_status": 500}, {"metrics_text": "vllm:num_requests_running{ 1"}):
        for k, v in break_it.items():
            setattr(server, k, v)
        await wait_until(lambda: not upstream.state_known, 5)  # 3 failed polls
        assert upstream.state() == unknown
        server.metrics_status, server.metrics_text = 200, None
        await wait_until(lambda: upstream.state().running == 2, 5)  # healthy again


async def test_upstream_unreadable_metrics_at_load(server: FakeVllmServer) -> None:
    eng = upstream_engine(server.base_url, metrics_url=dead_url() + "/metrics")
    await anyio.to_thread.run_sync(eng.load)  # not fatal: logged at ERROR, fails open
    try:
        assert eng.observer.degraded and not eng.state_known
        assert eng.state() == EngineState(0, 0, 0.0, None, 4)
        r = await collect(eng, request(messages=FRANCE, max_tokens=24))
        assert r.text == FRANCE_ANSWER  # inference is unaffected
    finally:
        eng.unload()
    with pytest.raises(InferenceError):
        await collect(eng, request("x"))


async def test_fake_server_speaks_openai(server: FakeVllmServer) -> None:
    """The fake's wire format is what the official client reads (stream and not)."""
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="sk-test")
    try:
        chat = await client.chat.completions.create(
            model=UPSTREAM_MODEL, messages=FRANCE, temperature=0
        )
        assert chat.choices[0].message.content == FRANCE_ANSWER
        assert chat.choices[0].finish_reason == "stop"
        assert chat.usage is not None and chat.usage.completion_tokens == 8
        text, usage, finish = "", None, None
        stream = await client.chat.completions.create(
            model=UPSTREAM_MODEL,
            messages=FRANCE,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for ev in stream:
            usage = ev.usage or usage
            for c in ev.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        assert (text, finish) == (FRANCE_ANSWER, "stop")
        assert usage is not None and usage.prompt_tokens == prompt_tokens(request(messages=FRANCE))
        done = await client.completions.create(
            model=UPSTREAM_MODEL, prompt="The capital of France is", max_tokens=2, temperature=0
        )
        assert done.choices[0].text == " Paris." and done.choices[0].finish_reason == "length"
        pieces = [
            ev.choices[0].text
            async for ev in await client.completions.create(
                model=UPSTREAM_MODEL,
                prompt="The capital of France is",
                max_tokens=2,
                temperature=0,
                stream=True,
            )
            if ev.choices
        ]
        assert "".join(pieces) == " Paris."
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="nope", prompt="x")
    finally:
        await client.close()


def test_upstream_options() -> None:
    eng = upstream_engine("http://vllm:8000/v1/", metrics_url=None)
    eng._read_options()
    assert eng.api_root == "http://vllm:8000/v1"
    assert eng.metrics_url == "http://vllm:8000/metrics"
    url, body = eng.request_body(request(messages=FRANCE))
    assert url == "http://vllm:8000/v1/chat/completions" and body["model"] == UPSTREAM_MODEL
    cfg, profile = engine_config(
        "sie.engines.generators.openai_upstream:OpenAIUpstreamGenerator",
        {"base_url": "https://up.example"},
        sie_id="org/served",
        hf_id="org/weights",
    )
    plain = OpenAIUpstreamGenerator(cfg, profile, trust=upstream_trust("https://up.example"))
    plain._read_options()
    assert plain.upstream_model == "org/weights" and plain.max_num_seqs is None
    assert plain.timeout_s == 600.0 and plain.metrics_interval_s == 2.0
    for bad in (
        {"base_url": None},
        {"base_url": "vllm:8000"},
        {"timeout_s": 0},
        {"max_num_seqs": 0},
        {"metrics_url": 5},
        {"api_key_env": "SIE_TEST_NO_SUCH_VARIABLE"},  # not declared by the operator
        {"base_url": "http://elsewhere:8000"},  # not on the allowlist
        {"metrics_url": "http://elsewhere:8000/metrics"},
    ):
        with pytest.raises(ModelLoadFailed) as info:
            upstream_engine("http://vllm:8000", upstream_trust("http://vllm:8000"), **bad).load()
        assert info.value.fields["error_class"] == "CONFIG"
    # declared but unset where the worker started: refused, and the name is not looked up
    declared = ConfigTrust(
        upstream_base_urls=("http://vllm:8000",),
        upstream_api_key_envs=frozenset({"SIE_TEST_UPSTREAM_KEY"}),
    )
    with pytest.raises(ModelLoadFailed, match="not set on this worker"):
        upstream_engine("http://vllm:8000", declared, api_key_env="SIE_TEST_UPSTREAM_KEY").load()
    # the value comes from the operator's captured keys (sie.settings), not os.environ
    keyed = upstream_engine(
        "http://vllm:8000",
        upstream_trust("http://vllm:8000", SIE_TEST_UPSTREAM_KEY="from-env"),
        api_key_env="SIE_TEST_UPSTREAM_KEY",
    )
    keyed._read_options()
    assert keyed._headers == {"Authorization": "Bearer from-env"}
    # without an operator policy nothing is allowed
    with pytest.raises(ModelLoadFailed) as info:
        upstream_engine("http://vllm:8000", ConfigTrust()).load()
    assert info.value.fields["error_class"] == "CONFIG" and "base_url" in info.value.message


# ================================================================ real vLLM (GPU machines)


def _smollm_dir() -> Path | None:
    env = os.environ.get("SIE_VLLM_TEST_MODEL")
    if env:
        return Path(env)
    for p in sorted((MODEL_CACHE / "sie-models").glob("*SmolLM2-135M*")):
        if (p / "config.json").is_file():
            return p
    return None


_REAL_HARNESS: dict[str, Harness] = {}  # one harness (its memo) across the real checks


@pytest.fixture(scope="module")
def real_vllm() -> Iterator[tuple[VllmGenerator, Any]]:
    try:
        import vllm  # noqa: F401
    except Exception:
        pytest.skip("vllm not installed (GPU extra)")
    weights = _smollm_dir()
    if weights is None:
        pytest.skip(
            "no SmolLM2 weights: run test_generation_engine.py once or set SIE_VLLM_TEST_MODEL"
        )
    from transformers import AutoTokenizer

    cfg, profile = engine_config(
        "sie.engines.generators.vllm_engine:VllmGenerator",
        {
            "max_num_seqs": 4,
            "gpu_memory_utilization": 0.3,
            "max_model_len": 2048,
            "dtype": "float32",
            "enforce_eager": True,
        },
        sie_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        weights_path=str(weights),
    )
    eng = VllmGenerator(cfg, profile, "cuda")
    eng.load()
    try:
        yield eng, AutoTokenizer.from_pretrained(str(weights))
    finally:
        eng.unload()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm not installed (GPU extra)"
)
@pytest.mark.parametrize("check", CONTRACT, ids=lambda f: f.__name__.removeprefix("check_"))
async def test_real_vllm_contract(
    real_vllm: tuple[VllmGenerator, Any], check: Callable[[Harness], Any]
) -> None:
    eng, tok = real_vllm

    def real_prompt_tokens(req: GenerationRequest) -> int:
        if req.messages is not None:
            text = tok.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=False)
            return len(tok.encode(text, add_special_tokens=False))
        return len(tok.encode(req.prompt))

    harness = _REAL_HARNESS.setdefault(
        "h",
        Harness(
            engine=eng,
            prompt_tokens=real_prompt_tokens,
            count_tokens=lambda text: len(tok.encode(text, add_special_tokens=False)),
        ),
    )
    await check(harness)


# ---------------------------------------------------------------- transformers, real model


@pytest.fixture(scope="module")
def transformers_harness() -> Iterator[Harness]:
    with smollm_engine() as engine:
        yield smollm_harness(engine)


@pytest.mark.slow
@pytest.mark.parametrize("check", CONTRACT, ids=lambda f: f.__name__.removeprefix("check_"))
async def test_transformers_contract(
    transformers_harness: Harness, check: Callable[[Harness], Any]
) -> None:
    await check(transformers_harness)
