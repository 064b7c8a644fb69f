"""Pool routes of the gateway (docs/pools.md; architecture §14, §16.3).

    GET    /v1/pools               {"pools": [PoolInfo]}, ``default`` first
    POST   /v1/pools               PoolSpec JSON (or msgpack) → 201 PoolInfo (200 when
                                   the same spec existed: it is renewed)
    GET    /v1/pools/{name}        PoolInfo; 404 POOL_NOT_FOUND
    POST   /v1/pools/{name}/renew  PoolInfo with the lease extended; 404
    DELETE /v1/pools/{name}        {"name", "deleted": true}; 403 for ``default``; 404

``PoolInfo`` is ``{"spec": {...}, "status": {"state": "pending"|"active"|"expired",
"assigned_workers": [{"name", "gpu", "bundle"}], "created_at", "last_renewed",
"expires_at"}}`` (epoch seconds). Writes need the admin token, reads the inference
token, when auth is on (``sie.http.auth``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie.core.errors import UnsupportedMediaType
from sie.core.pools import parse_spec
from sie.http.negotiation import is_json, is_msgpack, read_payload
from sie.roles.gateway import GatewayRole
from sie.roles.gateway.pools import PoolManager

__all__ = ["POOL_BODY_BYTES", "pool_routes"]

#: Largest pool spec body (a spec is small; 256 pinned models fit many times over).
POOL_BODY_BYTES = 256 * 1024


def _pools(request: Request) -> PoolManager:
    gateway: GatewayRole = request.app.state.gateway
    return gateway.pools


async def list_pools(request: Request) -> Response:
    return JSONResponse({"pools": _pools(request).list()})


async def create_pool(request: Request) -> Response:
    content_type = request.headers.get("content-type")
    if not (is_json(content_type) or is_msgpack(content_type)):
        # a form or text body is what another site's page can post without asking
        # (a "simple" cross-origin request): pool writes take JSON or msgpack only
        raise UnsupportedMediaType(
            "POST /v1/pools reads a JSON (application/json) or msgpack body",
            field="Content-Type",
        )
    spec = await read_payload(request, POOL_BODY_BYTES, parse_spec)
    info, created = await _pools(request).create(spec)
    return JSONResponse(info, status_code=201 if created else 200)


async def get_pool(request: Request) -> Response:
    return JSONResponse(_pools(request).get(request.path_params["name"]))


async def renew_pool(request: Request) -> Response:
    return JSONResponse(await _pools(request).renew(request.path_params["name"]))


async def delete_pool(request: Request) -> Response:
    name = request.path_params["name"]
    await _pools(request).delete(name)
    return JSONResponse({"name": name.strip().lower(), "deleted": True})


def pool_routes() -> list[Route]:
    """The pool API's routes, for ``build_gateway_app``."""
    return [
        Route("/v1/pools", list_pools, methods=["GET"]),
        Route("/v1/pools", create_pool, methods=["POST"]),
        Route("/v1/pools/{name}", get_pool, methods=["GET"]),
        Route("/v1/pools/{name}", delete_pool, methods=["DELETE"]),
        Route("/v1/pools/{name}/renew", renew_pool, methods=["POST"]),
    ]
