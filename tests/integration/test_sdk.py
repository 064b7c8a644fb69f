"""The SDK (``sie.client``, docs/sdk.md) against live stacks on both buses: the
in-memory bus and a real nats-server. Encode, score, extract and generation round
trip with ``SIEClient`` and ``SIEAsyncClient``; pools, config apply/status and
``watch`` work; and the server's real retry signals are honoured: a cold model's
503 ``MODEL_LOADING`` (Retry-After 5) is retried until served, a lane without
workers' 503 ``PROVISIONING`` (Retry-After 60) is waited on only within the call's
budget, and a 502 ``MODEL_LOAD_FAILED`` is raised after one request.

Both stacks answer "model loading" at once (``model_load_wait_s=0``), so the first
request to every model not preloaded goes through the SDK's retry path.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from sie.client import (
    ModelLoadFailedError,
    PoolError,
    ProvisioningError,
    RequestError,
    SIEAsyncClient,
    SIEClient,
    VersionSkewWarning,
)
from tests.conftest import MINILM, Stack, run_stack, wait_for

pytestmark = pytest.mark.slow

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
RAMPART = "nationaldesignstudio/rampart"
SPLADE = "rasyosef/splade-tiny"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
CONTACT = "Contact John Smith at john.smith@example.com, 12 Baker Street, London."
GHOST = (
    "sie_id: ghost/{bus}\nhf_id: ghost/{bus}\ntasks: {{encode: {{dense: {{dim: 4}}}}}}\n"
    "profiles: {{default: {{adapter_path: 'sie.engines.encoders.sentence_transformers:DenseEncoder', "
    "max_batch_tokens: 64}}}}\n"
)


@pytest.fixture(scope="module")
def memory_stack() -> Iterator[Stack]:
    with run_stack(preload=(MINILM,), model_load_wait_s=0.0) as s:
        yield s


@pytest.fixture(scope="module")
def nats_stack(nats_server: Any) -> Iterator[Stack]:
    with run_stack(
        bus="nats", nats_url=nats_server.url, preload=(MINILM,), model_load_wait_s=0.0
    ) as s:
        yield s


@pytest.fixture(params=["memory", "nats"])
def live(request: pytest.FixtureRequest) -> Stack:
    stack: Stack = request.getfixturevalue(f"{request.param}_stack")
    return stack


def bus(stack: Stack) -> str:
    return stack.settings.bus


def client(stack: Stack, **kw: Any) -> SIEClient:
    return SIEClient(
        stack.base_url,
        config_url=f"http://127.0.0.1:{stack.running.config_port}",
        timeout_s=60,
        **kw,
    )


def requests_seen(stack: Stack, endpoint: str, model: str, status: str) -> float:
    got = stack.metrics.registry.get_sample_value(
        "sie_requests_total", {"endpoint": endpoint, "model": model, "status": status}
    )
    return got or 0.0


def test_encode_score_extract_round_trip(live: Stack, st_model: Any) -> None:
    texts = ["over the SDK", "numpy arrays out", "third"]
    with warnings.catch_warnings(), client(live) as c:
        warnings.simplefilter("error", VersionSkewWarning)  # same version: never a warning
        results = c.encode(MINILM, [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)])
        assert [r["id"] for r in results] == ["t0", "t1", "t2"]
        got = np.stack([r["dense"] for r in results])
        assert got.dtype == np.float32 and got.shape == (3, 384)
        np.testing.assert_allclose(got, st_model.encode(texts), atol=1e-5)
        one = c.encode(MINILM, "single", output_types=["dense", "multivector"])
        assert isinstance(one, dict) and one["multivector"].shape[1] == 384
        assert one["timing"]["total_ms"] > 0
        packed = c.encode(MINILM, "x", output_dtype="binary")["dense"]
        assert packed.dtype == np.uint8 and packed.shape == (48,)

        ranked = c.score(
            MINILM,
            {"id": "q", "text": "how do I bake bread"},
            [{"id": "stocks", "text": "The stock market fell."}, "Knead the dough, bake the loaf."],
        )
        assert ranked["query_id"] == "q"
        assert [s["item_id"] for s in ranked["scores"]] == ["item-1", "stocks"]
        assert [s["rank"] for s in ranked["scores"]] == [0, 1]

        found = c.extract(RAMPART, {"id": "d1", "text": CONTACT})  # cold: MODEL_LOADING first
        assert found["id"] == "d1"
        spans = {(e["label"], CONTACT[e["start"] : e["end"]]) for e in found["entities"]}
        assert ("EMAIL", "john.smith@example.com") in spans

        names = [m["name"] for m in c.list_models()]
        assert MINILM in names and LLM in names
        assert c.get_model(MINILM)["state"] == "loaded"
        with pytest.raises(RequestError) as exc:
            c.get_model("nobody/nothing")
        assert exc.value.status_code == 404 and exc.value.code == "MODEL_NOT_FOUND"
        cap = c.get_capacity()
        assert cap["gpu_count"] >= 1 and "default" in cap["live_gpu_types"]
        assert c.get_capacity(gpu="h200")["worker_count"] == 0


def test_generation_round_trip(live: Stack) -> None:
    with client(live) as c:
        whole = c.chat(LLM, ASK, max_tokens=8, temperature=0)
        text = whole["choices"][0]["message"]["content"]
        assert text and whole["usage"]["completion_tokens"] >= 1
        chunks = list(
            c.chat(LLM, ASK, max_tokens=8, temperature=0, stream=True, include_usage=True)
        )
        streamed = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks[:-1])
        assert streamed == text and chunks[-1]["usage"] == whole["usage"]
        native = c.generate(LLM, messages=ASK, max_tokens=8, temperature=0)
        assert native["text"] == text and native["model"] == LLM
        deltas = list(
            c.generate(LLM, "The capital of France is", max_tokens=4, temperature=0, stream=True)
        )
        assert deltas[-1]["finish_reason"] == "length"
        done = c.complete(LLM, "The capital of France is", max_tokens=4, temperature=0)
        assert done["object"] == "text_completion"
        assert "".join(d["text"] for d in deltas) == done["choices"][0]["text"]


@pytest.mark.anyio
async def test_async_client_round_trip(live: Stack, st_model: Any) -> None:
    async with SIEAsyncClient(live.base_url, timeout_s=60, max_concurrency=2) as c:
        results = await c.encode(MINILM, ["a", "b", "c"])
        np.testing.assert_allclose(
            np.stack([r["dense"] for r in results]), st_model.encode(["a", "b", "c"]), atol=1e-5
        )
        ranked = await c.score(MINILM, "bread", ["stocks fell", "bake bread"], top_k=1)
        assert [s["item_id"] for s in ranked["scores"]] == ["item-1"]
        found = await c.extract(RAMPART, [CONTACT])
        assert any(e["label"] == "EMAIL" for e in found[0]["entities"])
        whole = await c.chat(LLM, ASK, max_tokens=6, temperature=0)
        stream = await c.chat(LLM, ASK, max_tokens=6, temperature=0, stream=True)
        text = "".join([ch["choices"][0]["delta"].get("content", "") async for ch in stream])
        assert text == whole["choices"][0]["message"]["content"]
        async with contextlib.aclosing(c.watch()) as docs:
            async for doc in docs:
                assert {w["worker_id"] for w in doc["workers"]} == {live.settings.worker_id}
                break


def test_watch_streams_the_cluster_status(live: Stack) -> None:
    with client(live) as c:
        stream = c.watch()
        first = next(stream)
        assert first["workers"][0]["worker_id"] == live.settings.worker_id
        name = f"watch-{bus(live)}"
        c.create_pool(name, {"default": 1})
        try:
            # the pool's creation is pushed to the open stream
            changed = next(d for d in stream if name in {p["spec"]["name"] for p in d["pools"]})
            assert changed["pools"][0]["spec"]["name"] == "default"
        finally:
            stream.close()
            c.delete_pool(name)


def test_pools_and_routing_by_pool_and_profile(live: Stack) -> None:
    name = f"sdk-{bus(live)}"
    with client(live) as c:
        info = c.create_pool(name.upper(), {"default": 1}, ttl_seconds=3)
        assert info["spec"]["name"] == name and info["status"]["state"] == "active"
        first = info["status"]["last_renewed"]
        # the client renews the 3 s lease every second until the pool is deleted
        wait_for(lambda: (c.get_pool(name) or {})["status"]["last_renewed"] > first, 10)
        assert name in [p["spec"]["name"] for p in c.list_pools()]
        r = c.encode(MINILM, "pooled", gpu=f"{name}/default")
        assert r["dense"].shape == (384,)
        with pytest.raises(PoolError) as exc:
            c.create_pool(name, {"default": 2})
        assert exc.value.status_code == 409 and exc.value.code == "POOL_CONFLICT"
        assert c.delete_pool() is True  # the pool this client created last
        assert c.get_pool(name) is None and c.delete_pool(name) is False
        with pytest.raises(PoolError) as exc:
            c.delete_pool("default")
        assert exc.value.status_code == 403


def test_config_apply_then_status(live: Stack) -> None:
    profile = f"sdk{bus(live)}"
    yaml = (
        f"sie_id: {MINILM}\nprofiles:\n  {profile}:\n    extends: default\n"
        "    max_batch_tokens: 512\n"
    )
    with client(live) as c:
        written = c.apply_config(yaml, idempotency_key=f"sdk-apply-{profile}")
        assert written["created_profiles"] == [profile] and written["epoch"] >= 1
        again = c.apply_config(yaml, idempotency_key=f"sdk-apply-{profile}")
        assert again == written  # an idempotent replay answers the first response
        status = wait_for(
            lambda: (
                (s := c.config_status(MINILM))["config_epoch"] >= written["epoch"]
                and s["all_bundles_acked"]
                and s
            ),
            timeout_s=15,
        )
        assert status["model_id"] == MINILM
        assert c.encode(f"{MINILM}:{profile}", "via the new profile")["dense"].shape == (384,)
        with pytest.raises(RequestError) as exc:
            c.apply_config("sie_id: [not, a, model]\n")
        assert exc.value.status_code in (400, 422)


def test_a_cold_model_is_retried_until_served(
    live: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """The first request to SPLADE answers 503 MODEL_LOADING with Retry-After 5; the
    SDK waits as told and the retry is served."""
    with client(live) as c, caplog.at_level(logging.INFO, logger="sie.client"):
        t0 = time.monotonic()
        got = c.encode(SPLADE, "how do I bake bread", output_types=["sparse"], is_query=True)
        took = time.monotonic() - t0
    assert got["sparse"]["indices"].size > 0
    assert requests_seen(live, "encode", SPLADE, "503") >= 1
    assert took >= 4.5, took  # Retry-After: 5 was honoured
    assert any("MODEL_LOADING" in r.getMessage() for r in caplog.records)


def test_provisioning_is_waited_on_within_the_budget(live: Stack) -> None:
    gw = live.running.gateway
    assert gw is not None
    wait_for(lambda: not gw.lane_served("default", "h200", "default"), timeout_s=10)
    with client(live) as c:
        t0 = time.monotonic()
        with pytest.raises(ProvisioningError) as exc:
            c.encode(MINILM, "x", gpu="h200", wait_for_capacity=False)
        assert time.monotonic() - t0 < 2 and exc.value.retry_after == 60
        before = requests_seen(live, "encode", MINILM, "503")
        t0 = time.monotonic()
        with pytest.raises(ProvisioningError):
            c.encode(MINILM, "x", gpu="h200", provision_timeout_s=2.0)
        took = time.monotonic() - t0
    # Retry-After 60 is longer than the budget: the SDK waited out its 2 s, no longer
    assert 1.9 <= took < 4, took
    assert requests_seen(live, "encode", MINILM, "503") == before + 1


def test_a_failed_load_is_raised_after_one_request(live: Stack) -> None:
    """A model whose weights do not exist (written at runtime through the SDK): once
    its load has failed, the 502 ``MODEL_LOAD_FAILED`` is raised at once, never
    retried, however long the budget."""
    model = f"ghost/{bus(live)}"
    with client(live) as c:
        c.apply_config(GHOST.format(bus=bus(live)))
        wait_for(lambda: model in [m["name"] for m in c.list_models()], timeout_s=15)
        # the first request starts the load (503 MODEL_LOADING here: no load wait)
        httpx.post(f"{live.base_url}/v1/encode/{model}", json={"items": [{"text": "a"}]})
        wait_for(lambda: c.get_model(model)["state"] == "failed", timeout_s=15)
        before = requests_seen(live, "encode", model, "502")
        t0 = time.monotonic()
        with pytest.raises(ModelLoadFailedError) as exc:
            c.encode(model, "a", provision_timeout_s=60)
        took = time.monotonic() - t0
    err = exc.value
    assert (err.model, err.error_class, err.permanent) == (model, "NOT_FOUND", True)
    assert err.status_code == 502 and err.attempts >= 1
    assert requests_seen(live, "encode", model, "502") == before + 1  # never retried
    assert took < 2, took  # and no wait either
