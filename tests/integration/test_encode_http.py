"""/v1/encode over real HTTP (hypercorn) through the in-memory bus, with real MiniLM.

architecture §2, §16.2; reference §1.5 (shapes), §1.2 (msgpack/numpy).
"""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import msgpack
import msgpack_numpy
import numpy as np
import pytest

from tests.conftest import MINILM, Stack, wait_for

pytestmark = pytest.mark.slow

URL = f"/v1/encode/{MINILM}"
TEXTS = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Embeddings map text to vectors.",
    "hello",
]


@pytest.fixture(scope="module")
def client(stack: Stack) -> httpx.Client:
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def dense(resp: httpx.Response) -> np.ndarray:
    return np.array([it["dense"]["values"] for it in resp.json()["items"]], dtype=np.float32)


def test_vectors_equal_sentence_transformers(client: httpx.Client, st_model: object) -> None:
    resp = client.post(
        URL, json={"items": [{"id": f"i{i}", "text": t} for i, t in enumerate(TEXTS)]}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == MINILM
    assert [it["id"] for it in body["items"]] == ["i0", "i1", "i2", "i3"]
    assert all(
        it["dense"]["dims"] == 384 and it["dense"]["dtype"] == "float32" for it in body["items"]
    )
    got = dense(resp)
    assert got.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    expected = st_model.encode(TEXTS)  # type: ignore[attr-defined]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_response_headers(client: httpx.Client) -> None:
    resp = client.post(URL, json={"items": [{"text": "headers"}]})
    h = resp.headers
    assert h["x-sie-version"] and h["x-sie-server-version"]
    assert len(h["x-sie-request-id"]) == 36
    assert h["x-sie-worker"].startswith("worker-test-")
    for name in ("x-queue-time", "x-inference-time", "x-tokenization-time", "x-queue-publish-time"):
        assert float(h[name]) >= 0.0
    assert "id" not in resp.json()["items"][0]  # no id in, no id out


def test_json_and_msgpack_parity(client: httpx.Client) -> None:
    payload = {"items": [{"id": "a", "text": t} for t in TEXTS]}
    as_json = client.post(URL, json=payload)
    as_msgpack = client.post(
        URL,
        content=msgpack.packb(payload),
        headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
    )
    assert as_msgpack.status_code == 200
    assert as_msgpack.headers["content-type"] == "application/msgpack"
    decoded = msgpack.unpackb(as_msgpack.content, object_hook=msgpack_numpy.decode, raw=False)
    arr = np.stack([it["dense"]["values"] for it in decoded["items"]])
    assert arr.dtype == np.float32
    np.testing.assert_allclose(arr, dense(as_json), atol=1e-6)
    assert decoded["items"][0]["dense"]["dims"] == 384 and decoded["items"][0]["id"] == "a"


def test_order_preserved_under_32_concurrent_requests(
    client: httpx.Client, stack: Stack, st_model: object
) -> None:
    texts = [f"request number {i} " + "word " * (i % 7) for i in range(32)]
    expected = st_model.encode(texts)  # type: ignore[attr-defined]

    def call(i: int) -> tuple[int, np.ndarray, list[str]]:
        with httpx.Client(base_url=stack.base_url, timeout=60) as c:
            items = [{"id": f"{i}-{j}", "text": texts[(i + j) % 32]} for j in range(3)]
            r = c.post(URL, json={"items": items})
            assert r.status_code == 200, r.text
            return i, dense(r), [it["id"] for it in r.json()["items"]]

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(call, range(32)))
    for i, vecs, ids in results:
        assert ids == [f"{i}-{j}" for j in range(3)]
        for j in range(3):
            np.testing.assert_allclose(vecs[j], expected[(i + j) % 32], atol=1e-5)


def test_templates_and_default_profile(client: httpx.Client, st_model: object) -> None:
    r = client.post(
        URL,
        json={
            "items": [{"text": "bread"}],
            "params": {
                "is_query": True,
                "options": {"profile": "default", "query_template": "query: {text}"},
            },
        },
    )
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(dense(r)[0], st_model.encode(["query: bread"])[0], atol=1e-5)  # type: ignore[attr-defined]
    r = client.post(
        URL, json={"items": [{"text": "bread"}], "params": {"instruction": "Represent:"}}
    )
    np.testing.assert_allclose(dense(r)[0], st_model.encode(["Represent: bread"])[0], atol=1e-5)  # type: ignore[attr-defined]


def test_options_and_query_flag_accepted(client: httpx.Client) -> None:
    r = client.post(
        URL,
        json={
            "items": [{"text": "q"}],
            "params": {"is_query": True, "output_types": ["dense"], "options": {"normalize": True}},
        },
    )
    assert r.status_code == 200, r.text


def test_models_endpoints(client: httpx.Client) -> None:
    listing = client.get("/v1/models").json()
    assert [m["id"] for m in listing["data"]] == sorted(
        [
            MINILM,
            f"{MINILM}:onnx",
            f"{MINILM}:onnx-int8",
            f"{MINILM}:fastest",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "nationaldesignstudio/rampart",
            "rasyosef/splade-tiny",
            "rasyosef/splade-tiny:onnx",
        ]
    )
    info = client.get(f"/v1/models/{MINILM}").json()
    assert info["name"] == MINILM and info["dims"] == {"dense": 384, "multivector": 384}
    assert info["outputs"] == ["dense", "multivector", "score"]
    assert info["inputs"] == ["text"] and info["max_sequence_length"] == 256
    assert info["loaded"] is True and info["state"] == "loaded"
    assert info["profiles"] == {
        "default": {"is_default": True},
        "onnx": {"is_default": False},
        "onnx-int8": {"is_default": False},
        "fastest": {"is_default": False},
    }
    missing = client.get("/v1/models/nope/nothing")
    assert missing.status_code == 404
    # SIE's detail beside OpenAI's error (docs/api.md §7); nothing is close to this id
    assert missing.json() == {
        "detail": {
            "code": "MODEL_NOT_FOUND",
            "message": "model 'nope/nothing' not found",
            "model": "nope/nothing",
            "suggestions": [],
        },
        "error": {
            "message": "model 'nope/nothing' not found",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
            "suggestions": [],
        },
    }


def test_health_probes(client: httpx.Client) -> None:
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").text == "ok"
    h = client.get("/health").json()
    assert h["type"] == "gateway" and h["status"] == "healthy"
    (w,) = h["workers"]
    assert w["ready"] and w["bundle"] == "default" and len(w["bundle_config_hash"]) == 64
    mini = next(m for m in w["models"] if m["name"] == MINILM)
    assert mini["state"] == "loaded" and mini["loads"] == 1 and mini["bytes"] > 80_000_000


def test_metrics(client: httpx.Client) -> None:
    client.post(URL, json={"items": [{"text": "count me"}]})
    text = client.get("/metrics").text
    assert "sie_requests_total" in text and "sie_batch_size_bucket" in text


BAD = [
    (
        "malformed json",
        {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
        400,
        "INVALID_PAYLOAD",
        "body",
    ),
    (
        "malformed msgpack",
        {"content": b"\xc1\xc1", "headers": {"Content-Type": "application/msgpack"}},
        400,
        "INVALID_PAYLOAD",
        None,
    ),
    ("empty body", {"content": b""}, 400, "INVALID_PAYLOAD", "body"),
    ("missing items", {"json": {"params": {}}}, 400, "INVALID_INPUT", "items"),
    ("empty items", {"json": {"items": []}}, 400, "INVALID_INPUT", "items"),
    ("items not a list", {"json": {"items": "text"}}, 400, "INVALID_INPUT", "items"),
    (
        "non-string text",
        {"json": {"items": [{"text": "ok"}, {"text": 42}]}},
        400,
        "INVALID_INPUT",
        "items[1].text",
    ),
    ("missing text", {"json": {"items": [{"id": "x"}]}}, 400, "INVALID_INPUT", "items[0].text"),
    (
        "unknown output type",
        {"json": {"items": [{"text": "a"}], "params": {"output_types": ["holographic"]}}},
        400,
        "INVALID_INPUT",
        "params.output_types[0]",
    ),
    (
        "unsupported output type",
        {"json": {"items": [{"text": "a"}], "params": {"output_types": ["sparse"]}}},
        400,
        "INVALID_INPUT",
        "params.output_types",
    ),
    ("body not an object", {"json": [1, 2]}, 400, "INVALID_INPUT", "body"),
    (
        "lone surrogate in id",
        {"content": b'{"items": [{"id": "\\udfff", "text": "ok"}]}'},
        400,
        "INVALID_INPUT",
        "items[0].id",
    ),
    (
        "lone surrogate in text",
        {"content": b'{"items": [{"text": "a\\ud800b"}]}'},
        400,
        "INVALID_INPUT",
        "items[0].text",
    ),
    (
        "64-bit overflow in options",
        {
            "content": b'{"items": [{"text": "a"}], "params": {"options": {"x": 123456789012345678901234567890}}}'
        },
        400,
        "INVALID_INPUT",
        "params.options",
    ),
    (
        "deeply nested json",
        {
            "content": b"[" * 100_000 + b"]" * 100_000,
            "headers": {"Content-Type": "application/json"},
        },
        400,
        "INVALID_PAYLOAD",
        "body",
    ),
    (
        "fake numpy map in msgpack",
        {
            "content": msgpack.packb(
                {"items": [{"text": {"nd": False, "type": "<f4", "kind": b"", "data": b""}}]}
            ),
            "headers": {"Content-Type": "application/msgpack"},
        },
        400,
        "INVALID_PAYLOAD",
        None,
    ),
    (
        "bad template field",
        {
            "json": {
                "items": [{"text": "a"}],
                "params": {"is_query": True, "options": {"query_template": "q: {foo}"}},
            }
        },
        400,
        "INVALID_INPUT",
        "params.options.query_template",
    ),
    (
        "positional template",
        {"json": {"items": [{"text": "a"}], "params": {"options": {"doc_template": "{} {text}"}}}},
        400,
        "INVALID_INPUT",
        "params.options.doc_template",
    ),
    (
        "options.output_types not a list",
        {"json": {"items": [{"text": "a"}], "params": {"options": {"output_types": 5}}}},
        400,
        "INVALID_INPUT",
        "params.options.output_types",
    ),
    (
        "options.normalize not a bool",
        {"json": {"items": [{"text": "a"}], "params": {"options": {"normalize": "yes"}}}},
        400,
        "INVALID_INPUT",
        "params.options.normalize",
    ),
    (
        "unknown profile",
        {"json": {"items": [{"text": "a"}], "params": {"options": {"profile": "turbo"}}}},
        400,
        "INVALID_INPUT",
        "params.options.profile",
    ),
    (
        "output_dtype unknown",
        {"json": {"items": [{"text": "a"}], "params": {"output_dtype": "int4"}}},
        400,
        "INVALID_INPUT",
        "params.output_dtype",
    ),
]


@pytest.mark.parametrize(
    ("name", "kwargs", "status", "code", "field"), BAD, ids=[b[0] for b in BAD]
)
def test_bad_input(
    client: httpx.Client, name: str, kwargs: dict, status: int, code: str, field: str | None
) -> None:
    r = client.post(URL, **kwargs)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert detail["code"] == code
    if field is not None:
        assert detail["field"] == field and field.split("[")[0].split(".")[0] in detail["message"]


def test_lane_headers(client: httpx.Client) -> None:
    bad = client.post(URL, json={"items": [{"text": "a"}]}, headers={"X-SIE-Pool": "a.b"})
    assert bad.status_code == 400 and bad.json()["detail"]["field"] == "X-SIE-Pool"
    bad = client.post(
        URL, json={"items": [{"text": "a"}]}, headers={"X-SIE-Machine-Profile": "l4 spot"}
    )
    assert bad.status_code == 400 and bad.json()["detail"]["field"] == "X-SIE-Machine-Profile"
    ok = client.post(
        URL,
        json={"items": [{"text": "a"}]},
        headers={"X-SIE-Pool": "DEFAULT", "X-SIE-Machine-Profile": "Default"},
    )
    assert ok.status_code == 200  # canonicalised to lower case: the worker's lane


def test_error_responses_carry_ids_and_plain_words(client: httpx.Client) -> None:
    r = client.post(URL, json=[1])
    assert r.json()["detail"]["message"] == "body: expected an object"
    assert len(r.headers["x-sie-request-id"]) == 36 and r.headers["x-sie-version"]
    nf = client.get("/v1/nothing")
    assert nf.headers["x-sie-error-code"] == "NOT_FOUND"
    bad = client.post(URL, content=b"\xc1", headers={"Content-Type": "application/msgpack"})
    assert bad.json()["detail"]["message"].startswith("malformed msgpack body: ")
    assert len(bad.json()["detail"]["message"]) > len("malformed msgpack body: ")


@pytest.mark.parametrize(
    ("model", "offers"),
    [("nationaldesignstudio/rampart", "json"), ("HuggingFaceTB/SmolLM2-135M-Instruct", "text")],
)
def test_a_model_without_an_encode_task_is_named(
    client: httpx.Client, model: str, offers: str
) -> None:
    r = client.post(f"/v1/encode/{model}", json={"items": [{"text": "a"}]})
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert detail["code"] == "INVALID_INPUT" and detail["field"] == "model"
    assert "does not support encoding" in detail["message"] and offers in detail["message"]


def test_unknown_model_and_route(client: httpx.Client) -> None:
    r = client.post("/v1/encode/no/such-model", json={"items": [{"text": "a"}]})
    assert r.status_code == 404 and r.json()["detail"]["code"] == "MODEL_NOT_FOUND"
    assert client.get("/v1/nothing").json()["detail"]["code"] == "NOT_FOUND"
    assert client.get(URL).status_code == 405


def test_worker_survives_bad_input_and_poison_work(client: httpx.Client, stack: Stack) -> None:
    from sie.core.subjects import inbox_subject, work_subject
    from sie.core.wire import WorkItem, WorkResult, packb

    bus = stack.running.bus
    subject = work_subject("default", "default", "default", MINILM)

    def item(rid: str, **kw: object) -> WorkItem:
        reply = inbox_subject("probe", rid)
        return WorkItem(
            f"{rid}.0", rid, 0, 1, "encode", MINILM, "default", "default", "probe", reply, **kw
        )  # type: ignore[arg-type]

    def probe(rid: str, payload: bytes) -> WorkResult:
        async def go() -> WorkResult:
            sub = await bus.subscribe(inbox_subject("probe", rid))
            await bus.js_publish(subject, payload)
            msg = await sub.next_msg(10)
            await sub.unsubscribe()
            return WorkResult.from_bytes(msg.data)

        return stack.portal.call(go)

    stack.portal.call(bus.js_publish, subject, b"\xc1 not msgpack")  # undecodable: terminated
    non_string = probe("p1", item("p1", item={"text": 7}).to_bytes())
    assert not non_string.success and non_string.error_code == "INVALID_INPUT"
    odd_options = probe(
        "p2", item("p2", item={"text": "x"}, options={"output_types": 5}).to_bytes()
    )
    assert not odd_options.success and odd_options.error_code == "INVALID_INPUT"
    raw = item("p3").to_map()
    raw["operation"] = 5  # undecodable as a WorkItem, but its reply fields are intact
    salvaged = probe("p3", packb(raw))
    assert (
        not salvaged.success
        and salvaged.error_code == "INVALID_PAYLOAD"
        and salvaged.item_index == 0
    )
    assert client.post(URL, json={"items": [{"text": "still alive"}]}).status_code == 200


def test_numpy_option_values_do_not_crash_the_worker(client: httpx.Client) -> None:
    """A msgpack array inside options once killed the process (unhashable batch key)."""
    body = msgpack.packb(
        {"items": [{"text": "a"}, {"text": "b"}], "params": {"options": {"x": np.arange(3)}}},
        default=msgpack_numpy.encode,
    )
    for _ in range(2):
        r = client.post(URL, content=body, headers={"Content-Type": "application/msgpack"})
        assert r.status_code == 200, r.text
    assert client.post(URL, json={"items": [{"text": "alive"}]}).status_code == 200


def test_huge_texts_stay_cheap(client: httpx.Client, st_model: object) -> None:
    """Clipped to the model window off the event loop; probes keep answering meanwhile."""
    import threading
    import time

    text = "word " * 190_000  # 950k chars, under the default 1M-character cap
    done: list[httpx.Response] = []
    t = threading.Thread(
        target=lambda: done.append(client.post(URL, json={"items": [{"text": text}]}, timeout=60))
    )
    t0 = time.monotonic()
    t.start()
    with httpx.Client(base_url=str(client.base_url), timeout=5) as probe:
        assert probe.get("/healthz").text == "ok"
    t.join(60)
    assert done[0].status_code == 200 and time.monotonic() - t0 < 20
    np.testing.assert_allclose(dense(done[0])[0], st_model.encode(["word " * 300])[0], atol=1e-5)  # type: ignore[attr-defined]
    over = client.post(URL, json={"items": [{"text": "x"}, {"text": "y" * 1_000_001}]})
    assert over.status_code == 400 and over.json()["detail"]["field"] == "items[1].text"


@pytest.mark.parametrize("bus", ["memory", "nats"])
def test_abandoned_request_is_dropped_by_the_worker(
    bus: str, request: pytest.FixtureRequest
) -> None:
    """A timed-out request publishes work_cancel; the worker stops its remaining items (§8),
    on both buses."""
    import time

    from sie.core.subjects import stream_name
    from sie.roles.gateway.collect import REQUEST_WINDOW_ITEMS
    from tests.conftest import run_stack

    extra = (
        {"bus": "nats", "nats_url": request.getfixturevalue("nats_server").url}
        if bus == "nats"
        else {}
    )
    with (
        run_stack(preload=(MINILM,), request_timeout_s=0.5, max_batch_requests=1, **extra) as s,
        httpx.Client(base_url=s.base_url, timeout=30) as c,
    ):

        def cancelled() -> float:
            return s.metrics.work_items.labels(MINILM, "cancelled")._value.get()

        before = cancelled()
        # ~3 s of work at batch 1, and within one request's publishing window
        # (REQUEST_WINDOW_ITEMS), so every item is on the stream when the cancel comes
        items = [{"text": f"item {i} " + "long text " * 120} for i in range(120)]
        assert len(items) <= REQUEST_WINDOW_ITEMS
        r = c.post(URL, json={"items": items})
        assert r.status_code == 504
        bus_ = s.running.bus

        async def backlog() -> int:  # work queue: settled items leave the stream
            return (await bus_.stream_info(stream_name("default"))).messages

        deadline = time.monotonic() + 4
        while s.portal.call(backlog) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.portal.call(backlog) == 0
        assert cancelled() - before >= 90  # three quarters of the request, as before
        assert c.post(URL, json={"items": [{"text": "next"}]}).status_code == 200


def test_body_limit() -> None:
    from tests.conftest import run_stack

    with (
        run_stack(roles=("gateway",), max_body_bytes=64, max_items_per_request=2) as s,
        httpx.Client(base_url=s.base_url) as c,
    ):
        big = c.post(URL, json={"items": [{"text": "x" * 100}]})
        assert big.status_code == 413 and big.json()["detail"]["code"] == "PAYLOAD_TOO_LARGE"
        many = c.post(URL, content=json.dumps({"items": [{"text": ""}] * 3}))
        assert many.status_code == 400 and many.json()["detail"]["field"] == "items"


def test_no_worker_for_the_lane() -> None:
    """Inside the start-up grace a request is queued and times out (504); after it, the
    gateway knows no worker serves the lane and answers 503 PROVISIONING at once (§2)."""

    from tests.conftest import run_stack

    with (
        run_stack(
            roles=("gateway",),
            request_timeout_s=0.5,
            heartbeat_interval_s=0.3,
            configured_gpus=("l4",),  # the lane catalog: l4 is a lane that can scale up
        ) as s,
        httpx.Client(base_url=s.base_url) as c,
    ):
        r = c.post(URL, json={"items": [{"text": "nobody home"}]})
        assert r.status_code == 504
        assert (
            r.headers["retry-after"] == "5" and r.headers["x-sie-error-code"] == "GATEWAY_TIMEOUT"
        )
        assert r.json()["error"]["code"] == "GATEWAY_TIMEOUT"
        gw = s.running.gateway
        assert gw is not None  # past its start-up grace, the gateway knows nobody serves
        wait_for(lambda: not gw.lane_served("default", "default", "default"), timeout_s=5)
        r = c.post(URL, json={"items": [{"text": "nobody home"}]})
        # 503 at once (a wait would have ended in 504), retry after a minute
        assert r.status_code == 503 and r.headers["retry-after"] == "60"
        assert (
            r.json()["error"]["code"] == "PROVISIONING" and r.json()["error"]["bundle"] == "default"
        )
        h = c.get("/health").json()
        assert h["status"] == "degraded" and h["workers"] == []
        # pending demand for the exact lane, for the autoscaler (§2), on /metrics
        gw = s.running.gateway
        assert gw is not None
        assert gw.lanes.pending_demand() == {("default", "default", "default"): 1}
        c.post(URL, json={"items": [{"text": "again"}]}, headers={"X-SIE-Machine-Profile": "L4"})
        assert gw.lanes.pending_demand() == {
            ("default", "default", "default"): 1,
            ("default", "l4", "default"): 1,
        }
        text = c.get("/metrics").text
        lane = 'bundle="default",machine_profile="l4",pool="default"'
        assert f"sie_gateway_pending_demand{{{lane}}} 1.0" in text
        assert f'sie_gateway_rejected_requests_total{{{lane},reason="provisioning"}} 1.0' in text


def test_unserved_machine_profile_is_provisioning(client: httpx.Client, stack: Stack) -> None:
    import time

    gw = stack.running.gateway
    assert gw is not None
    while gw.directory.in_startup_grace():
        time.sleep(0.1)
    r = client.post(URL, json={"items": [{"text": "a"}]}, headers={"X-SIE-Machine-Profile": "h100"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "PROVISIONING"
    # a pool that does not exist fails closed (docs/pools.md), it is not provisioned
    r = client.post(URL, json={"items": [{"text": "a"}]}, headers={"X-SIE-Pool": "tenant-a"})
    assert r.status_code == 404 and r.json()["detail"]["code"] == "POOL_NOT_FOUND"
