"""The config role's HTTP app (architecture §3, §5, §14 "sie-config"; docs/api.md §8).

Routes: ``POST /v1/configs/models`` (YAML body, admin), ``GET /v1/configs/models``,
``GET /v1/configs/models/{id}`` (YAML), ``GET /v1/configs/bundles``,
``GET /v1/configs/bundles/{id}`` (YAML), ``POST /v1/configs/resolve``,
``GET /v1/configs/export`` (admin), ``GET /v1/configs/epoch``, ``/healthz``,
``/readyz``, ``/metrics``, ``/openapi.json`` and ``/docs`` (docs/api.md §14).

Errors: ``{"detail": {"code": "CONTENT_CONFLICT", "error": "content_conflict",
"message": ..., ...}}`` (``error`` is the sie-config slug), with ``X-SIE-Error-Code``
and ``Retry-After`` where retryable.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Scope

from sie.control import catalog
from sie.control.authority import MAX_CONFIG_BODY_BYTES
from sie.core.errors import SieError
from sie.http.auth import AuthMiddleware, AuthPolicy, config_decision
from sie.http.errors import CatchAll, ErrorJSONResponse, error_headers
from sie.http.limits import BodyBudget, RequestLimits
from sie.http.negotiation import check_charset, read_body, read_payload
from sie.http.openapi import api_routes
from sie.http.openapi_config import config_table
from sie.http.pages import BrowserAuth
from sie.roles.config import ConfigRole
from sie.telemetry import Metrics

__all__ = ["build_config_app", "config_error_response"]

YAML = "application/yaml"


def config_error_response(exc: SieError) -> JSONResponse:
    detail = {"code": exc.code, "error": exc.code.lower(), **exc.to_detail()}
    return ErrorJSONResponse({"detail": detail}, status_code=exc.status, headers=error_headers(exc))


async def _sie_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SieError)
    return config_error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(
        exc.status_code, f"HTTP_{exc.status_code}"
    )
    detail = {
        "code": code,
        "error": code.lower(),
        "message": f"{exc.detail}: {request.method} {request.url.path}",
    }
    return ErrorJSONResponse(
        {"detail": detail},
        status_code=exc.status_code,
        headers={**(exc.headers or {}), "X-SIE-Error-Code": code},
    )


def _role(request: Request) -> ConfigRole:
    role: ConfigRole = request.app.state.role
    return role


async def add_model(request: Request) -> Response:
    role = _role(request)
    check_charset(request.headers.get("content-type"))  # YAML is read as UTF-8 only
    body = await read_body(request, MAX_CONFIG_BODY_BYTES)
    status, reply = await role.authority.write(body, request.headers.get("idempotency-key"))
    return JSONResponse(reply, status_code=status)


async def list_models(request: Request) -> Response:
    snap = _role(request).authority.require_registry().snapshot
    return JSONResponse(catalog.list_models(snap))


async def get_model(request: Request) -> Response:
    snap = _role(request).authority.require_registry().snapshot
    return PlainTextResponse(
        await catalog.model_yaml_async(snap, request.path_params["model"]), media_type=YAML
    )


async def list_bundles(request: Request) -> Response:
    snap = _role(request).authority.require_registry().snapshot
    return JSONResponse(catalog.list_bundles(snap))


async def get_bundle(request: Request) -> Response:
    snap = _role(request).authority.require_registry().snapshot
    return PlainTextResponse(
        catalog.bundle_yaml(snap, request.path_params["bundle"]), media_type=YAML
    )


async def resolve(request: Request) -> Response:
    snap = _role(request).authority.require_registry().snapshot
    return JSONResponse(catalog.resolve(snap, await read_payload(request, MAX_CONFIG_BODY_BYTES)))


async def export(request: Request) -> Response:
    return JSONResponse(await _role(request).authority.export())


async def epoch(request: Request) -> Response:
    return JSONResponse(_role(request).authority.epoch_info())


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    _role(request).authority.require_registry()
    return JSONResponse({"status": "ready"})


async def metrics(request: Request) -> Response:
    m: Metrics = request.app.state.metrics
    m.config_epoch.labels("config").set(_role(request).authority.epoch.get())
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


def _refuse(scope: Scope, err: SieError) -> Response:
    return config_error_response(err)


def build_config_app(
    role: ConfigRole,
    metrics_: Metrics,
    policy: AuthPolicy | None = None,
    budget: BodyBudget | None = None,
    body_timeout_s: float = 60.0,
) -> Starlette:
    """The config role's Starlette app; ``budget`` as in ``build_gateway_app``."""
    policy = policy or AuthPolicy()
    app = Starlette(
        routes=[
            Route("/v1/configs/models", list_models, methods=["GET"]),
            Route("/v1/configs/models", add_model, methods=["POST"]),
            Route("/v1/configs/models/{model:path}", get_model, methods=["GET"]),
            Route("/v1/configs/bundles", list_bundles, methods=["GET"]),
            Route("/v1/configs/bundles/{bundle}", get_bundle, methods=["GET"]),
            Route("/v1/configs/resolve", resolve, methods=["POST"]),
            Route("/v1/configs/export", export, methods=["GET"]),
            Route("/v1/configs/epoch", epoch, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            *api_routes(config_table),  # /openapi.json, /docs (docs/api.md §14)
        ],
        exception_handlers={SieError: _sie_error, HTTPException: _http_error},
        middleware=[
            Middleware(
                RequestLimits,
                budget=budget or BodyBudget(MAX_CONFIG_BODY_BYTES * 64),
                body_timeout_s=body_timeout_s,
                respond=_refuse,
            ),
            Middleware(CatchAll),
            # ``?token=`` on /docs (a browser cannot send the header)
            Middleware(BrowserAuth, policy=policy, decide=config_decision, respond=_refuse),
            Middleware(
                AuthMiddleware,
                policy=policy,
                decide=config_decision,
                respond=_refuse,
            ),
        ],
    )
    app.state.role = role
    app.state.metrics = metrics_
    return app
