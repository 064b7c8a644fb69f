"""Engine-state admission on the live generation path (admission-gate.md; issue 6):
the worker's heartbeats carry its engine state to the gateway's gate; with the engine
full, a streaming request gets 200 and keep-alive comments while parked, then an error
event when the park times out; a plain request gets 503 ENGINE_SATURATED with
Retry-After 5; once the engine has room, requests are admitted again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Stack, run_stack, wait_for

pytestmark = pytest.mark.slow

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def gated() -> Iterator[Stack]:
    with run_stack(
        preload=(LLM,),
        heartbeat_interval_s=0.2,
        admission_observe_models=(LLM,),
        admission_max_inflight=1,
        admission_poll_interval_s=0.2,
        admission_keepalive_s=0.3,
        admission_max_park_s=1.5,
    ) as s:
        yield s


def stale(stack: Stack) -> float:
    """How often the gate saw the engine state go stale (and so failed open)."""
    return stack.metrics.engine_state_stale.labels(LLM)._value.get()  # type: ignore[attr-defined]


def test_a_full_engine_parks_then_rejects_and_frees_again(gated: Stack) -> None:
    gw = gated.running.gateway
    assert gw is not None
    url = f"{gated.base_url}/v1/chat/completions"
    hog_started = threading.Event()
    stop_hog = threading.Event()

    def hog() -> None:  # holds the only slot until told to stop
        body = {
            "model": LLM,
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 1000,
            # greedy: > 400 tokens; a sampled story (temperature 1) can end in a few seconds
            "temperature": 0,
            "stream": True,
        }
        with httpx.stream("POST", url, json=body, timeout=120) as r:
            for _ in r.iter_lines():
                hog_started.set()
                if stop_hog.is_set():
                    return

    t = threading.Thread(target=hog)
    t.start()
    try:
        assert hog_started.wait(30)
        state = wait_for(
            lambda: s if (s := gw.generation.model_state(LLM)) and s.running == 1 else None,
            timeout_s=10,
        )
        assert state.max_num_seqs == 4
        ask = {"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        # streaming: 200 at once, keep-alives while parked, then an error event
        t0 = time.monotonic()
        with httpx.stream("POST", url, json={**ask, "stream": True}, timeout=30) as r:
            assert r.status_code == 200 and time.monotonic() - t0 < 1.0
            lines = list(r.iter_lines())
        keepalives = [ln for ln in lines if ln == ": keep-alive"]
        assert 3 <= len(keepalives) <= 6, lines  # every 0.3 s for 1.5 s
        assert any(ln.startswith("event: error") for ln in lines), (lines, stale(gated))
        assert any("engine_saturated" in ln for ln in lines)
        # non-streaming: parks silently, then 503 + Retry-After 5 in the OpenAI envelope
        r = httpx.post(url, json=ask, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "5", (r.text, stale(gated))
        assert r.json()["error"]["code"] == "engine_saturated"
    finally:
        stop_hog.set()
        t.join(timeout=30)
    # the slot frees: admitted again
    wait_for(lambda: (s := gw.generation.model_state(LLM)) is not None and s.running == 0, 15)
    r = httpx.post(url, json=ask, timeout=60)
    assert r.status_code == 200, r.text
