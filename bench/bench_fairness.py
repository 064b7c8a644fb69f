"""Fair batching (docs/api.md §10): small requests beside large ones.

Starts ``sie serve`` (every role, memory bus, MiniLM preloaded), keeps ``--big``
clients each with one ``--items``-item encode in flight at all times (a new one as
soon as the last returns), and meanwhile sends one-item encodes from one client, one
after another, for ``--seconds``. Prints the one-item latency (p50 / p99 / max, ms)
and the engine's throughput over the run (items/s, from ``/metrics``).

    python bench/bench_fairness.py [--big 4] [--items 4096] [--seconds 20]

Not a test; numbers go in the issue note.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server import engine_counters, free_port, start_server

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


async def main(big: int, items: int, seconds: float) -> None:
    port = free_port()
    proc = start_server(port, preload=[MINILM])
    url = f"http://127.0.0.1:{port}/v1/encode/{MINILM}"
    body = json.dumps(
        {
            "items": [
                {"text": f"a large request's text number {i}, some words"} for i in range(items)
            ]
        }
    )
    stop = time.monotonic() + seconds
    try:
        async with httpx.AsyncClient(timeout=300) as c:

            async def big_client() -> None:
                while time.monotonic() < stop:
                    await c.post(url, content=body, headers={"Content-Type": "application/json"})

            async def small_client() -> list[float]:
                lat: list[float] = []
                await asyncio.sleep(2.0)  # the big requests are queued by now
                while time.monotonic() < stop:
                    t = time.perf_counter()
                    r = await c.post(url, json={"items": [{"text": "a small request"}]})
                    assert r.status_code == 200, r.text
                    lat.append((time.perf_counter() - t) * 1000)
                return lat

            t0, before = time.monotonic(), engine_counters(port)["items"]
            tasks = [asyncio.create_task(big_client()) for _ in range(big)]
            lat_raw = await small_client()
            elapsed = time.monotonic() - t0
            computed = engine_counters(port)["items"] - before
            for t in tasks:
                t.cancel()
        lat = sorted(lat_raw)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        print(
            json.dumps(
                {
                    "big_clients": big,
                    "items_per_big_request": items,
                    "small_requests": len(lat),
                    "small_ms": {
                        "p50": round(statistics.median(lat), 1),
                        "p99": round(p99, 1),
                        "max": round(lat[-1], 1),
                    },
                    "engine_items_per_s": round(computed / elapsed, 1),
                }
            )
        )
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--big", type=int, default=4)
    ap.add_argument("--items", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    asyncio.run(main(a.big, a.items, a.seconds))
