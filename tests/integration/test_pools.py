"""Pools over real HTTP (docs/pools.md; architecture §14, §16.3): the API's lifecycle
with a lease that runs out, routing headers read the same on every inference route,
and two gateways over NATS sharing pools through the JetStream key-value store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import MINILM, Stack, run_stack, wait_for

pytestmark = pytest.mark.slow

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
SPLADE = "rasyosef/splade-tiny"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with run_stack(preload=(MINILM, LLM)) as s:
        yield s


@pytest.fixture(scope="module")
def c(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        yield client


def test_the_pool_api_and_a_lease_that_runs_out(c: httpx.Client, stack: Stack) -> None:
    pools = c.get("/v1/pools").json()["pools"]
    assert pools[0]["spec"]["name"] == "default" and pools[0]["status"]["state"] == "active"
    worker = stack.settings.worker_id
    spec = {"name": "Lease-Test", "gpus": {"default": 1}, "ttl_seconds": 3}
    r = c.post("/v1/pools", json=spec)
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["spec"]["name"] == "lease-test" and info["spec"]["queue_pool"] == "default"
    assert info["status"]["state"] == "active"
    assert info["status"]["assigned_workers"] == [
        {"name": worker, "gpu": "default", "bundle": "default"}
    ]
    assert c.post("/v1/pools", json=spec).status_code == 200  # same spec: renewed
    other = c.post("/v1/pools", json={**spec, "gpus": {"default": 2}})
    assert other.status_code == 409 and other.json()["detail"]["code"] == "POOL_CONFLICT"
    assert c.get("/v1/pools/LEASE-TEST").json()["spec"]["name"] == "lease-test"
    assert [p["spec"]["name"] for p in c.get("/v1/pools").json()["pools"]] == [
        "default",
        "lease-test",
    ]
    # traffic for the pool runs while the lease is renewed
    body = {"items": [{"text": "pooled"}]}
    for _ in range(3):
        r = c.post(f"/v1/encode/{MINILM}", json=body, headers={"X-SIE-Pool": "lease-test"})
        assert r.status_code == 200, r.text
        renewed = c.post("/v1/pools/lease-test/renew")
        assert renewed.status_code == 200
        time.sleep(0.8)
    assert renewed.json()["status"]["last_renewed"] > info["status"]["last_renewed"]
    # not renewed: it expires, and its requests fail closed; the default pool serves
    wait_for(lambda: c.get("/v1/pools/lease-test").status_code == 404, timeout_s=10)
    r = c.post(f"/v1/encode/{MINILM}", json=body, headers={"X-SIE-Pool": "lease-test"})
    assert r.status_code == 404 and r.json()["detail"]["code"] == "POOL_NOT_FOUND"
    assert c.post(f"/v1/encode/{MINILM}", json=body).status_code == 200
    assert c.post("/v1/pools/lease-test/renew").status_code == 404


def test_pool_api_errors(c: httpx.Client) -> None:
    assert c.delete("/v1/pools/default").status_code == 403
    assert c.delete("/v1/pools/nope").status_code == 404
    assert c.get("/v1/pools/nope").json()["detail"]["code"] == "POOL_NOT_FOUND"
    r = c.get("/v1/pools/a.b")
    assert r.status_code == 400 and r.json()["detail"]["field"] == "name"
    for body, field in (
        ({"gpus": {"l4": 1}}, "name"),
        ({"name": "x", "gpus": {}}, "gpus"),
        ({"name": "x", "gpus": {"l4": 1}, "queue_pool": "undeclared"}, "queue_pool"),
        ({"name": "x", "gpus": {"l4": 1}, "pinned_models": ["no/such-model"]}, "pinned_models[0]"),
        ({"name": "default", "gpus": {"l4": 1}}, "name"),
    ):
        r = c.post("/v1/pools", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["detail"]["field"] == field, r.text
    r = c.post(
        "/v1/pools",
        json={"name": "pins", "gpus": {"l4": 1}, "pinned_models": [f"{MINILM}:default"]},
    )
    assert r.status_code == 201 and r.json()["spec"]["pinned_models"] == [MINILM]
    assert r.json()["status"]["state"] == "pending"  # no l4 worker here
    assert c.delete("/v1/pools/PINS").json() == {"name": "pins", "deleted": True}


ROUTES: dict[str, tuple[str, dict[str, Any], str]] = {
    "encode": (f"/v1/encode/{MINILM}", {"items": [{"text": "a"}]}, "sie"),
    "score": (
        f"/v1/score/{MINILM}",
        {"query": {"text": "q"}, "items": [{"text": "a"}, {"text": "b"}]},
        "sie",
    ),
    "extract": (
        "/v1/extract/nationaldesignstudio/rampart",
        {"items": [{"text": "Call John at 555-0100"}]},
        "sie",
    ),
    "embeddings": ("/v1/embeddings", {"model": MINILM, "input": "a"}, "openai"),
    "chat": (
        "/v1/chat/completions",
        {"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "openai",
    ),
}


def _code(r: httpx.Response, envelope: str) -> str:
    body = r.json()
    return str(body["error"]["code"] if envelope == "openai" else body["detail"]["code"])


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_route_reads_the_routing_headers_the_same(c: httpx.Client, route: str) -> None:
    path, body, envelope = ROUTES[route]
    assert c.post("/v1/pools", json={"name": "tenant", "gpus": {"default": 1}}).status_code in (
        200,
        201,
    )

    def post(headers: dict[str, str]) -> httpx.Response:
        deadline = time.monotonic() + 60
        while True:  # a cold model's first answer is MODEL_LOADING: retry like the SDK
            r = c.post(path, json=body, headers=headers)
            if r.headers.get("x-sie-error-code") != "MODEL_LOADING" or time.monotonic() > deadline:
                return r
            time.sleep(0.5)

    for headers in (
        {"X-SIE-Pool": "tenant"},
        {"X-SIE-Pool": "TENANT", "X-SIE-Machine-Profile": "Default"},
        {"X-SIE-Machine-Profile": "tenant/default"},  # the SDK's gpu="pool/profile"
        {"X-SIE-Pool": "default"},
    ):
        r = post(headers)
        assert r.status_code == 200, (headers, r.text)
    missing = post({"X-SIE-Pool": "no-such-pool"})
    assert missing.status_code == 404 and _code(missing, envelope).upper() == "POOL_NOT_FOUND"
    bad = post({"X-SIE-Pool": "a.b"})
    assert bad.status_code == 400
    clash = post({"X-SIE-Pool": "tenant", "X-SIE-Machine-Profile": "other/default"})
    assert clash.status_code == 400


def test_two_gateways_over_nats_share_pools(nats_server: Any) -> None:
    common = {"bus": "nats", "nats_url": nats_server.url, "config_poll_interval_s": 60}
    with (
        run_stack(preload=(MINILM,), **common) as first,
        run_stack(roles=("gateway",), wait_worker=False, **common) as second,
        httpx.Client(timeout=30) as c,
    ):
        wait_for(lambda: second.running.gateway.directory.live(), timeout_s=20)  # type: ignore[union-attr]
        r = c.post(f"{first.base_url}/v1/pools", json={"name": "shared", "gpus": {"default": 1}})
        assert r.status_code == 201, r.text
        seen = wait_for(
            lambda: (x := c.get(f"{second.base_url}/v1/pools/shared")).status_code == 200 and x,
            timeout_s=10,
        )
        assert seen.json()["status"] == c.get(f"{first.base_url}/v1/pools/shared").json()["status"]
        r = c.post(
            f"{second.base_url}/v1/encode/{MINILM}",
            json={"items": [{"text": "via the other gateway"}]},
            headers={"X-SIE-Pool": "shared"},
        )
        assert r.status_code == 200, r.text
        assert c.delete(f"{second.base_url}/v1/pools/shared").status_code == 200
        wait_for(lambda: c.get(f"{first.base_url}/v1/pools/shared").status_code == 404, 10)
        # both wrote the same store: a create racing a create yields one pool
        assert (
            c.post(
                f"{first.base_url}/v1/pools", json={"name": "raced", "gpus": {"default": 1}}
            ).status_code
            == 201
        )
        assert (
            c.post(
                f"{second.base_url}/v1/pools", json={"name": "raced", "gpus": {"default": 2}}
            ).status_code
            == 409
        )
        c.delete(f"{first.base_url}/v1/pools/raced")


def _series(text: str) -> set[str]:
    return {ln.split(" ")[0] for ln in text.splitlines() if ln.startswith("sie_gateway")}


def test_bogus_routing_headers_add_no_series_and_no_streams(c: httpx.Client, stack: Stack) -> None:
    """1,000 requests with distinct made-up pools and profiles: each is refused, and
    none creates a metric series, a pending-demand entry or a stream (issue 14)."""
    gw = stack.running.gateway
    assert gw is not None
    before_series = _series(c.get("/metrics").text)
    before_streams = set(stack.running.bus._streams)  # type: ignore[attr-defined]
    before_demand = dict(gw.lanes.pending_demand())
    codes: dict[int, int] = {}
    for i in range(1000):
        headers = (
            {"X-SIE-Pool": f"bogus-pool-{i}"}
            if i % 2
            else {"X-SIE-Machine-Profile": f"bogus-gpu-{i}"}
        )
        r = c.post(f"/v1/encode/{MINILM}", json={"items": [{"text": "a"}]}, headers=headers)
        codes[r.status_code] = codes.get(r.status_code, 0) + 1
    assert codes == {404: 500, 503: 500}, codes  # no pool; no worker, no lane
    assert _series(c.get("/metrics").text) == before_series
    assert set(stack.running.bus._streams) == before_streams  # type: ignore[attr-defined]
    assert gw.lanes.pending_demand() == before_demand


def test_a_declared_catalog_refuses_unknown_profiles_and_resolves_aliases() -> None:
    with (
        run_stack(
            preload=(MINILM,),
            configured_gpus=("default", "l4"),
            gpu_aliases=(("l4-spot", "l4"),),
        ) as s,
        httpx.Client(base_url=s.base_url, timeout=30) as c,
    ):
        body = {"items": [{"text": "a"}]}
        r = c.post(f"/v1/encode/{MINILM}", json=body, headers={"X-SIE-Machine-Profile": "h100"})
        assert r.status_code == 400 and r.json()["detail"]["field"] == "X-SIE-Machine-Profile"
        assert "l4" in r.json()["detail"]["message"]
        # the alias names the configured l4 lane: no worker yet, so PROVISIONING with
        # demand recorded for the autoscaler, on the canonical lane
        gw = s.running.gateway
        assert gw is not None
        wait_for(lambda: not gw.directory.in_startup_grace(), timeout_s=10)  # it knows now
        r = c.post(f"/v1/encode/{MINILM}", json=body, headers={"X-SIE-Machine-Profile": "L4-Spot"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "PROVISIONING"
        assert ("default", "l4", "default") in gw.lanes.pending_demand()
        assert c.post(f"/v1/encode/{MINILM}", json=body).status_code == 200


def test_a_pool_routes_to_its_workers_only_and_fails_closed_when_it_expires(
    nats_server: Any,
) -> None:
    """Issue 14 acceptance: two workers on different lanes over NATS; a pool created
    with a TTL sends its traffic to its assigned worker only, expires when not renewed,
    and its requests then fail closed while the default pool still serves."""
    common = {"bus": "nats", "nats_url": nats_server.url, "config_poll_interval_s": 60}
    with (
        run_stack(roles=("gateway", "config"), wait_worker=False, **common) as gw_stack,
        run_stack(
            roles=("worker",), preload=(MINILM,), machine_profile="l4", worker_id="w-l4", **common
        ),
        run_stack(
            roles=("worker",),
            preload=(MINILM,),
            machine_profile="a100",
            worker_id="w-a100",
            **common,
        ),
        httpx.Client(base_url=gw_stack.base_url, timeout=30) as c,
    ):
        gw = gw_stack.running.gateway
        assert gw is not None
        wait_for(lambda: {"w-l4", "w-a100"} <= {h.worker_id for h in gw.live_workers()}, 30)
        r = c.post("/v1/pools", json={"name": "gpu-tenant", "gpus": {"l4": 1}, "ttl_seconds": 3})
        assert r.status_code == 201, r.text
        assert [w["name"] for w in r.json()["status"]["assigned_workers"]] == ["w-l4"]
        body = {"items": [{"text": "for the tenant"}]}
        served: dict[str, int] = {}
        for _ in range(20):
            r = c.post(f"/v1/encode/{MINILM}", json=body, headers={"X-SIE-Pool": "gpu-tenant"})
            assert r.status_code == 200, r.text
            served[r.headers["x-sie-worker"]] = served.get(r.headers["x-sie-worker"], 0) + 1
        assert served == {"w-l4": 20}
        # the other lane serves its own traffic; the pool has no a100 capacity
        other = {"X-SIE-Pool": "default", "X-SIE-Machine-Profile": "a100"}
        r = c.post(f"/v1/encode/{MINILM}", json=body, headers=other)
        assert r.status_code == 200 and r.headers["x-sie-worker"] == "w-a100"
        r = c.post(
            f"/v1/encode/{MINILM}",
            json=body,
            headers={"X-SIE-Pool": "gpu-tenant", "X-SIE-Machine-Profile": "a100"},
        )
        assert r.status_code == 400
        # not renewed: expired, and its traffic fails closed; the default pool serves
        wait_for(lambda: c.get("/v1/pools/gpu-tenant").status_code == 404, timeout_s=10)
        r = c.post(f"/v1/encode/{MINILM}", json=body, headers={"X-SIE-Pool": "gpu-tenant"})
        assert r.status_code == 404 and r.json()["detail"]["code"] == "POOL_NOT_FOUND"
        assert c.post(f"/v1/encode/{MINILM}", json=body, headers=other).status_code == 200
