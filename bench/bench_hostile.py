"""Liveness under a hostile encode load (docs/security.md "Liveness").

Starts ``sie serve`` with every role in one process (memory bus, MiniLM), then sends
``--clients`` concurrent encode requests of ``--items`` texts of 1,000 characters each
(the default, 64 x 4,096, is 256 MB of bodies: far more work than the worker can do
before the gateway's timeout) while a separate prober process calls ``/healthz`` every
20 ms. Prints the answers by status and code, the probe latency (p50 / p99 / max), the
CPU the server, the load generator and the prober used, and whether a one-item request
is served afterwards.

    python bench/bench_hostile.py [--clients 64] [--items 4096] [--timeout 15]

Not a test (``tests/hostile/test_liveness.py`` is the CI check); numbers go in the
issue note.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
MINILM = "sentence-transformers/all-MiniLM-L6-v2"

PROBER = """
import http.client, json, os, sys, time
port, out, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
lat, t0 = [], time.perf_counter()
while not os.path.exists(stop):
    t = time.perf_counter()
    conn.request("GET", "/healthz")
    conn.getresponse().read()
    lat.append((t - t0, (time.perf_counter() - t) * 1000))
    time.sleep(0.02)
json.dump(lat, open(out, "w"))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(port: int, timeout_s: float, log: Path) -> subprocess.Popen[bytes]:
    sie = Path(sys.executable).with_name("sie")
    env = {**os.environ, "SIE_GATEWAY_REQUEST_TIMEOUT": str(timeout_s)}
    args = [str(sie), "serve", "--port", str(port), "--config-port", str(free_port())]
    args += ["--models-dir", str(ROOT / "configs"), "--bundles-dir", str(ROOT / "bundles")]
    args += ["--preload", MINILM]
    proc = subprocess.Popen(args, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"sie serve exited: see {log}")
        try:
            h = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
            if h["cluster"]["models_loaded"]:
                return proc
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("MiniLM did not load")


def run(clients: int, items: int, timeout_s: float) -> dict[str, object]:
    """The load, measured; returns the figures printed by ``main``."""
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="sie-hostile-"))
    proc = start_server(port, timeout_s, tmp / "serve.log")
    url = f"http://127.0.0.1:{port}"
    text = ("lorem ipsum dolor sit amet consectetur adipiscing elit " * 20)[:990]
    body = json.dumps({"items": [{"text": f"{i:>9} {text}"} for i in range(items)]}).encode()
    statuses: collections.Counter[str] = collections.Counter()
    stop = tmp / "stop"
    prober = subprocess.Popen(
        [sys.executable, "-c", PROBER, str(port), str(tmp / "lat.json"), str(stop)]
    )

    def client() -> None:
        with httpx.Client(base_url=url, timeout=timeout_s + 120) as c:
            r = c.post(
                f"/v1/encode/{MINILM}", content=body, headers={"content-type": "application/json"}
            )
            statuses[f"{r.status_code} {r.headers.get('x-sie-error-code') or ''}".strip()] += 1

    try:
        time.sleep(1.0)  # the prober's first samples are of an idle server
        before = (cpu_s(proc.pid), cpu_s(os.getpid()), cpu_s(prober.pid))
        t0 = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        after = (cpu_s(proc.pid), cpu_s(os.getpid()), cpu_s(prober.pid))
        stop.write_text("1")
        prober.wait(60)
        lat = sorted(ms for _, ms in json.loads((tmp / "lat.json").read_text()))
        since = time.monotonic()
        while True:  # the worker may still be dropping the abandoned backlog
            r = httpx.post(
                f"{url}/v1/encode/{MINILM}", json={"items": [{"text": "after"}]}, timeout=120
            )
            if r.status_code == 200 or time.monotonic() - since > 120:
                break
        return {
            "answers": dict(statuses),
            "wall_s": round(wall, 1),
            "probes": len(lat),
            "healthz_ms": {
                "p50": round(lat[len(lat) // 2], 1),
                "p99": round(lat[int(len(lat) * 0.99)], 1),
                "max": round(lat[-1], 1),
            },
            "cpu_s": {
                "server": round(after[0] - before[0], 1),
                "load_generator": round(after[1] - before[1], 1),
                "prober": round(after[2] - before[2], 1),
            },
            "one_item_after": r.status_code,
            "one_item_after_s": round(time.monotonic() - since, 1),
        }
    finally:
        stop.write_text("1")
        proc.terminate()
        proc.wait(60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--items", type=int, default=4096)
    p.add_argument("--timeout", type=float, default=15.0, help="SIE_GATEWAY_REQUEST_TIMEOUT")
    a = p.parse_args()
    print(json.dumps(run(a.clients, a.items, a.timeout), indent=2))


if __name__ == "__main__":
    main()
