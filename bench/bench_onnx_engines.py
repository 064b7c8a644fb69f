"""Raw engine throughput: MiniLM on torch against ONNX Runtime float32 and int8.

The three engines as the worker builds them (profiles ``default``, ``onnx`` and
``onnx-int8`` of ``configs/sentence-transformers__all-MiniLM-L6-v2.yaml``), called
in-process through ``CallThreads`` as the worker calls them (so torch gets the worker's
per-call thread count), on 8-20-word texts (``bench_encode.corpus``):

- ``bs 1`` / ``bs 32``: one call at a time, every core to it;
- ``2 x bs 32``: two calls at once from two threads (the worker's default
  ``SIE_ENGINE_CONCURRENCY``), one core each.

Engines take turns, ``--rounds`` times, ``--seconds`` per measurement, and the best
round is printed (the machine is shared: the best is the least disturbed). Also
prints each ONNX engine's load checks (parity cosine, int8 quality). A benchmark, not a
test. Usage:

    .venv/bin/python bench/bench_onnx_engines.py --seconds 3 --rounds 2
    .venv/bin/python bench/bench_onnx_engines.py --profiles onnx --json out.json

``bench_peers.py`` runs it (``--profiles onnx,onnx-int8``) for its raw-engine rows.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_encode import corpus  # noqa: E402

from sie.core.config import parse_model_config  # noqa: E402
from sie.engines.base import load_engine_class  # noqa: E402
from sie.engines.runtime.threads import CallThreads  # noqa: E402

PROFILES = ("default", "onnx", "onnx-int8")
MODES = (("bs 1", 1, 1), ("bs 32", 32, 1), ("2 x bs 32", 32, 2))


def load(profile: str, cache: str | None) -> Any:
    config = parse_model_config(
        (ROOT / "configs" / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text()
    )
    prof = config.resolve_profile(profile)
    factory = load_engine_class(prof.adapter_path, [prof.adapter_module])
    extra = (
        {"model_cache_dir": cache}
        if "model_cache_dir" in inspect.signature(factory).parameters
        else {}
    )
    engine = factory(config, prof, "cpu", **extra)
    t0 = time.perf_counter()
    engine.load()
    print(f"{profile:10s} loaded in {time.perf_counter() - t0:.1f}s", end="")
    if getattr(engine, "parity_cosine", None) is not None:
        print(f"; parity cosine {engine.parity_cosine:.7f}", end="")
    if getattr(engine, "int8_quality", None) is not None:
        q = engine.int8_quality
        print(
            f"; int8 min {q.min_cosine:.4f} mean {q.mean_cosine:.4f} top-10 {q.top10_overlap:.3f}",
            end="",
        )
    print()
    return engine


def measure(engine: Any, texts: list[str], bs: int, calls: int, seconds: float) -> float:
    """Sentences/s of ``calls`` threads each encoding batches of ``bs`` for ``seconds``."""
    threads_ = CallThreads()

    def run_batch(_key: Any, batch: Any) -> Any:
        prepared, counts = engine.prepare(batch, instruction=None, is_query=False, options={})
        engine.encode(
            prepared, output_types=("dense",), options={"normalize": True}, lengths=counts
        )
        return batch

    call = threads_.wrap(run_batch)
    call(None, texts[:bs])  # warm-up (and the sessions for this thread count)
    done = [0] * calls
    stop = time.perf_counter() + seconds

    def worker(k: int) -> None:
        i = k * 997
        while time.perf_counter() < stop:
            call(None, [texts[(i + j) % len(texts)] for j in range(bs)])
            done[k] += bs
            i += bs

    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(calls)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cache", default=None, help="SIE_MODEL_CACHE_DIR for the ONNX export")
    ap.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated subset")
    ap.add_argument("--json", default=None, help="also write {profile: {mode: rate}} here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    texts = corpus(512)
    profiles = [p for p in args.profiles.split(",") if p]
    engines = {p: load(p, args.cache) for p in profiles}
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for name, bs, calls in MODES:
            for p, engine in engines.items():
                rate = measure(engine, texts, bs, calls, args.seconds)
                best[(p, name)] = max(best.get((p, name), 0.0), rate)
    print(f"\nsentences/s, best of {args.rounds} rounds of {args.seconds:g}s")
    print(f"{'':12s}" + "".join(f"{m:>12s}" for m, _, _ in MODES))
    for p in profiles:
        row = "".join(f"{best[(p, m)]:12.0f}" for m, _, _ in MODES)
        torch = best.get(("default", "bs 32"))
        ratio = f"   ({best[(p, 'bs 32')] / torch:.2f}x torch at bs 32)" if torch else ""
        print(f"{p:12s}{row}{ratio}")
    if args.json:
        out = {p: {m: round(best[(p, m)], 1) for m, _, _ in MODES} for p in profiles}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
