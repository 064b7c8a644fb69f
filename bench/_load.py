"""Minimal closed-loop HTTP/1.1 load generator: N keep-alive connections, one
in-flight request each. ``--kind``: ``encode`` (one text per ``POST /v1/encode``),
``score`` (one query and ``--pairs`` candidates per ``POST /v1/score``) or ``extract``
(one text per ``POST /v1/extract``). Prints JSON ``{rps, p50_ms, p99_ms, errors,
requests}``. Used by the bench_*.py scripts."""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


async def worker(
    port: int, path: str, bodies: list[bytes], stop: float, lat: list[float], errs: list[int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = 0
    while time.perf_counter() < stop:
        body = bodies[i % len(bodies)]
        i += 1
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        writer.write(head + body)
        status = int((await reader.readline()).split()[1])
        length, close = 0, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            if k.lower() == "content-length":
                length = int(v)
            elif k.lower() == "connection" and v.strip().lower() == "close":
                close = True  # e.g. hypercorn's keep_alive_max_requests (1000)
        await reader.readexactly(length)
        lat.append(time.perf_counter() - t0)
        if status != 200:
            errs.append(status)
        if close:
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()


def run_load(
    port: int,
    model: str,
    connections: int,
    seconds: float,
    *,
    kind: str = "encode",
    pairs: int = 16,
) -> dict[str, float]:
    """Run this generator in a subprocess against ``127.0.0.1:port`` and return its JSON."""
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__)),
            "--kind",
            kind,
            "--pairs",
            str(pairs),
            "--port",
            str(port),
            "--model",
            model,
            "--connections",
            str(connections),
            "--seconds",
            str(seconds),
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"load generator failed:\n{out.stderr[-2000:]}")
    return dict(json.loads(out.stdout))


WORDS = "search engines rank documents by relevance to a query using dense vectors".split()
NAMES = ["John Smith", "Maria Gonzalez", "Li Wei", "Amara Okafor", "Lukas Becker"]


def sentence(i: int) -> str:
    """Short, varied, deterministic text (8-16 words)."""
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(8 + i % 9))


def bodies_for(kind: str, pairs: int) -> tuple[str, list[bytes]]:
    """``(route, request bodies)`` for a load kind."""
    if kind == "score":
        return "score", [
            json.dumps(
                {
                    "query": {"text": sentence(i)},
                    "items": [{"text": sentence(i * pairs + k + 1)} for k in range(pairs)],
                }
            ).encode()
            for i in range(64)
        ]
    if kind == "extract":
        return "extract", [
            json.dumps(
                {
                    "items": [
                        {
                            "text": f"Please ask {NAMES[i % 5]} ({NAMES[i % 5].split()[0].lower()}"
                            f"@example.com) about {sentence(i)}, at 12 Baker Street, London."
                        }
                    ]
                }
            ).encode()
            for i in range(256)
        ]
    return "encode", [json.dumps({"items": [{"text": sentence(i)}]}).encode() for i in range(256)]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--kind", choices=["encode", "score", "extract"], default="encode")
    ap.add_argument("--pairs", type=int, default=16, help="candidates per score request")
    a = ap.parse_args()
    route, bodies = bodies_for(a.kind, a.pairs)
    lat: list[float] = []
    errs: list[int] = []
    t0 = time.perf_counter()
    stop = t0 + a.seconds
    await asyncio.gather(
        *(
            worker(a.port, f"/v1/{route}/{a.model}", bodies, stop, lat, errs)
            for _ in range(a.connections)
        )
    )
    elapsed = time.perf_counter() - t0
    lat.sort()
    print(
        json.dumps(
            {
                "rps": len(lat) / elapsed,
                "p50_ms": lat[len(lat) // 2] * 1000 if lat else 0.0,
                "p99_ms": lat[int(len(lat) * 0.99)] * 1000 if lat else 0.0,
                "errors": len(errs),
                "requests": len(lat),
                "client_cpu_s": resource.getrusage(resource.RUSAGE_SELF).ru_utime
                + resource.getrusage(resource.RUSAGE_SELF).ru_stime,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
