"""The broker is away at start, and restarted under a running system (architecture §2,
§10; issue acceptance 3): no role is restarted, service resumes within 10 s."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import MINILM, run_stack
from tests.natsserver import NatsServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BODY = {"items": [{"text": "still there?"}]}


def served_within(url: str, seconds: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            r = httpx.post(url, json=BODY, timeout=5)
            if r.status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not served again within {seconds}s")


def test_no_broker_at_start_is_503_then_serves_when_it_arrives(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats", port=free_port())
    with run_stack(
        wait_worker=False, bus="nats", nats_url=server.url, request_timeout_s=3
    ) as stack:
        url = f"{stack.base_url}/v1/encode/{MINILM}"
        assert httpx.get(f"{stack.base_url}/healthz").text == "ok"
        r = httpx.post(url, json=BODY, timeout=10)
        assert r.status_code == 503, r.text  # no fallback to a direct path
        assert r.headers.get("Retry-After")
        server.start()
        try:
            served_within(url, 20)
        finally:
            server.stop()


def test_broker_restart_resumes_without_restarting_roles(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        with run_stack(
            bus="nats", nats_url=server.url, preload=(MINILM,), request_timeout_s=3
        ) as stack:
            url = f"{stack.base_url}/v1/encode/{MINILM}"
            assert httpx.post(url, json=BODY, timeout=30).status_code == 200
            server.restart()  # kill -9, same port and store
            took = served_within(url, 10)
            assert took < 10
    finally:
        server.stop()
