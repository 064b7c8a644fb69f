"""The error table and the last-resort 500 (architecture §2; reference §1.12)."""

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sie.core.errors import GatewayTimeout, InvalidInput, ModelLoading
from sie.http.errors import EXCEPTION_HANDLERS, CatchAll

pytestmark = pytest.mark.anyio


def app_raising(exc: Exception) -> Starlette:
    async def boom(request: Request) -> Response:
        raise exc

    return Starlette(
        routes=[Route("/x", boom), Route("/v1/embeddings", boom, methods=["POST"])],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[Middleware(CatchAll)],
    )


async def call(app: Starlette, method: str = "GET", path: str = "/x") -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.request(method, path)


async def test_bug_becomes_one_clean_500() -> None:
    r = await call(app_raising(RuntimeError("oops")))
    assert r.status_code == 500
    assert r.json() == {
        "error": {"code": "INTERNAL_ERROR", "message": "internal error: RuntimeError"}
    }
    assert r.headers["x-sie-error-code"] == "INTERNAL_ERROR"
    o = await call(app_raising(RuntimeError("oops")), "POST", "/v1/embeddings")
    assert o.status_code == 500 and o.json()["error"]["type"] == "server_error"


async def test_envelopes_and_retry_after() -> None:
    r = await call(app_raising(InvalidInput("items: bad", field="items")))
    assert r.status_code == 400 and r.json() == {
        "detail": {"code": "INVALID_INPUT", "message": "items: bad", "field": "items"}
    }
    assert "retry-after" not in r.headers
    r = await call(app_raising(ModelLoading("loading")))
    assert (
        r.status_code == 503
        and r.headers["retry-after"] == "5"
        and r.json()["error"]["code"] == "MODEL_LOADING"
    )
    r = await call(app_raising(GatewayTimeout("late")))
    assert r.status_code == 504 and r.headers["x-sie-error-code"] == "GATEWAY_TIMEOUT"
    o = await call(app_raising(InvalidInput("input: bad", field="input")), "POST", "/v1/embeddings")
    assert o.json() == {
        "error": {
            "message": "input: bad",
            "type": "invalid_request_error",
            "param": "input",
            "code": "invalid_input",
        }
    }
