"""Start ``sie serve`` (all roles, in-memory bus) as a subprocess for the benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    port: int, *, preload: list[str], models_dir: Path | None = None
) -> subprocess.Popen[bytes]:
    """``sie serve`` on ``port`` with ``preload`` loaded; returns once the worker is ready.

    Raises:
        SystemExit: not ready within 180 s.
    """
    env = {**os.environ, "SIE_CONFIG_PORT": str(free_port()), "SIE_LOG_LEVEL": "WARNING"}
    sie = str(Path(sys.executable).with_name("sie"))
    args = [sie, "serve", "--roles=gateway,config,worker", "--bus=memory", "--port", str(port)]
    args += ["--models-dir", str(models_dir or ROOT / "configs")]
    args += ["--bundles-dir", str(ROOT / "bundles")]
    for model in preload:
        args += ["--preload", model]
    proc = subprocess.Popen(args, cwd=ROOT, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            h = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()
            if h["workers"] and h["workers"][0]["ready"]:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("sie serve did not become ready")


def engine_counters(port: int) -> dict[str, float]:
    """Engine-call totals from ``/metrics``: ``calls``, ``items`` and ``busy_s`` (the
    summed wall time of engine calls), over every model of the worker."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out = {"calls": 0.0, "items": 0.0, "busy_s": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sie_batch_size_count":
                out["calls"] += sample.value
            elif sample.name == "sie_batch_size_sum":
                out["items"] += sample.value
            elif sample.name == "sie_batch_inference_duration_seconds_sum":
                out["busy_s"] += sample.value
    return out
