"""`sie serve` (every role, one process) against hostile requests, measured from the
outside: time to the answer and the server's peak memory (docs/security.md)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import BUNDLES, CONFIGS, MINILM, ROOT
from tests.e2e.test_serve import free_port, sie_bin

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _status(pid: int, key: str) -> int:
    """A ``/proc/{pid}/status`` size in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    port, cport = free_port(), free_port()
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w+")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sie_bin(),
            "serve",
            "--port",
            str(port),
            "--config-port",
            str(cport),
            "--models-dir",
            str(CONFIGS),
            "--bundles-dir",
            str(BUNDLES),
            "--preload",
            MINILM,
        ],
        cwd=ROOT,
        env={**os.environ, "SIE_AUTH_MODE": "token", "SIE_AUTH_TOKEN": "user"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.seek(0) or log.read()
            try:
                r = httpx.get(f"{url}/health", headers=AUTH, timeout=2)
                if r.status_code == 200 and r.json()["cluster"]["models_loaded"]:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("sie serve did not load MiniLM")
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


AUTH = {"Authorization": "Bearer user"}


def test_nested_chat_body_is_a_fast_4xx_without_memory_growth(
    served: tuple[str, int], st_model
) -> None:  # type: ignore[no-untyped-def]
    url, pid = served
    body = b'{"model":"m","messages":' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}"
    assert len(body) < 4 * 1024 * 1024  # under the generation body cap
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as c:
        c.get("/healthz")  # the connection is open before timing
        _reset_peak(pid)
        rss = _status(pid, "VmRSS")
        took = []
        for _ in range(3):
            t = time.perf_counter()
            r = c.post("/v1/chat/completions", content=body)
            took.append(time.perf_counter() - t)
            assert 400 <= r.status_code < 500, r.text
            assert r.json()["error"]["param"] == "body"
        growth = _status(pid, "VmHWM") - rss
        assert min(took) < 0.100, took
        assert growth < 50 * 1024 * 1024, f"peak RSS grew {growth / 2**20:.1f} MiB"
        # still serving, and correctly
        r = c.post(f"/v1/encode/{MINILM}", json={"items": [{"text": "a correct vector"}]})
        assert r.status_code == 200
        got = np.asarray(r.json()["items"][0]["dense"]["values"], dtype=np.float32)
        want = st_model.encode(["a correct vector"], normalize_embeddings=True)[0]
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_memory_of_a_large_body_is_given_back(served: tuple[str, int]) -> None:
    """Finding 8: a ~200 MB body (refused after decoding: the last item is bad) leaves
    the server's resident memory where it was, not a few hundred MB higher."""
    url, pid = served
    body = (
        b'{"items":[' + b",".join([b'{"text":"' + b"x" * 50_000 + b'"}'] * 4000) + b',{"text":5}]}'
    )
    with httpx.Client(base_url=url, headers=AUTH, timeout=120) as c:
        rss = _status(pid, "VmRSS")
        for _ in range(3):
            r = c.post(f"/v1/encode/{MINILM}", content=body)
            assert r.status_code == 400 and r.json()["detail"]["field"] == "items[4000].text"
        deadline = time.monotonic() + 10  # the trim runs on a thread after the answer
        while (growth := _status(pid, "VmRSS") - rss) >= 100 * 2**20:
            assert time.monotonic() < deadline, f"RSS grew {growth / 2**20:.0f} MiB"
            time.sleep(0.1)


def test_punycode_charset_is_415_at_once(served: tuple[str, int]) -> None:
    url, _ = served
    body = b'{"items":[{"text":"' + b"a" * 1_000_000 + b'"}]}'
    headers = {**AUTH, "Content-Type": "application/json; charset=punycode"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
        for path in (f"/v1/encode/{MINILM}", "/v1/chat/completions", "/v1/embeddings"):
            r = c.post(path, content=body)
            assert r.status_code == 415, (path, r.text)
        # the loop was never held: a probe answers at once
        t = time.perf_counter()
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert time.perf_counter() - t < 0.5


@pytest.mark.parametrize(
    ("env", "args", "expect"),
    [
        ({"SIE_AUTH_MODE": "tokn"}, [], "SIE_AUTH_MODE='tokn' is not one of"),
        ({"SIE_AUTH_MODE": "off"}, [], "is not one of none, token, static"),
        ({}, ["--host", "0.0.0.0"], "SIE_AUTH_MODE=none to serve without auth"),
        ({"SIE_HOST": "::"}, [], "not a loopback address"),
    ],
)
def test_auth_fails_closed_at_start(env: dict[str, str], args: list[str], expect: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    proc = subprocess.run(
        [sie_bin(), "serve", "--port", str(free_port()), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert expect in proc.stderr, proc.stderr
