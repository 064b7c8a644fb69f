"""The ``sie`` client commands, on the SDK (docs/sdk.md "Command line").

    sie models                              models and their states
    sie encode MODEL TEXT...                embed texts
    sie score MODEL QUERY DOC...            rank documents against a query
    sie config apply FILE                   write a model config (config role)
    sie config status MODEL                 which workers applied it
    sie pools list | get NAME | create NAME --gpus PROFILE=N ... | delete NAME

Human tables by default; ``--json`` prints one JSON document for scripts. The gateway
is ``--url`` (``SIE_GATEWAY_URL``, default ``http://127.0.0.1:8080``); the config role
``--config-url`` (``SIE_CONFIG_SERVICE_URL``, default the gateway's port + 1). Tokens
come from the server's variables: ``SIE_AUTH_TOKEN`` (or ``SIE_AUTH_TOKENS``) for
reads and inference, ``SIE_ADMIN_TOKEN`` for pool and config writes.

Exit status: 0 done, 1 the server refused (the error's code and message on stderr),
2 a usage error, 3 the server could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CLIENT_COMMANDS", "add_client_commands", "render_table", "run_client"]

CLIENT_COMMANDS = frozenset({"models", "encode", "score", "config", "pools"})


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--url", help="gateway URL [SIE_GATEWAY_URL, default http://127.0.0.1:8080]")
    p.add_argument(
        "--config-url", help="config role URL [SIE_CONFIG_SERVICE_URL, default gateway port + 1]"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP attempt")
    return p


#: encode/score: how long retries may go on (the SDK's default is 900 s; a command
#: line wants an answer sooner)
_BUDGET: tuple[tuple[str, ...], dict[str, Any]] = (
    ("--provision-timeout",),
    {
        "type": float,
        "default": 60.0,
        "metavar": "S",
        "help": "seconds to keep retrying retryable answers (default 60)",
    },
)


def add_client_commands(sub: Any) -> None:
    """Add the client subcommands to ``sie``'s subparsers."""
    common = _common()
    sub.add_parser("models", parents=[common], help="list the models and their states")
    e = sub.add_parser("encode", parents=[common], help="embed texts with a model")
    e.add_argument("model")
    e.add_argument("texts", nargs="+", metavar="TEXT")
    e.add_argument(
        "--output-type",
        dest="output_types",
        action="append",
        choices=["dense", "sparse", "multivector"],
        help="output to return (repeatable; default dense)",
    )
    e.add_argument(
        "--dtype",
        choices=["float32", "float16", "int8", "uint8", "binary", "ubinary"],
        help="output dtype",
    )
    e.add_argument("--query", action="store_true", help="encode as queries (is_query)")
    e.add_argument("--gpu", help="route to PROFILE or POOL/PROFILE")
    e.add_argument(*_BUDGET[0], **_BUDGET[1])
    s = sub.add_parser("score", parents=[common], help="rank documents against a query")
    s.add_argument("model")
    s.add_argument("query")
    s.add_argument("docs", nargs="+", metavar="DOC")
    s.add_argument("--top-k", type=int, help="keep the best K")
    s.add_argument("--gpu", help="route to PROFILE or POOL/PROFILE")
    s.add_argument(*_BUDGET[0], **_BUDGET[1])
    c = sub.add_parser("config", help="model configs (apply, status)")
    csub = c.add_subparsers(dest="action", required=True)
    a = csub.add_parser("apply", parents=[common], help="write a model config YAML file")
    a.add_argument("file", help="YAML file ('-' reads stdin)")
    a.add_argument("--idempotency-key", help="replays with this key return the first answer")
    st = csub.add_parser("status", parents=[common], help="which workers applied a model config")
    st.add_argument("model")
    pools = sub.add_parser("pools", help="pools (list, get, create, delete)")
    psub = pools.add_subparsers(dest="action", required=True)
    psub.add_parser("list", parents=[common], help="every pool")
    g = psub.add_parser("get", parents=[common], help="one pool")
    g.add_argument("name")
    cr = psub.add_parser("create", parents=[common], help="create (or renew) a pool")
    cr.add_argument("name")
    cr.add_argument(
        "--gpus",
        nargs="+",
        required=True,
        metavar="PROFILE=N",
        help="machine profile = workers needed",
    )
    cr.add_argument("--gpu-caps", nargs="+", metavar="PROFILE=N", help="most workers assigned")
    cr.add_argument("--bundle")
    cr.add_argument("--queue-pool")
    cr.add_argument("--ttl", type=int, dest="ttl_seconds", help="lease seconds (not renewed)")
    cr.add_argument("--minimum-worker-count", type=int)
    cr.add_argument("--pin", action="append", dest="pinned_models", metavar="MODEL")
    d = psub.add_parser("delete", parents=[common], help="delete a pool")
    d.add_argument("name")


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _plain(obj: Any) -> Any:
    """JSON-ready: numpy arrays and scalars as lists and numbers."""
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _counts(values: Sequence[str] | None) -> dict[str, int]:
    out = {}
    for v in values or []:
        key, sep, num = v.partition("=")
        if not sep or not num.strip().isdigit():
            raise SystemExit(f"sie pools create: {v!r} must be PROFILE=N")
        out[key.strip()] = int(num)
    return out


def _preview(values: Any) -> str:
    flat = np.asarray(values).ravel()
    head = ", ".join(f"{x:.4f}" if flat.dtype.kind == "f" else str(x) for x in flat[:4])
    return f"[{head}{', …' if flat.size > 4 else ''}]"


def _models(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    models = client.list_models()
    rows = [
        (m["name"], m.get("state"), ",".join(m.get("outputs", [])), m.get("pool") or "")
        for m in models
    ]
    return models, render_table(["MODEL", "STATE", "OUTPUTS", "POOL"], rows)


def _encode(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    results = client.encode(
        args.model,
        [{"text": t} for t in args.texts],
        output_types=args.output_types,
        output_dtype=args.dtype,
        is_query=True if args.query else None,
        gpu=args.gpu,
        provision_timeout_s=args.provision_timeout,
    )
    rows = []
    for i, (text, r) in enumerate(zip(args.texts, results, strict=True)):
        for kind in ("dense", "sparse", "multivector"):
            if kind not in r:
                continue
            arr = r[kind]["values"] if kind == "sparse" else r[kind]
            shape = f"{len(arr)} active" if kind == "sparse" else "x".join(map(str, arr.shape))
            rows.append((i, _short(text), kind, shape, np.asarray(arr).dtype, _preview(arr)))
    table = render_table(["#", "TEXT", "OUTPUT", "SHAPE", "DTYPE", "VALUES"], rows)
    return {"model": args.model, "items": results}, table


def _score(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    docs = [{"id": str(i), "text": d} for i, d in enumerate(args.docs)]
    result = client.score(
        args.model,
        {"text": args.query},
        docs,
        top_k=args.top_k,
        gpu=args.gpu,
        provision_timeout_s=args.provision_timeout,
    )
    rows = [
        (s["rank"] + 1, f"{s['score']:.4f}", s["item_id"], _short(args.docs[int(s["item_id"])], 60))
        for s in result["scores"]
    ]
    return result, render_table(["RANK", "SCORE", "DOC", "TEXT"], rows)


def _config(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "apply":
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        out = client.apply_config(text, idempotency_key=args.idempotency_key)
        rows: list[tuple[Any, ...]] = [
            ("model", out.get("model_id")),
            ("created profiles", ", ".join(out.get("created_profiles", [])) or "-"),
            ("already there", ", ".join(out.get("existing_profiles_skipped", [])) or "-"),
            ("epoch", out.get("epoch")),
            *[("warning", w) for w in out.get("warnings", [])],
        ]
        return out, render_table(["FIELD", "VALUE"], rows)
    out = client.config_status(args.model)
    rows = [
        (
            b.get("bundle_id"),
            b.get("pool", ""),
            "yes" if b.get("acked") else "no",
            len(b.get("acked_workers", [])),
            b.get("total_eligible_workers"),
            ",".join(b.get("pending_workers", [])) or "-",
        )
        for b in out.get("bundles", [])
    ]
    head = (
        f"{out.get('model_id')}: config epoch {out.get('config_epoch')}, "
        f"all bundles acked: {'yes' if out.get('all_bundles_acked') else 'no'}\n"
    )
    table = render_table(["BUNDLE", "POOL", "ACKED", "ACKS", "ELIGIBLE", "PENDING"], rows)
    return out, head + table


def _pool_rows(pools: Sequence[Any]) -> str:
    rows = []
    for p in pools:
        spec, status = p.get("spec", {}), p.get("status", {})
        gpus = ",".join(f"{k}={v}" for k, v in spec.get("gpus", {}).items()) or "-"
        workers = ",".join(w.get("name", "") for w in status.get("assigned_workers", [])) or "-"
        ttl = spec.get("ttl_seconds")
        rows.append((spec.get("name"), status.get("state"), gpus, workers, ttl or "-"))
    return render_table(["POOL", "STATE", "GPUS", "WORKERS", "TTL_S"], rows)


def _pools(client: Any, args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "list":
        pools = client.list_pools()
        return pools, _pool_rows(pools)
    if args.action == "get":
        pool = client.get_pool(args.name)
        if pool is None:
            from sie.client import PoolError

            raise PoolError(
                f"pool {args.name!r} not found",
                pool_name=args.name,
                code="POOL_NOT_FOUND",
                status_code=404,
            )
        return pool, _pool_rows([pool])
    if args.action == "create":
        info = client.create_pool(
            args.name,
            _counts(args.gpus),
            bundle=args.bundle,
            minimum_worker_count=args.minimum_worker_count,
            ttl_seconds=args.ttl_seconds,
            gpu_caps=_counts(args.gpu_caps) or None,
            queue_pool=args.queue_pool,
            pinned_models=args.pinned_models,
            renew=False,  # the command exits: nothing would keep renewing
        )
        return info, _pool_rows([info])
    deleted = client.delete_pool(args.name)
    out = {"name": args.name.strip().lower(), "deleted": deleted}
    return out, f"pool {out['name']}: {'deleted' if deleted else 'not found'}"


HANDLERS = {
    "models": _models,
    "encode": _encode,
    "score": _score,
    "config": _config,
    "pools": _pools,
}


def run_client(args: argparse.Namespace) -> int:
    """Run a client command; print its result; the exit status."""
    from sie.client import SIEClient, SIEConnectionError, SIEError, StatusError
    from sie.settings import client_settings

    try:
        env = client_settings(gateway_url=args.url, config_service_url=args.config_url)
    except ValueError as exc:
        print(f"sie {args.command}: invalid settings: {exc}", file=sys.stderr)
        return 2
    try:
        with SIEClient(
            env.gateway_url,
            timeout_s=args.timeout,
            api_key=env.inference_token(),
            admin_key=env.admin_token_value(),
            config_url=env.config_service_url,
        ) as client:
            result, text = HANDLERS[args.command](client, args)
    except SIEConnectionError as exc:
        print(
            f"sie {args.command}: cannot reach the server at {env.gateway_url}: {exc} "
            "(set --url after the command, or SIE_GATEWAY_URL)",
            file=sys.stderr,
        )
        return 3
    except SIEError as exc:
        code = exc.code if isinstance(exc, StatusError) else type(exc).__name__
        status = f"{exc.status_code} " if isinstance(exc, StatusError) else ""
        print(f"sie {args.command}: {status}{code}: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:  # the config file
        print(f"sie {args.command}: {exc}", file=sys.stderr)
        return 2
    emit(json.dumps(_plain(result), indent=2) if args.json else text)
    return 0


def emit(text: str) -> None:
    """Print a command's result. A reader that stops early (``sie models | head``)
    closes the pipe: the rest is dropped quietly, with no traceback, and stdout points
    at the null device so that the interpreter's flush at exit cannot fail either."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
