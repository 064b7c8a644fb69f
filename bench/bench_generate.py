"""Generation: time to first token and tokens/s, served vs the engine called directly
(issue 6, acceptance 4).

One run, SmolLM2-135M-Instruct on the CPU (``TransformersGenerator``, max_num_seqs 4),
greedy, ``--max-tokens`` per request, at 1 and 8 concurrent streams:

1. **engine**: ``TransformersGenerator.generate`` in this process;
2. **served**: ``sie serve`` (all roles, in-memory bus) answering
   ``POST /v1/chat/completions`` with ``stream: true`` over HTTP.

TTFT is from sending the request to the first text delta (p50 over the streams of a
round); tokens/s is every stream's completion tokens over the round's wall time.
A benchmark, never a test. Usage: ``make bench`` or
``.venv/bin/python bench/bench_generate.py [--rounds 3] [--max-tokens 32]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _server import free_port, start_server  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TOPICS = ["France", "Japan", "Brazil", "Kenya", "Canada", "Norway", "Egypt", "India"]


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Tell me three facts about {TOPICS[i % len(TOPICS)]}."}]


async def engine_round(engine: object, n: int, max_tokens: int) -> tuple[list[float], int, float]:
    from sie.engines.generation import GenerationRequest, SamplingParams

    ttft: list[float] = []
    tokens = 0
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        nonlocal tokens
        req = GenerationRequest(
            request_id=f"bench-{time.monotonic_ns()}-{i}",
            messages=messages(i),
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        )
        start = time.perf_counter()
        first = True
        async for delta in engine.generate(req):  # type: ignore[attr-defined]
            if first and delta.text:
                ttft.append(time.perf_counter() - start)
                first = False
            if delta.finish_reason is not None:
                tokens += delta.completion_tokens or 0

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return ttft, tokens, time.perf_counter() - t0


async def served_round(base: str, n: int, max_tokens: int) -> tuple[list[float], int, float]:
    ttft: list[float] = []
    tokens = 0
    t0 = time.perf_counter()

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal tokens
        body = {
            "model": MODEL,
            "messages": messages(i),
            "temperature": 0,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.perf_counter()
        first = True
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if first and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    ttft.append(time.perf_counter() - start)
                    first = False
                if chunk.get("usage"):
                    tokens += chunk["usage"]["completion_tokens"]

    limits = httpx.Limits(max_connections=n)
    async with (
        httpx.AsyncClient(timeout=600, limits=limits) as client,
        anyio.create_task_group() as tg,
    ):
        for i in range(n):
            tg.start_soon(one, client, i)
    return ttft, tokens, time.perf_counter() - t0


def summarise(rounds: list[tuple[list[float], int, float]]) -> tuple[float, float]:
    ttft = statistics.median(t for r in rounds for t in r[0]) * 1000.0
    tps = sum(r[1] for r in rounds) / sum(r[2] for r in rounds)
    return ttft, tps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sie.core.config import parse_model_config
    from sie.engines.generators.transformers_gen import TransformersGenerator

    cfg = parse_model_config(
        (ROOT / "configs" / "HuggingFaceTB__SmolLM2-135M-Instruct.yaml").read_text()
    )
    engine = TransformersGenerator(cfg, cfg.resolve_profile(), "cpu")
    engine.load()
    results: dict[tuple[str, int], tuple[float, float]] = {}
    for n in (1, 8):
        anyio.run(engine_round, engine, 1, 4)  # warm-up
        rounds = [anyio.run(engine_round, engine, n, a.max_tokens) for _ in range(a.rounds)]
        results[("engine", n)] = summarise(rounds)
        print(
            f"  engine, {n} stream(s): TTFT p50 {results[('engine', n)][0]:.0f} ms, "
            f"{results[('engine', n)][1]:.1f} tokens/s",
            flush=True,
        )
    engine.unload()

    port = free_port()
    proc = start_server(port, preload=[MODEL])
    try:
        base = f"http://127.0.0.1:{port}"
        for n in (1, 8):
            anyio.run(served_round, base, 1, 4)  # warm-up
            rounds = [anyio.run(served_round, base, n, a.max_tokens) for _ in range(a.rounds)]
            results[("served", n)] = summarise(rounds)
            print(
                f"  served, {n} stream(s): TTFT p50 {results[('served', n)][0]:.0f} ms, "
                f"{results[('served', n)][1]:.1f} tokens/s",
                flush=True,
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)

    print(f"\n{MODEL}, greedy, {a.max_tokens} tokens per request, {a.rounds} rounds")
    for n in (1, 8):
        (et, es), (st, ss) = results[("engine", n)], results[("served", n)]
        print(
            f"  {n} stream(s): TTFT engine {et:.0f} ms, served {st:.0f} ms (+{st - et:.0f} ms) | "
            f"tokens/s engine {es:.1f}, served {ss:.1f} ({ss / es:.2f}x)"
        )


if __name__ == "__main__":
    main()
