"""The one table from errors to HTTP responses (architecture §2; docs/api.md §12).

Envelopes:
- SIE-native 4xx (validation, routing): ``{"detail": {"code", "message", ...}}``.
- SIE-native 5xx (retryable worker signals, timeouts, load failures):
  ``{"error": {"code", "message", ...}}``, with ``X-SIE-Error-Code`` and, for
  retryable codes, ``Retry-After`` (seconds).
- OpenAI-compatible surfaces: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sie.core.errors import ModelNotFound, SieError

__all__ = [
    "EXCEPTION_HANDLERS",
    "OPENAI_PATHS",
    "CatchAll",
    "ErrorJSONResponse",
    "error_headers",
    "http_exception_handler",
    "openai_error",
    "sie_error_handler",
    "sie_error_response",
]

log = logging.getLogger(__name__)

_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE"}

#: Paths whose errors use the OpenAI envelope (architecture §2), routing errors included
#: (e.g. 405 on ``GET /v1/chat/completions``).
OPENAI_PATHS = ("/v1/embeddings", "/v1/chat/completions", "/v1/completions", "/v1/generate")


class ErrorJSONResponse(JSONResponse):
    """An error envelope. Messages quote the request (a key, a model id), and a JSON
    body can smuggle lone surrogates (``"\\udc00"``) that UTF-8 cannot encode: those
    go out as ``\\uXXXX`` escapes (still valid JSON) instead of failing the response."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_headers(exc: SieError) -> dict[str, str]:
    headers = {"X-SIE-Error-Code": exc.code}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    return headers


def sie_error_response(exc: SieError) -> JSONResponse:
    key = "error" if exc.status >= 500 else "detail"
    return ErrorJSONResponse(
        {key: exc.to_detail()}, status_code=exc.status, headers=error_headers(exc)
    )


async def sie_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SieError)
    if request.url.path.startswith(OPENAI_PATHS):
        return openai_error(exc)
    return sie_error_response(exc)


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"HTTP_{exc.status_code}")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    message = f"{message}: {request.method} {request.url.path}"
    headers = {**(exc.headers or {}), "X-SIE-Error-Code": code}
    if request.url.path.startswith(OPENAI_PATHS):
        body: dict[str, Any] = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code.lower(),
            }
        }
    else:
        body = {"detail": {"code": code, "message": message}}
    return ErrorJSONResponse(body, status_code=exc.status_code, headers=headers)


class CatchAll:
    """Last resort: an unexpected exception becomes one logged 500 with a stable code.

    Unlike Starlette's server-error handler it does not re-raise, so the server
    does not log the same failure twice. Cancellation passes through.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.exception(
                "unhandled error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc
            )
            if started:
                return  # headers are out; the connection is closed by the server
            err = InternalError(f"internal error: {type(exc).__name__}")
            if str(scope.get("path", "")).startswith(OPENAI_PATHS):
                response: Response = openai_error(err)
            else:
                response = sie_error_response(err)
            await response(scope, receive, send)


class InternalError(SieError):
    """500 INTERNAL_ERROR for a bug: never raised on purpose."""


def openai_error(exc: SieError) -> JSONResponse:
    """OpenAI error envelope; ``param`` is the offending field when known (``model`` for
    an unknown model); an unknown model's ``suggestions`` (the closest ids, docs/api.md
    §15) ride along."""
    err: dict[str, Any] = {
        "message": exc.message,
        "type": "invalid_request_error" if exc.status < 500 else "server_error",
        "param": exc.fields.get("field", "model" if isinstance(exc, ModelNotFound) else None),
        "code": exc.code.lower(),
    }
    if "suggestions" in exc.fields:
        err["suggestions"] = exc.fields["suggestions"]
    return ErrorJSONResponse({"error": err}, status_code=exc.status, headers=error_headers(exc))


#: The handlers every SIE Starlette app installs.
EXCEPTION_HANDLERS: dict[Any, Any] = {
    SieError: sie_error_handler,
    HTTPException: http_exception_handler,
}
