"""The HTTP surface of a process without a gateway (a worker, alone or with the config
role): ``/metrics``, ``/healthz`` and ``/readyz`` on ``SIE_METRICS_PORT``, so the
batch, item and model series of workers are scraped in the split topology too
(docs/observability.md "Where the series are").

Routes:
    GET /metrics   Prometheus text of this process (auth as the gateway's ``/metrics``)
    GET /healthz   liveness, text ``ok``
    GET /readyz    ``ok`` once the worker attached and preloaded; 503 ``starting``
                   before, ``draining`` during shutdown
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Scope

from sie.core.errors import SieError
from sie.http.auth import AuthMiddleware, AuthPolicy, gateway_decision
from sie.http.errors import sie_error_response
from sie.telemetry import Metrics

__all__ = ["build_worker_app"]


async def _metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def _healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def _readyz(request: Request) -> Response:
    if request.app.state.draining:
        return PlainTextResponse("draining", status_code=503)
    if not request.app.state.ready():
        return PlainTextResponse("starting", status_code=503)
    return PlainTextResponse("ok")


def _refuse(scope: Scope, exc: SieError) -> Response:
    return sie_error_response(exc)


def build_worker_app(
    metrics: Metrics, ready: Callable[[], bool], policy: AuthPolicy | None = None
) -> Starlette:
    """The app; ``ready()`` says whether the process serves work yet."""
    app = Starlette(
        routes=[
            Route("/metrics", _metrics, methods=["GET"]),
            Route("/healthz", _healthz, methods=["GET"]),
            Route("/readyz", _readyz, methods=["GET"]),
        ],
        middleware=[
            Middleware(
                AuthMiddleware,
                policy=policy or AuthPolicy(),
                decide=gateway_decision,
                respond=_refuse,
            )
        ],
    )
    app.state.metrics = metrics
    app.state.ready = ready
    app.state.draining = False
    return app
