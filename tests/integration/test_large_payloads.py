"""Large payloads over real HTTP (docs/api.md §12): work items over the bus's
``max_payload`` travel by reference through the payload store, results over it as
``result_chunk_v1`` envelopes; both on the memory bus and over a real nats-server with
its default 1 MiB ``max_payload`` (and a 96 KiB one, where every multivector result of
MiniLM must be chunked)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

from sie.transport.memory import MemoryBus
from tests.conftest import MINILM, Stack, run_stack
from tests.natsserver import NatsServer

pytestmark = pytest.mark.slow

MSGPACK = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
# two-byte letters: a text of the largest allowed length (1,000,000 characters) is
# then well over 1 MiB of UTF-8
WORDS = "über grüne brücken läuft ein schneller fuchs zur weißen mühle am fluss "


def big_text(i: int, chars: int) -> str:
    head = f"document {i} talks about topic {i * 7 % 13} and number {i}. "
    return (head + WORDS * (chars // len(WORDS) + 1))[:chars]


def nd(value: Any) -> np.ndarray:
    """A msgpack-numpy map (str or bin keys) as an array."""
    get = (lambda k: value[k.encode()]) if b"nd" in value else (lambda k: value[k])
    return np.frombuffer(get("data"), dtype=np.dtype(get("type"))).reshape(get("shape"))


def payload_files(stack: Stack) -> list[str]:
    store: Any = stack.running.gateway.payloads  # type: ignore[union-attr]
    try:
        return list(store.fs.find(store.root))
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module", params=["memory", "nats"])
def big_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    extra: dict[str, Any] = {"payload_store_url": str(tmp_path_factory.mktemp("payloads"))}
    if request.param == "nats":
        server = request.getfixturevalue("nats_server")  # the default 1 MiB max_payload
        extra |= {"bus": "nats", "nats_url": server.url}
    with run_stack(preload=(MINILM,), request_timeout_s=120, **extra) as s:
        assert s.running.bus.max_payload == 1024 * 1024
        yield s


def test_inputs_of_20_mb_go_by_reference(big_stack: Stack, st_model: Any) -> None:
    texts = [big_text(i, 1_000_000) for i in range(20)]  # 20 items of ~1 MB: each over 1 MiB
    body = msgpack.packb({"items": [{"text": t} for t in texts]})
    assert min(len(t.encode()) for t in texts) > 1024 * 1024 and len(body) > 20_000_000
    with httpx.Client(base_url=big_stack.base_url, timeout=180) as c:
        r = c.post(f"/v1/encode/{MINILM}", content=body, headers=MSGPACK)
    assert r.status_code == 200, r.text[:500]
    assert float(r.headers["x-payload-fetch-time"]) >= 0
    got = np.stack([nd(it["dense"]["values"]) for it in msgpack.unpackb(r.content)["items"]])
    want = st_model.encode([t[:5000] for t in texts])  # MiniLM reads the first 256 tokens
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert payload_files(big_stack) == []  # deleted once the request ended


def test_a_score_request_of_20_mb_is_one_item_by_reference(big_stack: Stack) -> None:
    items = [{"id": f"d{i}", "text": big_text(i, 200_000)} for i in range(100)]
    items[42] = {"id": "hit", "text": "Paris is the capital of France. " * 2000}
    body = msgpack.packb({"query": {"text": "capital of France"}, "items": items})
    with httpx.Client(base_url=big_stack.base_url, timeout=180) as c:
        r = c.post(f"/v1/score/{MINILM}", content=body, headers=MSGPACK)
    assert r.status_code == 200, r.text[:500]
    assert "x-payload-fetch-time" in r.headers
    scores = msgpack.unpackb(r.content)["scores"]
    assert len(scores) == 100 and scores[0]["item_id"] == "hit"


def test_results_of_20_mb_answer_200(big_stack: Stack, st_model: Any) -> None:
    texts = [big_text(i, 3000) for i in range(52)]  # 256 tokens x 384 x 4 B each: 20 MB
    body = {"items": [{"text": t} for t in texts], "params": {"output_types": ["multivector"]}}
    with httpx.Client(base_url=big_stack.base_url, timeout=180) as c:
        r = c.post(f"/v1/encode/{MINILM}", content=msgpack.packb(body), headers=MSGPACK)
    assert r.status_code == 200, r.text[:500]
    assert "x-payload-fetch-time" not in r.headers  # nothing went by reference
    items = msgpack.unpackb(r.content)["items"]
    mv = [nd(it["multivector"]["values"]) for it in items]
    assert sum(m.nbytes for m in mv) > 20_000_000
    want = st_model.encode(texts[:2], output_value="token_embeddings")
    for got, ref in zip(mv[:2], want, strict=True):
        ref = np.asarray(ref)
        ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
        np.testing.assert_allclose(got, ref, atol=1e-4)


@pytest.fixture(scope="module", params=["memory", "nats"])
def small_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A 96 KiB ``max_payload``: every 393 KB multivector result needs five chunks."""
    limit = 96 * 1024
    if request.param == "memory":
        with run_stack(preload=(MINILM,), bus_instance=MemoryBus(max_payload=limit)) as s:
            yield s
        return
    server = NatsServer(Path(tmp_path_factory.mktemp("nats-small")), max_payload=limit)
    server.start()
    try:
        with run_stack(preload=(MINILM,), bus="nats", nats_url=server.url) as s:
            yield s
    finally:
        server.stop()


def test_results_over_max_payload_travel_in_chunks(small_stack: Stack, st_model: Any) -> None:
    assert small_stack.running.bus.max_payload == 96 * 1024
    texts = [big_text(i, 3000) for i in range(6)]
    body = {
        "items": [{"text": t} for t in texts],
        "params": {"output_types": ["dense", "multivector"]},
    }
    with httpx.Client(base_url=small_stack.base_url, timeout=120) as c:
        r = c.post(f"/v1/encode/{MINILM}", content=msgpack.packb(body), headers=MSGPACK)
        assert r.status_code == 200, r.text[:500]
        items = msgpack.unpackb(r.content)["items"]
        dense = np.stack([nd(it["dense"]["values"]) for it in items])
        np.testing.assert_allclose(dense, st_model.encode(texts), atol=1e-5)
        assert all(nd(it["multivector"]["values"]).shape == (256, 384) for it in items)
        metrics = c.get("/metrics").text
    assert "sie_gateway_queue_result_chunk_reserved_bytes 0.0" in metrics


def test_a_reply_past_max_response_bytes_is_a_413_at_once(st_model: Any) -> None:
    """Found by a hostile trial: 380 long texts with multivector output made a 785 MB
    JSON reply. Results are counted as they arrive; past the bound the request stops."""
    texts = [big_text(i, 3000) for i in range(40)]  # 40 x 393 KB of multivector
    body = {"items": [{"text": t} for t in texts], "params": {"output_types": ["multivector"]}}
    with (
        run_stack(preload=(MINILM,), max_response_bytes=2 * 1024 * 1024) as s,
        httpx.Client(base_url=s.base_url, timeout=60) as c,
    ):
        r = c.post(f"/v1/encode/{MINILM}", json=body)
        assert r.status_code == 413, r.text[:300]
        assert r.json()["detail"]["code"] == "PAYLOAD_TOO_LARGE"
        assert "SIE_MAX_RESPONSE_BYTES" in r.json()["detail"]["message"]
        small = {**body, "items": body["items"][:3]}
        assert c.post(f"/v1/encode/{MINILM}", json=small).status_code == 200
