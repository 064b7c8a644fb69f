"""Abandonment within a second (issue 13 item 2; docs/architecture.md §2): a client that
closes its connection while the gateway waits for results cancels its request; workers
drop its remaining items wherever they are, and later requests do not wait behind them.
Default settings, every role in one process, real HTTP.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest

from sie.core.subjects import stream_name, work_subject
from tests.conftest import MINILM, Stack, run_stack, wait_for

pytestmark = pytest.mark.slow

CLIENTS = 20
ITEMS = 4096


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with run_stack(preload=(MINILM,)) as s:
        yield s


def _send_and_leave(base_url: str, body: bytes) -> socket.socket:
    u = urlparse(base_url)
    sock = socket.create_connection((u.hostname, u.port), timeout=10)
    head = (
        f"POST /v1/encode/{MINILM} HTTP/1.1\r\nHost: {u.hostname}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


#: A subject of the pool's stream that no worker's lane filter matches: a probe there
#: stays in the stream, so the stream holding one message means all else was settled.
PROBE = work_subject("default", "probe-profile", "default", MINILM)


def _published(stack: Stack) -> int:
    return stack.portal.call(stack.running.bus.js_publish, PROBE, b"probe").seq


def _stored(stack: Stack) -> int:
    return stack.portal.call(stack.running.bus.stream_info, stream_name("default")).messages


def _items(stack: Stack, outcome: str) -> float:
    value = stack.metrics.registry.get_sample_value(
        "sie_worker_items_total", {"model": MINILM, "outcome": outcome}
    )
    return value or 0.0


def test_abandoned_requests_are_dropped_and_a_small_one_is_served_at_once(stack: Stack) -> None:
    texts = [f"abandoned text number {i} with a few more words in it" for i in range(ITEMS)]
    body = json.dumps({"items": [{"text": t} for t in texts]}).encode()
    success_before, cancelled_before = _items(stack, "success"), _items(stack, "cancelled")
    _published(stack)  # the probe: a message no lane consumes stays in the stream
    gw = stack.running.gateway
    assert gw is not None
    socks = [_send_and_leave(stack.base_url, body) for _ in range(CLIENTS)]
    time.sleep(0.5)  # the scenario: each client gives up after half a second...
    # ...once the requests are on the workers, so the drop is the workers' to make. The
    # stream holds at most SIE_GATEWAY_MAX_STREAM_PENDING (50,000) items: past that,
    # requests are refused (503 QUEUE_FULL) before anything is published.
    wait_for(lambda: sum(gw.lanes.in_flight.values()) >= 40_000, timeout_s=20)
    for s in socks:
        s.close()
    t0 = time.monotonic()
    r = httpx.post(
        f"{stack.base_url}/v1/encode/{MINILM}",
        json={"items": [{"text": "still served"}]},
        timeout=30,
    )
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    # under 1 s (issue 13); measured here 0.12-0.24 s (it was a 504 after 30 s)
    assert took < 1.0, f"a one-item request took {took:.2f}s behind abandoned work"
    # the gateway let go of every abandoned request
    wait_for(lambda: sum(gw.lanes.in_flight.values()) == 0, timeout_s=10)
    # nothing is left stored or running for nobody: the stream holds only the probe,
    # the worker settles no more items, and what it settled for the abandoned requests
    # is counted as dropped (cancelled), not computed
    wait_for(lambda: _stored(stack) == 1, timeout_s=30)
    settled = _items(stack, "success") + _items(stack, "cancelled")
    time.sleep(1.0)  # a negative check: nothing more is computed for the abandoned requests
    assert _items(stack, "success") + _items(stack, "cancelled") == settled
    cancelled = _items(stack, "cancelled") - cancelled_before
    computed = _items(stack, "success") - success_before - 1  # less the small request
    # 20 x 4096 items were sent: at most a fraction of one request was computed before
    # its cancel arrived; whatever the workers had received of the rest they dropped
    assert computed < ITEMS / 4, (computed, cancelled)
