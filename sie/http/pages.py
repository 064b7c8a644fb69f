"""Pages a browser opens — the operator's status page (``GET /``) and the API reference
(``GET /docs``) — and the auth that lets a browser reach them (docs/api.md §13, §14).

A page is one HTML file under ``sie/http/static/`` that loads nothing from elsewhere:
``static_page`` serves it with a Content-Security-Policy allowing only its own inline
script and style (by hash) and connections to its own origin, ``Referrer-Policy:
no-referrer`` (the page's address may hold ``?token=``) and ``Cache-Control: no-store``.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from urllib.parse import parse_qs

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from sie.core.errors import SieError, Unauthorized
from sie.http.auth import AuthPolicy, Decision, bearer_token

__all__ = ["BROWSER_PATHS", "BrowserAuth", "static_page"]

#: Paths a browser opens itself (no header can be set): ``?token=`` is read there.
BROWSER_PATHS = ("/", "/docs")


@cache
def _page(name: str) -> tuple[bytes, str]:
    """The page ``static/{name}`` and its Content-Security-Policy."""
    html = resources.files("sie.http").joinpath("static", name).read_bytes()

    def hashes(tag: str) -> str:
        bodies = re.findall(rb"<%s>(.*?)</%s>" % (tag.encode(), tag.encode()), html, re.S)
        return " ".join(
            f"'sha256-{base64.b64encode(hashlib.sha256(b).digest()).decode()}'" for b in bodies
        )

    csp = (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return html, csp


def static_page(name: str) -> Response:
    """The HTML page ``sie/http/static/{name}`` with its security headers (module doc)."""
    html, csp = _page(name)
    return Response(
        html,
        media_type="text/html; charset=utf-8",
        headers={
            "Content-Security-Policy": csp,
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
        },
    )


def _query_token(scope: Scope) -> str | None:
    try:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), max_num_fields=64)
    except ValueError:
        return None
    got = query.get("token")
    return got[0].strip() or None if got else None


class BrowserAuth:
    """Auth for what a browser opens; placed just outside ``AuthMiddleware``.

    - Websocket scopes get ``decide(policy, "GET", path, token)`` here, the token from
      ``Authorization: Bearer`` or ``?token=``; a refusal is the HTTP error answer (401
      with ``WWW-Authenticate: Bearer``, 403, 500) through the websocket denial
      extension, else a close with 1008 before the handshake.
    - HTTP requests to ``BROWSER_PATHS`` (``/``, ``/docs``) and ``/ws/*`` without a
      bearer token in ``Authorization`` get ``?token=`` as one, and ``AuthMiddleware``
      decides as for any read.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        policy: AuthPolicy,
        decide: Decision,
        respond: Callable[[Scope, SieError], Response],
    ) -> None:
        self.app, self.policy, self.decide, self.respond = app, policy, decide, respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind, path = scope["type"], str(scope.get("path", ""))
        if kind not in ("http", "websocket") or not (
            path in BROWSER_PATHS or path.startswith("/ws/")
        ):
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        header = next((v.decode("latin-1") for k, v in headers if k == b"authorization"), None)
        query = _query_token(scope)
        if kind == "http":
            if bearer_token(header) is None and query is not None:
                auth = (b"authorization", b"Bearer " + query.encode("utf-8", "replace"))
                kept = [(k, v) for k, v in headers if k != b"authorization"]
                scope = {**scope, "headers": [*kept, auth]}
            await self.app(scope, receive, send)
            return
        token = bearer_token(header) or query
        err: SieError | None = self.decide(self.policy, "GET", path, token)
        if err is None:
            await self.app(scope, receive, send)
            return
        ws = WebSocket(scope, receive, send)
        if "websocket.http.response" in scope.get("extensions", {}):
            response = self.respond(scope, err)
            if isinstance(err, Unauthorized):
                response.headers["WWW-Authenticate"] = "Bearer"
            await ws.send_denial_response(response)
        else:
            await ws.close(code=1008, reason=err.code)
