"""The config role's HTTP app (architecture §14, sie-config), read side only for now.

Routes: GET /v1/configs/models, /v1/configs/models/{id} (YAML),
/v1/configs/bundles, /v1/configs/bundles/{id} (YAML), /v1/configs/epoch,
/healthz, /readyz.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from sie.http.errors import EXCEPTION_HANDLERS, CatchAll
from sie.roles.config import ConfigRole

__all__ = ["build_config_app"]

YAML = "application/yaml"


async def list_models(request: Request) -> Response:
    role: ConfigRole = request.app.state.role
    return JSONResponse({"models": role.model_ids()})


async def get_model(request: Request) -> Response:
    role: ConfigRole = request.app.state.role
    return PlainTextResponse(role.model_yaml(request.path_params["model"]), media_type=YAML)


async def list_bundles(request: Request) -> Response:
    role: ConfigRole = request.app.state.role
    return JSONResponse({"bundles": sorted(role.registry.snapshot.bundles)})


async def get_bundle(request: Request) -> Response:
    role: ConfigRole = request.app.state.role
    return PlainTextResponse(role.bundle_yaml(request.path_params["bundle"]), media_type=YAML)


async def epoch(request: Request) -> Response:
    role: ConfigRole = request.app.state.role
    return JSONResponse(role.epoch_info())


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


def build_config_app(role: ConfigRole) -> Starlette:
    app = Starlette(
        routes=[
            Route("/v1/configs/models", list_models, methods=["GET"]),
            Route("/v1/configs/models/{model:path}", get_model, methods=["GET"]),
            Route("/v1/configs/bundles", list_bundles, methods=["GET"]),
            Route("/v1/configs/bundles/{bundle}", get_bundle, methods=["GET"]),
            Route("/v1/configs/epoch", epoch, methods=["GET"]),
            Route("/healthz", ok, methods=["GET"]),
            Route("/readyz", ok, methods=["GET"]),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[Middleware(CatchAll)],
    )
    app.state.role = role
    return app
