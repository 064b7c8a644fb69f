"""The one table from errors to HTTP responses (architecture §2; reference §1.12).

Envelopes:
- SIE-native 4xx (validation, routing): ``{"detail": {"code", "message", ...}}``.
- SIE-native 5xx (retryable worker signals, timeouts, load failures):
  ``{"error": {"code", "message", ...}}``, with ``X-SIE-Error-Code`` and, for
  retryable codes, ``Retry-After`` (seconds).
- OpenAI-compatible surfaces: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sie.core.errors import SieError

__all__ = [
    "EXCEPTION_HANDLERS",
    "error_headers",
    "http_exception_handler",
    "openai_error",
    "sie_error_handler",
    "unexpected_error_handler",
]

log = logging.getLogger(__name__)

_HTTP_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE"}


def error_headers(exc: SieError) -> dict[str, str]:
    headers = {"X-SIE-Error-Code": exc.code}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    return headers


def sie_error_response(exc: SieError) -> JSONResponse:
    key = "error" if exc.status >= 500 else "detail"
    return JSONResponse({key: exc.to_detail()}, status_code=exc.status, headers=error_headers(exc))


async def sie_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SieError)
    if request.url.path.startswith("/v1/embeddings"):
        return openai_error(exc)
    return sie_error_response(exc)


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"HTTP_{exc.status_code}")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return JSONResponse(
        {"detail": {"code": code, "message": f"{message}: {request.method} {request.url.path}"}},
        status_code=exc.status_code,
        headers=dict(exc.headers or {}),
    )


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        {"error": {"code": "INTERNAL_ERROR", "message": f"internal error: {type(exc).__name__}"}},
        status_code=500,
        headers={"X-SIE-Error-Code": "INTERNAL_ERROR"},
    )


def openai_error(exc: SieError) -> JSONResponse:
    """OpenAI error envelope; ``param`` is the offending field when known."""
    err: dict[str, Any] = {
        "message": exc.message,
        "type": "invalid_request_error" if exc.status < 500 else "server_error",
        "param": exc.fields.get("field"),
        "code": exc.code.lower(),
    }
    return JSONResponse({"error": err}, status_code=exc.status, headers=error_headers(exc))


#: The handlers every SIE Starlette app installs.
EXCEPTION_HANDLERS = {
    SieError: sie_error_handler,
    HTTPException: http_exception_handler,
    Exception: unexpected_error_handler,
}
