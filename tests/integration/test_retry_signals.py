"""Retry signals (architecture §2, docs/api.md §11): a request that reaches a model
still loading past ``SIE_MODEL_LOAD_WAIT_S`` answers 503 ``MODEL_LOADING`` with
Retry-After at once, not a 504 after the gateway's timeout; the load goes on, and the
retry is served. Over real HTTP, every role in one process."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import MINILM, Stack, run_stack

pytestmark = pytest.mark.slow

SPLADE = "rasyosef/splade-tiny"
LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def cold() -> Iterator[Stack]:
    # no wait at all: any request that finds its model loading gets the signal
    with run_stack(preload=(MINILM,), model_load_wait_s=0.0) as s:
        yield s


def retry_until_ok(c: httpx.Client, url: str, body: dict[str, object]) -> httpx.Response:
    deadline = time.monotonic() + 90
    while True:
        r = c.post(url, json=body)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        assert r.headers["x-sie-error-code"] == "MODEL_LOADING", r.text
        time.sleep(0.2)  # a client honouring a shorter Retry-After than 5 s


def test_a_cold_model_answers_model_loading_then_serves(cold: Stack) -> None:
    body = {"items": [{"text": "how do I bake bread"}], "params": {"output_types": ["sparse"]}}
    with httpx.Client(base_url=cold.base_url, timeout=60) as c:
        t0 = time.monotonic()
        r = c.post(f"/v1/encode/{SPLADE}", json=body)
        took = time.monotonic() - t0
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "MODEL_LOADING"
        assert r.headers["retry-after"] == "5" and r.headers["x-sie-error-code"] == "MODEL_LOADING"
        assert took < 5, took  # was a 504 after the 30 s timeout for a slow load
        r = retry_until_ok(c, f"/v1/encode/{SPLADE}", body)
        assert r.status_code == 200, r.text
        assert r.json()["items"][0]["sparse"]["indices"]
        # loaded now: the same request is served at once
        assert c.post(f"/v1/encode/{SPLADE}", json=body).status_code == 200


def test_a_cold_generator_answers_model_loading_in_the_openai_envelope(cold: Stack) -> None:
    body = {"model": LLM, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
    with httpx.Client(base_url=cold.base_url, timeout=60) as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "model_loading"
        assert r.headers["retry-after"] == "5"
        r = retry_until_ok(c, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]


def test_three_cold_models_loading_at_once_all_serve() -> None:
    """First requests to three cold models at once (found by a hostile trial: parallel
    loads corrupted each other and one model failed for good with a 502)."""
    import concurrent.futures

    rampart = "nationaldesignstudio/rampart"
    calls = {
        SPLADE: (
            f"/v1/encode/{SPLADE}",
            {"items": [{"text": "a"}], "params": {"output_types": ["sparse"]}},
        ),
        rampart: (f"/v1/extract/{rampart}", {"items": [{"text": "Call John"}]}),
        LLM: (
            "/v1/chat/completions",
            {"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        ),
    }
    with run_stack(preload=(MINILM,)) as s, httpx.Client(base_url=s.base_url, timeout=60) as c:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(lambda kv: retry_until_ok(c, *kv), calls.values()))
        assert [r.status_code for r in replies] == [200, 200, 200], [r.text for r in replies]
