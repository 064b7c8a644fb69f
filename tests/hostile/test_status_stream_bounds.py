"""Hostile clients of the status stream and the pool API (docs/security.md, docs/pools.md),
found by an attack on them: a websocket message that never ends must not grow the
process; another site's page may not open the stream; a client that stops reading
loses its stream; pool writes need a JSON or msgpack body (no cross-site form posts);
a capped pool with no live worker answers at once; an access line cannot be forged."""

from __future__ import annotations

import base64
import logging
import os
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import pytest
import websocket  # websocket-client

from sie.http import status
from tests.conftest import MINILM, Stack, run_stack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with run_stack(preload=(MINILM,)) as s:
        yield s


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _handshake(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws/cluster-status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head[:200]
    return sock


def test_a_websocket_message_that_never_ends_costs_no_memory(stack: Stack) -> None:
    port = int(stack.base_url.rsplit(":", 1)[1])
    sock = _handshake(port)
    before = _rss_bytes()
    # one text frame declaring 2**40 bytes (masked with a zero key), then 400 MB of it
    sock.sendall(bytes([0x81, 0xFF]) + struct.pack(">Q", 2**40) + b"\0\0\0\0")
    chunk = b"a" * (1024 * 1024)
    sent = 0
    try:
        for _ in range(400):
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # the server closed the connection: even better
    grew = _rss_bytes() - before
    sock.close()
    assert grew < 100 * 1024 * 1024, f"server grew {grew / 2**20:.0f} MiB for {sent >> 20} MiB sent"
    # and the gateway is fine
    assert httpx.get(f"{stack.base_url}/healthz", timeout=5).text == "ok"


def test_another_sites_page_cannot_open_the_stream(stack: Stack) -> None:
    url = stack.base_url.replace("http://", "ws://") + "/ws/cluster-status"
    host = stack.base_url.removeprefix("http://")
    ok = websocket.create_connection(url, origin=f"http://{host}", timeout=10)
    assert '"workers"' in ok.recv()
    ok.close()
    with pytest.raises(websocket.WebSocketException):
        bad = websocket.create_connection(url, origin="http://evil.example", timeout=10)
        bad.recv()  # closed with 1008 before the handshake completes


def test_a_client_that_stops_reading_loses_its_stream(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status, "SEND_TIMEOUT_S", 0.5)
    monkeypatch.setattr(status, "KEEPALIVE_S", 0.2)
    feed = stack.running.apps["gateway"].state.status_feed
    big = "x" * 2_000_000  # fills the socket buffers in a few sends
    monkeypatch.setattr(feed, "current", lambda: (big, str(time.monotonic())))
    port = int(stack.base_url.rsplit(":", 1)[1])
    socks = []
    for _ in range(4):
        s = _handshake(port)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        socks.append(s)  # never read: the kernel buffers fill, then sends block
    try:
        deadline = time.monotonic() + 30
        while feed.streams > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert feed.streams == 0, f"{feed.streams} unread streams still held"
    finally:
        for s in socks:
            s.close()


def test_pool_writes_need_a_json_or_msgpack_body(stack: Stack) -> None:
    body = '{"name": "csrf", "gpus": {"default": 1}}'
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = httpx.post(
            f"{stack.base_url}/v1/pools",
            content=body,
            headers={"Content-Type": ctype, "Origin": "http://evil.example"},
        )
        assert r.status_code == 415, (ctype, r.status_code, r.text)
        assert r.json()["detail"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
    assert httpx.get(f"{stack.base_url}/v1/pools/csrf").status_code == 404
    r = httpx.post(
        f"{stack.base_url}/v1/pools", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 201
    assert httpx.delete(f"{stack.base_url}/v1/pools/csrf").status_code == 200


def test_a_capped_pool_with_no_live_worker_answers_at_once(stack: Stack) -> None:
    # capped to a profile no worker has: its ring is empty
    spec = {"name": "nobody", "gpus": {"l4": 1}, "gpu_caps": {"l4": 1}}
    assert httpx.post(f"{stack.base_url}/v1/pools", json=spec).status_code == 201
    for bad in (
        {"name": "zero", "gpus": {"default": 1}, "gpu_caps": {"default": 0}},
        {"name": "other", "gpus": {"default": 1}, "gpu_caps": {"l4": 1}},
        {"name": "nobundle", "gpus": {"default": 1}, "bundle": "nope"},
        {"name": "strtl", "gpus": {"default": 1}, "ttl_seconds": "100"},
    ):
        r = httpx.post(f"{stack.base_url}/v1/pools", json=bad)
        assert r.status_code == 400, (bad, r.text)
    t0 = time.monotonic()
    r = httpx.post(
        f"{stack.base_url}/v1/encode/{MINILM}",
        json={"items": [{"text": "x"}]},
        headers={"X-SIE-Pool": "nobody", "X-SIE-Machine-Profile": "nobody/default"},
        timeout=30,
    )
    assert r.status_code in (400, 503), r.text
    r = httpx.post(
        f"{stack.base_url}/v1/encode/{MINILM}",
        json={"items": [{"text": "x"}]},
        headers={"X-SIE-Pool": "nobody"},
        timeout=30,
    )
    assert r.status_code == 503 and r.json()["error"]["code"] == "PROVISIONING", r.text
    assert time.monotonic() - t0 < 5
    assert httpx.delete(f"{stack.base_url}/v1/pools/nobody").status_code == 200


def test_an_access_line_cannot_be_forged(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sie.access")
    forged = "/v1/x%0a2026-12-02 13:30:00,000 INFO sie.access: DELETE /v1/pools/acme 200%1b[2J"
    httpx.get(f"{stack.base_url}{forged}")
    httpx.post(
        f"{stack.base_url}/v1/embeddings", json={"model": "m\ninjected " + "x" * 5000, "input": "a"}
    )
    lines = [r.getMessage() for r in caplog.records if r.name == "sie.access"]
    assert len(lines) == 2, lines
    for line in lines:
        assert "\n" not in line and "\x1b" not in line and len(line) < 1200, line
    assert "\\n" in lines[0] and "\\x1b" in lines[0]
