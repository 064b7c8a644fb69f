"""The cluster status (architecture §14; docs/api.md §13): one JSON document of workers,
models, pools and lanes, as this gateway sees them, and the operator's page showing it.

Routes (``status_routes``):
    GET /                    the status page (``static/status.html``, no external assets)
    GET /v1/cluster/status   the state, once
    WS  /ws/cluster-status   the state on connect, then each time it changes (checked every
                             ``POLL_S``; resent every ``KEEPALIVE_S``); closed with 1001
                             when the gateway drains

The state (``cluster_state``)::

    {"generated_at": epoch s, "version", "router_id", "uptime_s",
     "workers": [{"worker_id", "pool", "machine_profile", "bundle", "bundle_config_hash",
                  "ready", "healthy", "status": "ready"|"starting"|"lost",
                  "loaded_models": [name], "models": [{"name", "state", "bytes", "engine"}],
                  "queue_depth": int|null, "running": int|null, "last_seen_s"}],
     "models": [{"model_id", "state", "pool", "bundles", "loaded_on": n,
                 "workers": [{"worker_id", "state"}], "last_error"}],
     "pools": [PoolInfo, as GET /v1/pools],
     "lanes": [{"pool", "machine_profile", "bundle", "workers", "ready_workers",
                "in_flight", "pending_demand"}],
     "capacity": {"configured_gpu_types", "live_gpu_types", "cluster": {...}}}

``workers``: live ones and, for ``LOST_AFTER_S``, those no longer heard from (``lost``);
``queue_depth`` / ``running`` sum the generation engines' readings (null when none
reports); ``in_flight`` and ``pending_demand`` are this gateway's own. Auth: reads
(``sie.http.auth``), websocket scopes included, through ``BrowserAuth``.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any
from urllib.parse import urlsplit

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from sie import __version__
from sie.core.wire import Heartbeat, ModelStatus
from sie.http.pages import BrowserAuth, static_page
from sie.roles.gateway import GatewayRole

__all__ = ["BrowserAuth", "StatusFeed", "capacity", "cluster_state", "status_routes"]

#: Seconds between two looks at the state by a stream.
POLL_S = 1.0
#: Seconds after which a stream resends an unchanged state.
KEEPALIVE_S = 15.0
#: Seconds a worker no longer heard from stays listed as ``lost``.
LOST_AFTER_S = 60.0
#: Most concurrent streams per gateway; past it a stream is closed with 1013.
MAX_STREAMS = 64
#: Seconds one message to a stream may take to leave; a client that stops reading
#: loses its stream (and its slot) after that.
SEND_TIMEOUT_S = 10.0
#: Fields left out when comparing two states: they change on every look.
_VOLATILE = ("generated_at", "uptime_s", "last_seen_s")


def capacity(gateway: GatewayRole, workers: list[Heartbeat]) -> dict[str, Any]:
    """The capacity fields of ``GET /health``, as the SDK's ``get_capacity`` reads
    them (one accelerator per worker), from the live ``workers``."""
    loaded = {m.name for hb in workers for m in hb.models if m.state == "loaded"}
    return {
        "configured_gpu_types": sorted(gateway.pools.catalog.configured_gpus),
        "live_gpu_types": sorted({w.machine_profile.lower() for w in workers if w.ready}),
        "cluster": {
            "worker_count": len(workers),
            "gpu_count": sum(1 for w in workers if w.ready),
            "total_qps": round(gateway.requests.rate(), 3),
            "models_loaded": len(loaded),
        },
    }


def _worker(hb: Heartbeat, live: bool, age_s: float) -> dict[str, Any]:
    readings = [m.engine_state for m in hb.models if m.engine_state is not None]
    return {
        "worker_id": hb.worker_id,
        "pool": hb.pool,
        "machine_profile": hb.machine_profile,
        "bundle": hb.bundle,
        "bundle_config_hash": hb.bundle_config_hash,
        "ready": hb.ready,
        "healthy": live and hb.ready,
        "status": ("ready" if hb.ready else "starting") if live else "lost",
        "loaded_models": sorted(m.name for m in hb.models if m.state == "loaded"),
        "models": [
            {"name": m.name, "state": m.state, "bytes": m.bytes, "engine": m.engine}
            for m in sorted(hb.models, key=lambda m: m.name)
            if m.state != "available"
        ],
        "queue_depth": sum(r.waiting for r in readings) if readings else None,
        "running": sum(r.running for r in readings) if readings else None,
        "last_seen_s": round(age_s, 1),
    }


#: A model's state over the workers reporting it, first match wins (docs/api.md §7).
_PRECEDENCE = ("loading", "unloading", "loaded", "failed")


def _models(gateway: GatewayRole, live: list[Heartbeat]) -> list[dict[str, Any]]:
    entries = gateway.registry.snapshot.entries
    reports: dict[str, list[tuple[str, ModelStatus]]] = {}
    for hb in sorted(live, key=lambda h: h.worker_id):
        for m in hb.models:
            reports.setdefault(m.name, []).append((hb.worker_id, m))
    out = []
    for name in sorted({*entries, *reports}):
        entry, got = entries.get(name), reports.get(name, [])
        states = {m.state for _, m in got}
        errors = [m.last_error for _, m in got if m.last_error]
        workers = [{"worker_id": w, "state": m.state} for w, m in got if m.state != "available"]
        out.append(
            {
                "model_id": name,
                "state": next((s for s in _PRECEDENCE if s in states), "available"),
                "pool": entry.config.effective_pool if entry is not None else None,
                "bundles": list(entry.bundles) if entry is not None else [],
                "loaded_on": sum(1 for w in workers if w["state"] == "loaded"),
                "workers": workers,
                "last_error": errors[-1] if errors else None,
            }
        )
    return out


_LANE_COUNTS = ("workers", "ready_workers", "in_flight", "pending_demand")


def _lanes(gateway: GatewayRole, live: list[Heartbeat]) -> list[dict[str, Any]]:
    lanes: dict[tuple[str, str, str], dict[str, Any]] = {}

    def lane(key: tuple[str, str, str]) -> dict[str, Any]:
        fields = dict(zip(("pool", "machine_profile", "bundle"), key, strict=True))
        return lanes.setdefault(key, {**fields, **dict.fromkeys(_LANE_COUNTS, 0)})

    for hb in live:
        got = lane((hb.pool.lower(), hb.machine_profile.lower(), hb.bundle))
        got["workers"] += 1
        got["ready_workers"] += int(hb.ready)
    for key in gateway.pools.catalog.physical_lanes:
        lane(key)
    for key, n in gateway.lanes.in_flight.items():
        lane(key)["in_flight"] = n
    for key, n in gateway.lanes.pending_demand().items():
        lane(key)["pending_demand"] = n
    return [lanes[k] for k in sorted(lanes)]


def cluster_state(gateway: GatewayRole) -> dict[str, Any]:
    """The state document (module docstring), built from what ``gateway`` holds now."""
    now, mono = time.time(), time.monotonic()
    directory = gateway.directory
    live = directory.live()
    workers = [
        _worker(v.heartbeat, directory.is_live(wid), mono - v.seen_at)
        for wid, v in sorted(directory.workers.items())
        if mono - v.seen_at <= LOST_AFTER_S or directory.is_live(wid)
    ]
    return {
        "generated_at": round(now, 3),
        "version": __version__,
        "router_id": gateway.router_id,
        "uptime_s": round(now - gateway.started_at, 1),
        "workers": workers,
        "models": _models(gateway, live),
        "pools": gateway.pools.list(),
        "lanes": _lanes(gateway, live),
        "capacity": capacity(gateway, live),
    }


def _fingerprint(state: dict[str, Any]) -> str:
    """``state`` less the fields that change on every look, for change detection."""
    stable = {k: v for k, v in state.items() if k not in _VOLATILE}
    stable["workers"] = [
        {k: v for k, v in w.items() if k not in _VOLATILE} for w in state["workers"]
    ]
    return json.dumps(stable, sort_keys=True, default=str)


class StatusFeed:
    """The state shared by every stream of one app: rebuilt at most every ``POLL_S / 2``
    however many streams look; ``streams`` counts the open ones."""

    def __init__(self, gateway: GatewayRole) -> None:
        self.gateway = gateway
        self.streams = 0
        self._built = (-1e9, "", "")  # (monotonic s, JSON text, fingerprint)

    def current(self) -> tuple[str, str]:
        """(the state as JSON text, its fingerprint)."""
        mono = time.monotonic()
        if mono - self._built[0] >= POLL_S / 2:
            state = cluster_state(self.gateway)
            self._built = (mono, json.dumps(state), _fingerprint(state))
        return self._built[1], self._built[2]


async def cluster_status(request: Request) -> Response:
    return JSONResponse(cluster_state(request.app.state.gateway))


async def cluster_stream(ws: WebSocket) -> None:
    """``/ws/cluster-status``: until the client leaves or the gateway drains. Messages
    the client sends are read and dropped."""
    feed: StatusFeed = ws.app.state.status_feed
    if not same_origin(ws):  # another site's page may not read the cluster (CSWSH)
        await ws.close(code=1008, reason="cross-origin websocket refused")
        return
    await ws.accept()
    if feed.streams >= MAX_STREAMS:
        await ws.close(code=1013, reason="too many status streams; retry later")
        return
    feed.streams += 1
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_until_client_leaves, ws, tg.cancel_scope)
            if await _push(ws, feed):
                with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
                    await ws.close(code=1001, reason="the gateway is shutting down")
            tg.cancel_scope.cancel()
    finally:
        feed.streams -= 1


async def _until_client_leaves(ws: WebSocket, scope: anyio.CancelScope) -> None:
    with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
        while (await ws.receive())["type"] != "websocket.disconnect":
            pass
    scope.cancel()


async def _push(ws: WebSocket, feed: StatusFeed) -> bool:
    """Send changes until the app drains (True) or a send fails: the client left (False)."""
    last_key, last_sent = "", 0.0
    try:
        while not ws.app.state.draining:
            text, key = feed.current()
            if key != last_key or time.monotonic() - last_sent >= KEEPALIVE_S:
                with anyio.fail_after(SEND_TIMEOUT_S):  # a client that stops reading
                    await ws.send_text(text)
                last_key, last_sent = key, time.monotonic()
            await anyio.sleep(POLL_S)
    except (WebSocketDisconnect, OSError, RuntimeError, TimeoutError):
        return False
    return True


def same_origin(ws: WebSocket) -> bool:
    """Whether a browser's ``Origin`` (absent for non-browser clients) names the host
    the request was sent to (``Host``)."""
    origin = ws.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc.lower() == ws.headers.get("host", "").lower()


async def status_page(request: Request) -> Response:
    return static_page("status.html")


def status_routes() -> list[BaseRoute]:
    """The page, the state and the stream, for ``build_gateway_app`` (which also sets
    ``app.state.status_feed = StatusFeed(gateway)``)."""
    return [
        Route("/", status_page, methods=["GET"]),
        Route("/v1/cluster/status", cluster_status, methods=["GET"]),
        WebSocketRoute("/ws/cluster-status", cluster_stream),
    ]
