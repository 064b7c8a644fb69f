"""The report of ``bench_peers.py``: its tables and issue 16's acceptance ratios.

``table`` (every load, every server, with its ratio to SIE torch), ``cores_table``
(where the cores went during each single-text load: ``_cpu.CpuWatch``), ``raw_table``
(the raw engines alone), ``ceiling`` (the most requests/s the measured costs leave on
this machine's cores at 32 x 1) and ``checks`` (the acceptance lines). Servers are
``bench_peers.Server`` objects (``key``, ``name``, ``result``); their ``result["loads"]``
maps ``"{conns}x{texts}"`` to what ``_embeddings_load.run_load`` returned, plus
``cores``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["LOADS", "ceiling", "checks", "cores_table", "raw_table", "table"]

#: (connections, texts per request)
LOADS: tuple[tuple[int, int], ...] = ((1, 1), (8, 1), (32, 1), (4, 32))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(servers: Sequence[Any]) -> str:
    ref = next((s.result for s in servers if s.key == "sie-torch"), {})
    lines = [
        "| load | server | emb/s | req/s | p50 ms | p99 ms | x SIE torch | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for conns, texts in LOADS:
        label = f"{conns}x{texts}"
        base = ref.get("loads", {}).get(label, {}).get("emb_s")
        for s in servers:
            r = s.result.get("loads", {}).get(label)
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {conns} x {texts} | {s.name} | {_cell(r['error'])} | | | | | |")
                continue
            ratio = f"{r['emb_s'] / base:.2f}x" if base else "—"
            errs = f"{r['errors']}" + (f" ({_cell(r['error_sample'][:60])})" if r["errors"] else "")
            lines.append(
                f"| {conns} conn{'s' if conns > 1 else ''} x {texts} text{'s' if texts > 1 else ''}"
                f" | {s.name} | {r['emb_s']:.0f} | {r['req_s']:.1f} | {r['p50_ms']:.1f} "
                f"| {r['p99_ms']:.1f} | {ratio} | {errs} |"
            )
    for s in servers:
        if "error" in s.result:
            lines.append(f"| — | {s.name} | failed: {_cell(s.result['error'])} | | | | | |")
    return "\n".join(lines)


def cores_table(servers: Sequence[Any]) -> str:
    """Where the cores went during each single-text load (``_cpu.CpuWatch``): the
    server's main thread (SIE: the event loop) and its other threads (engine work), the
    load generator, the machine's idle cores, and the server's CPU per request."""
    lines = [
        "| load | server | req/s | server cores (main + other) | client | idle "
        "| server CPU ms/req (main) |",
        "|---|---|---|---|---|---|---|",
    ]
    for conns, texts in LOADS:
        if texts != 1:
            continue
        for s in servers:
            r = s.result.get("loads", {}).get(f"{conns}x{texts}") or {}
            c = r.get("cores")
            if not c or not r.get("req_s"):
                continue
            per = 1000.0 / r["req_s"]
            lines.append(
                f"| {conns} x {texts} | {s.name} | {r['req_s']:.0f} | {c['server']:.2f} "
                f"({c['main']:.2f} + {c['other']:.2f}) | {r.get('client_cpu', 0):.2f} "
                f"| {c['idle']:.2f} | {c['server'] * per:.2f} ({c['main'] * per:.2f}) |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def ceiling(served: dict[str, Any], raw_best: float) -> dict[str, float] | None:
    """The most requests/s a server could give at 32 x 1 on this machine's cores with
    this run's costs and no idle core: ``cores / (event loop + engine + client)`` CPU
    per request, the engine's at its raw best (``cores / raw_best``: every raw mode
    uses every core) and the loop's and client's as measured (None without them)."""
    c = served.get("cores")
    if not c or not served.get("req_s") or not raw_best:
        return None
    ncores = os.cpu_count() or 1
    per = 1000.0 / served["req_s"]
    loop_ms, client_ms = c["main"] * per, float(served.get("client_cpu") or 0.0) * per
    engine_ms = ncores * 1000.0 / raw_best
    top = ncores * 1000.0 / (loop_ms + engine_ms + client_ms)
    return {"loop_ms": loop_ms, "engine_ms": engine_ms, "client_ms": client_ms, "req_s": top}


def raw_table(raw: dict[str, Any]) -> str:
    if "error" in raw:
        return f"raw engines: {raw['error']}"
    modes = list(next(iter(raw.values())))
    lines = [
        "| raw engine, sentences/s | " + " | ".join(modes) + " | best |",
        "|---|" + "---|" * (len(modes) + 1),
    ]
    for name, rates in raw.items():
        cells = " | ".join(f"{rates[m]:.0f}" for m in modes)
        lines.append(f"| {name} | {cells} | {max(rates.values()):.0f} |")
    return "\n".join(lines)


def checks(servers: Sequence[Any], raw: dict[str, Any] | None = None) -> list[str]:
    """Issue 16's acceptance ratios that this run can speak to."""
    by = {s.key: s.result.get("loads", {}) for s in servers}

    def rate(key: str, label: str) -> float | None:
        r = by.get(key, {}).get(label, {})
        return r.get("emb_s") if r and "error" not in r else None

    out = []
    for label, bound in (("32x1", 2.0), ("1x1", 1.5)):
        a, b = rate("sie-onnx-int8", label), rate("infinity-onnx", label)
        if a and b:
            out.append(
                f"SIE ONNX int8 / infinity ONNX at {label}: {a / b:.2f}x (issue asks >= {bound}x)"
            )
    for key, profile in (("sie-onnx", "onnx"), ("sie-onnx-int8", "onnx-int8")):
        served, engine = rate(key, "32x1"), (raw or {}).get(profile)
        if served and isinstance(engine, dict) and engine:
            best = max(engine.values())
            out.append(
                f"{key} at 32x1 / the raw {profile} engine at its best: "
                f"{served / best:.2f}x"
                + (" (issue asks >= 0.9x)" if profile == "onnx" else "")
                + f"; at its best single call (bs 32): {served / engine.get('bs 32', best):.2f}x"
            )
            top = ceiling(by[key]["32x1"], best)
            if top:
                out.append(
                    f"  {key} ceiling at 32x1 on {os.cpu_count()} cores with no idle core: "
                    f"{top['req_s']:.0f} req/s = {top['req_s'] / best:.2f}x the raw best "
                    f"(CPU ms per request: event loop {top['loop_ms']:.2f} + engine at its raw "
                    f"best {top['engine_ms']:.2f} + client {top['client_ms']:.2f}); served "
                    f"{served / top['req_s']:.2f}x of it"
                )
    for s in servers:
        r = s.result.get("loads", {}).get("32x1", {})
        if s.key.startswith("sie") and r and "error" not in r and r["p50_ms"]:
            out.append(
                f"{s.name} at 32x1: p99/p50 = {r['p99_ms'] / r['p50_ms']:.2f} (issue asks <= 2.5)"
            )
    return out
