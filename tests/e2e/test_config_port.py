"""``make run PORT=…`` (``sie serve --port P``) moves the config role with the gateway:
it listens on P + 1 unless ``--config-port`` / ``SIE_CONFIG_PORT`` says otherwise
(``0``: any free port), and ``sie config apply`` finds it there from the gateway URL
alone. A taken config port fails the start with a message, exit 2."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def sie_bin() -> str:
    exe = Path(sys.executable).with_name("sie")
    return str(exe) if exe.exists() else "sie"


def free_pair() -> int:
    """A port P with P + 1 free too (both checked just now)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < 65535:
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port pair")


def clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SIE_")}, **extra}


@contextmanager
def serve(port: int, tmp: Path, **env: str) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    log = tmp / f"serve-{port}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sie_bin(), "serve", "--roles=gateway,config", "--port", str(port)],
            cwd=ROOT,
            env=clean_env(
                SIE_MODELS_DIR=str(ROOT / "configs"), SIE_BUNDLES_DIR=str(ROOT / "bundles"), **env
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            yield proc, log
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)


def wait_listening(log: Path, role: str, proc: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(rf"{role} listening on http://127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            return int(m.group(1))
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(log.read_text())


def test_the_config_port_follows_the_gateway_port(tmp_path: Path) -> None:
    port = free_pair()
    with serve(port, tmp_path) as (proc, log):
        assert wait_listening(log, "gateway", proc) == port
        assert wait_listening(log, "config", proc) == port + 1
        assert httpx.get(f"http://127.0.0.1:{port + 1}/v1/configs/epoch").status_code == 200
        # the client commands find the config role from the gateway URL alone
        yaml = tmp_path / "m.yaml"
        yaml.write_text(
            "sie_id: sentence-transformers/all-MiniLM-L6-v2\nprofiles:\n"
            "  portcheck:\n    extends: default\n    max_batch_tokens: 128\n"
        )
        out = subprocess.run(
            [sie_bin(), "config", "apply", str(yaml), "--json"],
            env=clean_env(SIE_GATEWAY_URL=f"http://127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert '"portcheck"' in out.stdout


def test_a_taken_config_port_fails_the_start_and_zero_picks_a_free_one(tmp_path: Path) -> None:
    port = free_pair()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port + 1))
        squatter.listen()
        with serve(port, tmp_path) as (proc, log):
            assert proc.wait(timeout=60) == 2
            assert "sie serve:" in log.read_text() and str(port + 1) in log.read_text()
        with serve(port, tmp_path, SIE_CONFIG_PORT="0") as (proc, log):
            assert wait_listening(log, "gateway", proc) == port
            assert wait_listening(log, "config", proc) not in (port + 1, 0)
