"""The gateway's HTTP app (architecture §14): inference, models, health.

Routes:
    POST /v1/encode/{model:path}   SIE-native encode (JSON or msgpack in and out)
    POST /v1/score/{model:path}    rerank (sie.http.inference)
    POST /v1/extract/{model:path}  entity extraction (sie.http.inference)
    POST /v1/embeddings            OpenAI-compatible (sie.http.openai)
    POST /v1/chat/completions, /v1/completions, /v1/generate/{model}: generation
                                   (sie.http.generation)
    GET  /v1/models                {"object": "list", "data": [OpenAI model], "models": [ModelInfo]}
    GET  /v1/models/{model:path}   OpenAI model object + ModelInfo (docs/api.md §7); 404 MODEL_NOT_FOUND
    GET  /healthz                  liveness, text ``ok``
    GET  /readyz                   ``ok`` while serving; 503 ``draining`` during shutdown (§4)
    GET  /health                   workers and their loaded models (JSON)
    GET  /metrics                  Prometheus text
    /v1/pools...                   the pool API (sie.http.pools)
    GET  /                         the operator's status page (sie.http.status)
    GET  /v1/cluster/status        workers, models, pools, lanes, capacity (JSON, docs/api.md §13)
    WS   /ws/cluster-status        the same, pushed on connect and on every change
    /v1/rerank, /v2/rerank, /embed, /embed_sparse, /rerank, /info, /version, and
    /v1/{encode,score,extract} with the model in the body: drop-in routes (sie.http.dropin)
    GET  /openapi.json, /docs      this API's OpenAPI 3.1 document and its page (docs/api.md §14)
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sie import __version__
from sie.control import catalog
from sie.core.errors import SieError
from sie.core.ids import uuid7
from sie.core.registry import ModelEntry
from sie.http.access import AccessLog
from sie.http.auth import AuthMiddleware, AuthPolicy, gateway_decision
from sie.http.compat import openai_lookup_error
from sie.http.dropin import dropin_refusal, dropin_routes
from sie.http.errors import (
    EXCEPTION_HANDLERS,
    OPENAI_PATHS,
    CatchAll,
    openai_error,
    sie_error_response,
)
from sie.http.generation import chat_completions, completions, generate
from sie.http.inference import encode, extract, score
from sie.http.limits import BodyBudget, RequestLimits
from sie.http.negotiation import read_payload
from sie.http.openai import embeddings
from sie.http.openapi import api_routes
from sie.http.openapi_gateway import gateway_table
from sie.http.pools import pool_routes
from sie.http.status import BrowserAuth, StatusFeed, capacity, status_routes
from sie.roles.gateway import GatewayRole
from sie.telemetry import METRICS, Metrics

__all__ = ["build_gateway_app", "model_info"]


class ResponseHeaders:
    """Every response carries ``X-SIE-Version`` / ``X-SIE-Server-Version``; every
    ``/v1/`` response, errors included, carries the request's ``X-SIE-Request-Id``
    (a UUIDv7 minted here, readable as ``request.state.request_id``) (§16.2)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid7() if str(scope.get("path", "")).startswith("/v1/") else None
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                v = __version__.encode()
                extra = [(b"x-sie-version", v), (b"x-sie-server-version", v)]
                if request_id is not None:
                    extra.append((b"x-sie-request-id", request_id.encode()))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def model_info(entry: ModelEntry, gateway: GatewayRole) -> dict[str, Any]:
    """ModelInfo (docs/api.md §7) plus the routing facts ``bundles`` and ``pool``, the
    workers' ``loads`` / ``evictions`` counts and the ``engines`` they serve it with."""
    cfg = entry.config
    state, last_error = gateway.directory.model_state(entry.model_id)
    is_variant = entry.model_id != cfg.sie_id
    return {
        "name": entry.model_id,
        "inputs": [k for k, v in cfg.inputs.model_dump().items() if v],
        "outputs": cfg.outputs,
        "dims": cfg.dims,
        "loaded": state == "loaded",
        "state": state,
        "last_error": last_error,
        "max_sequence_length": cfg.max_sequence_length,
        # the profile this id serves is its default: a variant serves its own, the base
        # id the one SIE_DEFAULT_PROFILES names (docs/performance.md "Choosing a MiniLM
        # profile"), else ``default``
        "profiles": {entry.profile.name: {"is_default": True}}
        if is_variant
        else {p: {"is_default": p == entry.profile.name} for p in cfg.profiles},
        "bundles": list(entry.bundles),
        "pool": cfg.effective_pool,
        **gateway.directory.model_counts(entry.model_id),  # loads, evictions (docs/api.md §10)
        # the engine a profile that picks one at load serves (fastest: onnx-int8, ...)
        "engines": gateway.directory.model_engines(entry.model_id),
    }


async def list_models(request: Request) -> Response:
    gateway: GatewayRole = request.app.state.gateway
    entries = sorted(gateway.registry.snapshot.entries.values(), key=lambda e: e.model_id)
    created = int(gateway.started_at)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"id": e.model_id, "object": "model", "created": created, "owned_by": "sie"}
                for e in entries
            ],
            "models": [model_info(e, gateway) for e in entries],
        }
    )


async def get_model(request: Request) -> Response:
    """The OpenAI model object (``models.retrieve(id).id``) with ModelInfo's fields
    beside it; a 404 in OpenAI's envelope beside SIE's ``detail`` (docs/api.md §7)."""
    gateway: GatewayRole = request.app.state.gateway
    try:
        entry, _ = gateway.registry.resolve(request.path_params["model"])
    except SieError as exc:
        return openai_lookup_error(exc)
    created = int(gateway.started_at)
    openai = {"id": entry.model_id, "object": "model", "created": created, "owned_by": "sie"}
    return JSONResponse({**openai, **model_info(entry, gateway)})


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def readyz(request: Request) -> Response:
    if request.app.state.draining:
        return PlainTextResponse("draining", status_code=503)
    return PlainTextResponse("ok")


async def health(request: Request) -> Response:
    gateway: GatewayRole = request.app.state.gateway
    now = time.time()
    workers = gateway.live_workers()
    models: dict[str, dict[str, Any]] = {}
    for hb in workers:
        for m in hb.models:
            agg = models.setdefault(m.name, {"name": m.name, "states": {}, "workers": []})
            agg["workers"].append(hb.worker_id)
            agg["states"][hb.worker_id] = m.state
    return JSONResponse(
        {
            "status": "healthy" if any(w.ready for w in workers) else "degraded",
            "type": "gateway",
            "version": __version__,
            "router_id": gateway.router_id,
            "uptime_s": round(now - gateway.started_at, 3),
            **capacity(gateway, workers),  # as the SDK's get_capacity reads it
            "workers": [
                {
                    "worker_id": hb.worker_id,
                    "ready": hb.ready,
                    "pool": hb.pool,
                    "machine_profile": hb.machine_profile,
                    "bundle": hb.bundle,
                    "bundle_config_hash": hb.bundle_config_hash,
                    "models": [m.to_map() for m in hb.models],
                    "last_heartbeat_age_s": round(max(0.0, now - hb.timestamp), 3),
                }
                for hb in sorted(workers, key=lambda h: h.worker_id)
            ],
            "models": sorted(models.values(), key=lambda m: m["name"]),
        }
    )


async def metrics_endpoint(request: Request) -> Response:
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


YAML = "application/yaml"


def _gw(request: Request) -> GatewayRole:
    gateway: GatewayRole = request.app.state.gateway
    return gateway


async def config_models(request: Request) -> Response:
    return JSONResponse(catalog.list_models(_gw(request).registry.snapshot))


async def config_model(request: Request) -> Response:
    """Model YAML, or worker-ack status for ``{id}/status`` when ``{id}`` is a known
    model; otherwise the whole path is read as a model id (architecture §5)."""
    gateway = _gw(request)
    path: str = request.path_params["model"]
    snap = gateway.registry.snapshot
    if path.endswith("/status") and path[: -len("/status")] in snap.configs:
        return JSONResponse(gateway.model_status(path[: -len("/status")]))
    return PlainTextResponse(await catalog.model_yaml_async(snap, path), media_type=YAML)


async def config_bundles(request: Request) -> Response:
    gateway = _gw(request)
    return JSONResponse(
        catalog.list_bundles(gateway.registry.snapshot, gateway.directory.connected())
    )


async def config_bundle(request: Request) -> Response:
    snap = _gw(request).registry.snapshot
    return PlainTextResponse(
        catalog.bundle_yaml(snap, request.path_params["bundle"]), media_type=YAML
    )


async def config_resolve(request: Request) -> Response:
    body = await read_payload(request, 1024 * 1024)
    return JSONResponse(catalog.resolve(_gw(request).registry.snapshot, body))


def _refuse(scope: Scope, err: SieError) -> Response:
    path = str(scope.get("path", ""))
    if (dropin := dropin_refusal(path, err)) is not None:
        return dropin
    if path.startswith(OPENAI_PATHS):
        return openai_error(err)
    return sie_error_response(err)


def build_gateway_app(
    gateway: GatewayRole,
    metrics: Metrics = METRICS,
    policy: AuthPolicy | None = None,
    budget: BodyBudget | None = None,
) -> Starlette:
    """The gateway Starlette app. ``app.state.draining`` flips ``/readyz`` to 503.

    ``budget``: the process-wide request-body budget (``sie.http.limits``; a private
    one of ``max_inflight_body_bytes`` when None).

    Config routes are read-only (architecture §5, §12): ``POST /v1/configs/models``
    is 405; ``/v1/configs/export`` and ``/v1/configs/epoch`` are not served (404).
    """
    limits_budget = budget or BodyBudget(gateway.limits.max_inflight_body_bytes)
    policy = policy or AuthPolicy()
    app = Starlette(
        routes=[
            Route("/v1/configs/models", config_models, methods=["GET"]),
            Route("/v1/configs/models/{model:path}", config_model, methods=["GET"]),
            Route("/v1/configs/bundles", config_bundles, methods=["GET"]),
            Route("/v1/configs/bundles/{bundle}", config_bundle, methods=["GET"]),
            Route("/v1/configs/resolve", config_resolve, methods=["POST"]),
            Route("/v1/encode/{model:path}", encode, methods=["POST"]),
            Route("/v1/score/{model:path}", score, methods=["POST"]),
            Route("/v1/extract/{model:path}", extract, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/generate/{model:path}", generate, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", get_model, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            *pool_routes(),
            *status_routes(),
            *dropin_routes(),  # Cohere/Jina, TEI, /version, model in the body (docs/api.md §15)
            *api_routes(gateway_table),  # /openapi.json, /docs (docs/api.md §14)
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[
            Middleware(
                RequestLimits,
                budget=limits_budget,
                body_timeout_s=gateway.limits.http_body_timeout_s,
                respond=_refuse,
                large_body_reads=gateway.limits.max_large_body_reads,
            ),
            Middleware(CatchAll),
            # websocket scopes and ``?token=`` on the page (AuthMiddleware sees HTTP only)
            Middleware(BrowserAuth, policy=policy, decide=gateway_decision, respond=_refuse),
            Middleware(
                AuthMiddleware,
                policy=policy,
                decide=gateway_decision,
                respond=_refuse,
            ),
        ],
    )
    app.state.gateway = gateway
    app.state.metrics = metrics
    app.state.body_budget = limits_budget
    app.state.draining = False
    app.state.status_feed = StatusFeed(gateway)
    app.add_middleware(ResponseHeaders)
    # outermost: the request's span is current for everything inside, and the access
    # line sees every answer, refusals included (docs/observability.md)
    app.add_middleware(AccessLog, sample=gateway.settings.access_log_sample)
    return app
