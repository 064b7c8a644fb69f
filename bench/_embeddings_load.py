"""Closed-loop load generator for OpenAI ``POST /v1/embeddings``, the same for every server.

``connections`` keep-alive HTTP/1.1 connections, one request in flight each, every
request ``{"model": MODEL, "input": [texts]}`` with ``texts_per_request`` 8-20-word
texts (``bench_encode.corpus``). The first ``warmup`` seconds are not counted; then
every request completed in the next ``seconds`` counts (its latency and its texts). Standard
library only (asyncio, raw sockets: no client library in the measurement), so it runs
in any Python with the bench folder on its path (``bench_peers.py``, ``gpu_check.py``).

``run_load`` runs it in ``processes`` child processes (connections split between them)
so that the client's own CPU use stays visible and, on a many-core machine, does not
cap the rate; the children's latencies are merged. A child, run alone, prints its raw
JSON (every latency):

    python bench/_embeddings_load.py --port 8080 --model M --connections 32 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def corpus(n: int) -> list[str]:
    """The texts of ``bench_encode.corpus``: short, varied sentences (8-20 words)."""
    sys.path.insert(0, str(BENCH))
    from bench_encode import corpus as bench_corpus

    return list(bench_corpus(n))


def bodies(model: str, texts_per_request: int, n: int = 256) -> list[bytes]:
    """``n`` request bodies, ``texts_per_request`` consecutive corpus texts each."""
    texts = corpus(512)
    k = texts_per_request
    return [
        json.dumps(
            {"model": model, "input": [texts[(i * k + j) % len(texts)] for j in range(k)]}
        ).encode()
        for i in range(n)
    ]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """``(status, body, server closes)`` of one HTTP/1.1 response (Content-Length or chunked)."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("connection closed by the server")
    status = int(status_line.split()[1])
    length, chunked, close = 0, False, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode("latin-1").partition(":")
        k, v = k.strip().lower(), v.strip().lower()
        if k == "content-length":
            length = int(v)
        elif k == "transfer-encoding" and "chunked" in v:
            chunked = True
        elif k == "connection" and v == "close":
            close = True  # e.g. hypercorn's keep_alive_max_requests
    if not chunked:
        return status, await reader.readexactly(length), close
    parts = []
    while (size := int((await reader.readline()).split(b";")[0], 16)) > 0:
        parts.append(await reader.readexactly(size))
        await reader.readline()
    while (await reader.readline()) not in (b"\r\n", b""):  # trailers
        pass
    return status, b"".join(parts), close


async def _connection(
    port: int,
    bodies_: list[bytes],
    offset: int,
    start: float,
    stop: float,
    lat: list[float],
    errors: list[str],
) -> None:
    """One closed loop: send, wait for the whole response, send the next."""
    head = (
        "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Accept: application/json\r\nContent-Length: {}\r\n\r\n"
    )
    i, writer = offset, None
    while time.perf_counter() < stop:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = bodies_[i % len(bodies_)]
            i += 1
            t0 = time.perf_counter()
            writer.write(head.format(len(body)).encode() + body)
            status, payload, close = await _read_response(reader)
            t1 = time.perf_counter()
            if status != 200:
                errors.append(f"HTTP {status}: {payload[:200].decode('utf-8', 'replace')}")
            elif start <= t1 <= stop:  # completed in the measured window
                lat.append(t1 - t0)
            if close:
                writer.close()
                writer = None
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.05)
    if writer is not None:
        writer.close()


async def _measure(
    port: int, model: str, connections: int, texts: int, seconds: float, warmup: float
) -> dict[str, object]:
    bodies_ = bodies(model, texts)
    lat: list[float] = []
    errors: list[str] = []
    start = time.perf_counter() + warmup
    stop = start + seconds
    await asyncio.gather(
        *(_connection(port, bodies_, c * 7, start, stop, lat, errors) for c in range(connections))
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "lat_ms": [round(x * 1000, 3) for x in lat],
        "errors": len(errors),
        "error_sample": errors[0] if errors else "",
        "client_cpu_s": usage.ru_utime + usage.ru_stime,
    }


def _pct(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(len(sorted_ms) * q))] if sorted_ms else 0.0


def run_load(
    port: int,
    model: str,
    *,
    connections: int,
    texts: int = 1,
    seconds: float = 8.0,
    warmup: float = 2.0,
    processes: int = 1,
) -> dict[str, float | str]:
    """Drive ``127.0.0.1:port`` from ``processes`` child processes and return
    ``{req_s, emb_s, p50_ms, p99_ms, requests, errors, error_sample, client_cpu}``
    (``client_cpu``: the children's CPU seconds per measured second).

    Raises:
        RuntimeError: a child process failed.
    """
    processes = max(1, min(processes, connections))
    share = [connections // processes + (i < connections % processes) for i in range(processes)]
    children = [
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__)),
                "--port",
                str(port),
                "--model",
                model,
                "--connections",
                str(n),
                "--texts",
                str(texts),
                "--seconds",
                str(seconds),
                "--warmup",
                str(warmup),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in share
    ]
    results = []
    for child in children:
        out, err = child.communicate(timeout=warmup + seconds + 120)
        if child.returncode:
            raise RuntimeError(f"load generator failed:\n{err[-2000:]}")
        results.append(json.loads(out))
    lat = sorted(x for r in results for x in r["lat_ms"])
    errors = sum(int(r["errors"]) for r in results)
    return {
        "req_s": len(lat) / seconds,
        "emb_s": len(lat) * texts / seconds,
        "p50_ms": _pct(lat, 0.50),
        "p99_ms": _pct(lat, 0.99),
        "requests": len(lat),
        "errors": errors,
        "error_sample": next((r["error_sample"] for r in results if r["error_sample"]), ""),
        "client_cpu": sum(float(r["client_cpu_s"]) for r in results) / (warmup + seconds),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--texts", type=int, default=1, help="texts per request")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured, after the warm-up")
    ap.add_argument("--warmup", type=float, default=2.0)
    a = ap.parse_args()
    print(
        json.dumps(
            asyncio.run(_measure(a.port, a.model, a.connections, a.texts, a.seconds, a.warmup))
        )
    )


if __name__ == "__main__":
    main()
