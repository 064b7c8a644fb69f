"""Shutdown drain (issue 2 "Container and CLI"; architecture §2): requests in flight
when the drain bound nears answer a structured 503, and the config listener stays up
while the gateway drains (co-located pollers read it)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.conftest import MINILM, run_stack, wait_for

pytestmark = pytest.mark.slow


def test_requests_cut_by_the_drain_bound_get_503_shutting_down() -> None:
    drain_s = 3.0
    with run_stack(preload=(MINILM,), drain_timeout_s=drain_s) as s:
        url = f"{s.base_url}/v1/encode/{MINILM}"
        # far more work than the drain allows on 2 cores: 1500 texts of ~200 tokens
        body = {"items": [{"text": f"item {i} " + "word " * 200} for i in range(1500)]}
        got: list[httpx.Response] = []
        sent = threading.Event()

        def slow() -> None:
            sent.set()
            got.append(httpx.post(url, json=body, timeout=60))

        t = threading.Thread(target=slow)
        t.start()
        assert sent.wait(5)
        gw = s.running.gateway
        assert gw is not None
        # the request is admitted and its items are on their way to the workers
        wait_for(lambda: sum(gw.lanes.in_flight.values()) > 0, timeout_s=20)
        t0 = time.monotonic()
        s.portal.call(s.shutdown.set)
        wait_for(lambda: s.running.apps["gateway"].state.draining, timeout_s=5)
        # mid-drain: the config listener still answers (the gateway's poller uses it)
        cport = s.running.config_port
        assert httpx.get(f"http://127.0.0.1:{cport}/v1/configs/epoch", timeout=5).status_code == 200
        t.join(30)
        elapsed = time.monotonic() - t0
    assert got, "the request never returned"
    r = got[0]
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "5"
    err = r.json()["error"]  # the 5xx envelope (architecture §2)
    assert err["code"] == "SHUTTING_DOWN" and "shutting down" in err["message"]
    assert elapsed < drain_s + 1.0  # answered before the bound, not cut by the server
