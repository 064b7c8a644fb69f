"""``/openapi.json`` and ``/docs`` on the live gateway and config role (docs/api.md §14):
every route an app registers is in its document (so a route added later must be
documented), nothing documented is unserved, and the page and document obey auth
and the pages' security headers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.routing import Route, WebSocketRoute

from sie.http.openapi import openapi_path
from tests.conftest import Stack, run_stack

ADMIN, USER = "docs-admin", "docs-user"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with run_stack(
        roles=("gateway", "config"), auth_mode="token", auth_token=USER, admin_token=ADMIN
    ) as s:
        yield s


def config_url(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.running.config_port}"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _served(app: Any) -> tuple[set[tuple[str, str]], set[str]]:
    """(method, OpenAPI path) of every HTTP route of ``app``, and its websocket paths."""
    http: set[tuple[str, str]] = set()
    ws: set[str] = set()
    for route in app.routes:
        if isinstance(route, WebSocketRoute):
            ws.add(route.path)
        else:
            assert isinstance(route, Route), f"undocumentable route kind {route!r}"
            methods = set(route.methods or ()) - {"HEAD"}  # Starlette's HEAD for each GET
            http |= {(m.lower(), openapi_path(route.path)) for m in methods}
    return http, ws


@pytest.mark.parametrize("app", ["gateway", "config"])
def test_every_route_is_documented_and_nothing_else(stack: Stack, app: str) -> None:
    url = stack.base_url if app == "gateway" else config_url(stack)
    doc = httpx.get(f"{url}/openapi.json", headers=_bearer(USER)).json()
    documented = {(m, p) for p, item in doc["paths"].items() for m in item}
    http, ws = _served(stack.running.apps[app])
    assert http - documented == set(), "routes missing from /openapi.json"
    assert documented - http == set(), "documented operations no route serves"
    assert ws == set(doc.get("x-websockets", {}))


def test_the_route_check_sees_every_route_kind(stack: Stack) -> None:
    http, ws = _served(stack.running.apps["gateway"])
    assert ("post", "/v1/encode/{model}") in http and ("get", "/docs") in http
    assert ("head", "/docs") not in http
    assert ws == {"/ws/cluster-status"}


@pytest.mark.parametrize("app", ["gateway", "config"])
def test_docs_page_is_self_contained_and_follows_auth(stack: Stack, app: str) -> None:
    url = stack.base_url if app == "gateway" else config_url(stack)
    assert httpx.get(f"{url}/docs").status_code == 401
    assert httpx.get(f"{url}/openapi.json").status_code == 401
    page = httpx.get(f"{url}/docs", params={"token": USER})  # a browser's only way
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["referrer-policy"] == "no-referrer"
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "unsafe-inline" not in csp and re.search(r"script-src 'sha256-[^']+'", csp)
    # nothing is loaded from elsewhere: no external script, style, image or font
    assert not re.search(rb"""(src|href)=["']?(https?:)?//""", page.content)
    assert b"openapi.json" in page.content
    doc = httpx.get(f"{url}/openapi.json", headers=_bearer(USER))
    assert doc.status_code == 200 and doc.headers["content-type"] == "application/json"
    assert doc.json()["openapi"] == "3.1.0"
