"""Score and extract throughput: served over HTTP vs the raw engine (issue 5, acceptance 4).

One run measures, on this machine:

1. **score**: the raw engine (``CrossEncoderScorer.score``, MiniLM distilled into a
   cross-encoder by ``tests/distill.py``) in pairs/s at 16-128 pairs per call; then
   ``sie serve`` answering ``POST /v1/score`` with one query and 16 candidates per request
   over 8 keep-alive connections, in pairs/s;
2. **extract**: the raw engine (``OnnxTokenClassifier.extract``, Rampart PII) in texts/s
   at 1-32 texts per call; then ``POST /v1/extract`` with one text per request over 8
   and 32 connections, in texts/s;
3. the served / raw-best ratios.

The load generator is ``bench/_load.py`` in another process. A benchmark, never a test.
Usage: ``make bench`` or ``.venv/bin/python bench/bench_functions.py --seconds 10``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import bodies_for, run_load  # noqa: E402
from _server import free_port, start_server  # noqa: E402

from tests.distill import reranker_config_yaml  # noqa: E402

RERANKER = "bench/minilm-cross-encoder"
RAMPART = "nationaldesignstudio/rampart"
PAIRS = 16


def rate(fn: Callable[[], int], seconds: float) -> float:
    """Units per second of ``fn`` (which returns the units it processed) over ``seconds``."""
    fn()  # warm-up
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += fn()
    return n / (time.perf_counter() - t0)


def raw_score(weights: Path, seconds: float) -> dict[int, float]:
    from sie.core.config import parse_model_config
    from sie.engines.scorers.cross_encoder import CrossEncoderScorer

    cfg = parse_model_config(reranker_config_yaml(RERANKER, weights))
    engine = CrossEncoderScorer(cfg, cfg.resolve_profile(), "cpu")
    engine.load()
    reqs = [json.loads(b) for b in bodies_for("score", PAIRS)[1]]
    pairs = [(r["query"]["text"], it["text"]) for r in reqs for it in r["items"]]
    out = {}
    for size in (16, 32, 64, 128):
        batch = pairs[:size]
        out[size] = rate(
            lambda b=batch: len(engine.score(b, instruction=None, options={})), seconds
        )
        print(f"  raw score, {size:3d} pairs per call: {out[size]:8.1f} pairs/s", flush=True)
    return out


def raw_extract(seconds: float) -> dict[int, float]:
    from sie.core.config import parse_model_config
    from sie.engines.extractors.token_classification import OnnxTokenClassifier

    cfg = parse_model_config((ROOT / "configs" / "nationaldesignstudio__rampart.yaml").read_text())
    engine = OnnxTokenClassifier(cfg, cfg.resolve_profile(), "cpu")
    engine.load()
    texts = [json.loads(b)["items"][0]["text"] for b in bodies_for("extract", 0)[1]]
    out = {}
    for size in (1, 8, 32):
        batch = texts[:size]
        out[size] = rate(lambda b=batch: len(engine.extract(b, labels=None, options={})), seconds)
        print(f"  raw extract, {size:2d} texts per call: {out[size]:8.1f} texts/s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from tests.distill import build_distilled_cross_encoder

    cache = Path(os.environ.get("SIE_TEST_MODEL_CACHE", ROOT / ".cache" / "test-models"))
    weights = build_distilled_cross_encoder(cache / "cross-encoder-distilled")
    raw_s = min(args.seconds, 5.0)
    print("raw engines:", flush=True)
    score_raw = raw_score(weights, raw_s)
    extract_raw = raw_extract(raw_s)

    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp)
        for f in (ROOT / "configs").glob("*.yaml"):
            shutil.copy(f, models / f.name)
        (models / "reranker.yaml").write_text(reranker_config_yaml(RERANKER, weights))
        port = free_port()
        proc = start_server(port, preload=[RERANKER, RAMPART], models_dir=models)
        try:
            run_load(port, RERANKER, 8, 2.0, kind="score", pairs=PAIRS)  # warm-up
            run_load(port, RAMPART, 8, 2.0, kind="extract")
            s8 = run_load(port, RERANKER, 8, args.seconds, kind="score", pairs=PAIRS)
            e = {c: run_load(port, RAMPART, c, args.seconds, kind="extract") for c in (8, 32)}
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)

    best_s = max(score_raw.values())
    best_e = max(extract_raw.values())
    served_pairs = s8["rps"] * PAIRS
    print()
    print(
        f"score:   raw best {best_s:8.1f} pairs/s | served (8 connections, {PAIRS} pairs per "
        f"request) {served_pairs:8.1f} pairs/s, p50 {s8['p50_ms']:.1f} ms, errors "
        f"{int(s8['errors'])} | ratio {served_pairs / best_s:.2f}x"
    )
    for c, r in e.items():
        print(
            f"extract: raw best {best_e:8.1f} texts/s | served ({c:2d} connections, 1 text per "
            f"request) {r['rps']:8.1f} texts/s, p50 {r['p50_ms']:.1f} ms, errors "
            f"{int(r['errors'])} | ratio {r['rps'] / best_e:.2f}x"
        )


if __name__ == "__main__":
    main()
