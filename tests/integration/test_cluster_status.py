"""The cluster status over real HTTP and websockets (docs/api.md §13; architecture §14):
the state document against ``/health`` and ``/v1/pools``, changes pushed on the stream,
auth on the page, the document and the stream (header or ``?token=``), and the stream
closed with 1001 when the gateway drains.

The websocket client is ``websocket-client`` (the ``dev`` extra).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websocket

from tests.conftest import MINILM, Stack, run_stack

pytestmark = pytest.mark.slow

USER, ADMIN = "status-user", "status-admin"
BEARER = {"Authorization": f"Bearer {USER}"}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with run_stack(preload=(MINILM,), auth_mode="token", auth_token=USER, admin_token=ADMIN) as s:
        yield s


def ws_url(stack: Stack, query: str = "") -> str:
    return stack.base_url.replace("http://", "ws://") + "/ws/cluster-status" + query


def refused(url: str, **kwargs: Any) -> websocket.WebSocketBadStatusException:
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(url, timeout=5, **kwargs)
    return info.value


def test_the_state_document(stack: Stack) -> None:
    state = httpx.get(f"{stack.base_url}/v1/cluster/status", headers=BEARER).json()
    assert set(state) == {
        "generated_at",
        "version",
        "router_id",
        "uptime_s",
        "workers",
        "models",
        "pools",
        "lanes",
        "capacity",
    }
    assert abs(state["generated_at"] - time.time()) < 5
    [worker] = state["workers"]
    assert worker["worker_id"] == stack.settings.worker_id
    assert worker["status"] == "ready" and worker["healthy"] is True
    assert (worker["pool"], worker["machine_profile"], worker["bundle"]) == (
        "default",
        "default",
        "default",
    )
    assert worker["loaded_models"] == [MINILM]
    assert worker["queue_depth"] is None and worker["last_seen_s"] < 5
    models = {m["model_id"]: m for m in state["models"]}
    assert models[MINILM]["state"] == "loaded" and models[MINILM]["loaded_on"] == 1
    assert models[MINILM]["workers"] == [{"worker_id": worker["worker_id"], "state": "loaded"}]
    assert models["rasyosef/splade-tiny"]["state"] == "available"
    assert state["lanes"] == [
        {
            "pool": "default",
            "machine_profile": "default",
            "bundle": "default",
            "workers": 1,
            "ready_workers": 1,
            "in_flight": 0,
            "pending_demand": 0,
        }
    ]
    pools = httpx.get(f"{stack.base_url}/v1/pools", headers=BEARER).json()["pools"]
    assert state["pools"] == pools
    health = httpx.get(f"{stack.base_url}/health", headers=BEARER).json()
    assert state["capacity"] == {
        k: health[k] for k in ("configured_gpu_types", "live_gpu_types", "cluster")
    }
    assert state["capacity"]["cluster"]["models_loaded"] == 1


def test_the_stream_pushes_each_change_once(stack: Stack) -> None:
    ws = websocket.create_connection(ws_url(stack), header=[f"Authorization: Bearer {USER}"])
    try:
        first = json.loads(ws.recv())
        assert [p["spec"]["name"] for p in first["pools"]] == ["default"]
        spec = {"name": "status-pool", "gpus": {"default": 1}, "ttl_seconds": 600}
        r = httpx.post(
            f"{stack.base_url}/v1/pools", json=spec, headers={"Authorization": f"Bearer {ADMIN}"}
        )
        assert r.status_code == 201, r.text
        started = time.monotonic()
        ws.settimeout(5)
        changed = json.loads(ws.recv())
        assert time.monotonic() - started < 3  # polled every second
        pool = next(p for p in changed["pools"] if p["spec"]["name"] == "status-pool")
        assert pool["status"]["expires_at"] == pytest.approx(time.time() + 600, abs=10)
        ws.settimeout(2.5)  # nothing changed: nothing sent (the keepalive is 15 s)
        with pytest.raises(websocket.WebSocketTimeoutException):
            ws.recv()
        ws.send("anything the client sends is dropped")
        ws.settimeout(5)
        assert httpx.delete(
            f"{stack.base_url}/v1/pools/status-pool", headers={"Authorization": f"Bearer {ADMIN}"}
        ).is_success
        gone = json.loads(ws.recv())
        assert [p["spec"]["name"] for p in gone["pools"]] == ["default"]
    finally:
        ws.close()


def test_auth_on_the_page_the_document_and_the_stream(stack: Stack) -> None:
    base = stack.base_url
    assert httpx.get(f"{base}/v1/cluster/status").status_code == 401
    assert httpx.get(f"{base}/v1/cluster/status?token={USER}").status_code == 401  # header only
    assert httpx.get(f"{base}/v1/cluster/status", headers=BEARER).status_code == 200
    # the page: a browser can only pass the token in the URL
    assert httpx.get(f"{base}/").status_code == 401
    assert httpx.get(f"{base}/?token=wrong").status_code == 401
    page = httpx.get(f"{base}/?token={USER}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert httpx.get(f"{base}/", headers=BEARER).status_code == 200
    # the stream: refused before the handshake with the HTTP error answer
    for kwargs in ({}, {"header": ["Authorization: Bearer wrong"]}):
        err = refused(ws_url(stack), **kwargs)
        assert err.status_code == 401
        assert err.resp_headers["www-authenticate"] == "Bearer"
        assert json.loads(err.resp_body)["detail"]["code"] == "UNAUTHORIZED"
    assert refused(ws_url(stack, "?token=wrong")).status_code == 401
    for url, kwargs in (
        (ws_url(stack, f"?token={USER}"), {}),
        (ws_url(stack, f"?token={ADMIN}"), {}),
        (ws_url(stack), {"header": [f"Authorization: Bearer {USER}"]}),
    ):
        ws = websocket.create_connection(url, timeout=5, **kwargs)
        try:
            assert json.loads(ws.recv())["workers"]
        finally:
            ws.close()


def test_the_page_loads_nothing_from_elsewhere(stack: Stack) -> None:
    page = httpx.get(f"{stack.base_url}/", headers=BEARER)
    html = page.text
    assert re.findall(r"""(?:src|href)=["'](?!data:)""", html) == []
    assert "http://" not in html and "https://" not in html and "@import" not in html
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "unsafe-inline" not in csp  # the inline script and style are allowed by hash
    assert page.headers["cache-control"] == "no-store"
    for marker in ('id="workers"', 'id="models"', 'id="pools"', 'id="lanes"', 'id="connection"'):
        assert marker in html


def test_the_stream_closes_when_the_gateway_drains() -> None:
    with run_stack(roles=("gateway", "config"), wait_worker=False) as s:
        ws = websocket.create_connection(ws_url(s), timeout=5)
        state = json.loads(ws.recv())
        assert state["workers"] == [] and state["lanes"] == []
        s.portal.call(s.shutdown.set)
        started = time.monotonic()
        frame = ws.recv_data_frame(control_frame=True)[1]
        assert frame.opcode == websocket.ABNF.OPCODE_CLOSE
        assert int.from_bytes(frame.data[:2], "big") == 1001  # going away
        assert time.monotonic() - started < 3
        ws.close()
