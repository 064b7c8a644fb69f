"""`sie serve` as a subprocess on a free port, called over real HTTP (acceptance 2)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import BUNDLES, CONFIGS, MINILM, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sie_bin() -> str:
    exe = Path(sys.executable).with_name("sie")
    return str(exe) if exe.exists() else "sie"


@pytest.fixture
def server(tmp_path: Path):
    port, cport = free_port(), free_port()
    log = open(tmp_path / "serve.log", "w+")  # noqa: SIM115 - closed after the process exits
    env = {**os.environ, "SIE_CONFIG_PORT": str(cport), "SIE_DRAIN_TIMEOUT_S": "10"}
    proc = subprocess.Popen(
        [
            sie_bin(),
            "serve",
            "--roles=gateway,config,worker",
            "--bus=memory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--models-dir",
            str(CONFIGS),
            "--bundles-dir",
            str(BUNDLES),
            "--preload",
            MINILM,
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            h = httpx.get(f"{base}/health", timeout=1).json()
            if h["workers"] and h["workers"][0]["ready"]:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("sie serve did not become ready:\n" + (tmp_path / "serve.log").read_text())
    yield proc, base, cport
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    log.close()


def test_serve_encode_and_graceful_sigterm(server, st_model) -> None:
    proc, base, cport = server
    texts = ["Real embeddings over real HTTP.", "From a subprocess."]
    r = httpx.post(
        f"{base}/v1/encode/{MINILM}", json={"items": [{"text": t} for t in texts]}, timeout=30
    )
    assert r.status_code == 200, r.text
    got = np.array([it["dense"]["values"] for it in r.json()["items"]], dtype=np.float32)
    np.testing.assert_allclose(got, st_model.encode(texts), atol=1e-5)
    assert httpx.get(f"{base}/readyz").text == "ok"
    models = httpx.get(f"http://127.0.0.1:{cport}/v1/configs/models").json()["models"]
    assert MINILM in [m["model_id"] for m in models]

    # a request in flight when SIGTERM arrives still completes; then the process exits 0
    results: list[int] = []

    def slow_request() -> None:
        items = [{"text": f"drain me {i} " * 30} for i in range(64)]
        results.append(
            httpx.post(f"{base}/v1/encode/{MINILM}", json={"items": items}, timeout=30).status_code
        )

    def in_flight() -> bool:
        text = httpx.get(f"{base}/metrics", timeout=5).text
        return any(
            line.startswith("sie_gateway_lane_in_flight_items{") and float(line.split()[-1]) > 0
            for line in text.splitlines()
        )

    t = threading.Thread(target=slow_request)
    t.start()
    deadline = time.monotonic() + 20  # SIGTERM only once the request is really in flight
    while not in_flight() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert proc.wait(timeout=30) == 0
    assert results == [200]


def test_bad_flags_exit_nonzero() -> None:
    out = subprocess.run(
        [sie_bin(), "serve", "--roles=gateway,router"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2 and "roles" in out.stderr
    out = subprocess.run(
        [sie_bin(), "serve", "--bus=kafka", "--port", str(free_port()), "--roles=gateway"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "bus" in out.stderr.lower()
