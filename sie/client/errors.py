"""Errors the SDK raises (docs/sdk.md "Errors").

Tree::

    SIEError
    ├── SIEConnectionError        the server could not be reached / the connection broke
    ├── StatusError               an HTTP error answer (``code``, ``status_code``, ``field``)
    │   ├── RequestError          a 4xx answer: the request is at fault
    │   ├── ServerError           a 5xx answer
    │   │   ├── ModelLoadFailedError   502 MODEL_LOAD_FAILED: terminal, never retried
    │   │   ├── ResourceExhaustedError 503 RESOURCE_EXHAUSTED after ``max_oom_retries``
    │   │   ├── ModelLoadingError      503 MODEL_LOADING past the time budget
    │   │   └── LoraLoadingError       503 LORA_LOADING past its retry count
    │   └── PoolError             a pool call failed (``pool_name``, ``state``)
    └── ProvisioningError         no capacity serves the lane (503 PROVISIONING / 202)

``error_from_response`` turns an HTTP error answer into one of these; it reads the
SIE-native envelopes (``{"detail": {...}}`` for 4xx, ``{"error": {...}}`` for 5xx),
the OpenAI envelope of the generation routes and ``X-SIE-Error-Code`` (docs/api.md §11).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "LoraLoadingError",
    "ModelLoadFailedError",
    "ModelLoadingError",
    "PoolError",
    "ProvisioningError",
    "RequestError",
    "ResourceExhaustedError",
    "SIEConnectionError",
    "SIEError",
    "ServerError",
    "StatusError",
    "error_from_response",
    "parse_error_body",
    "retry_after_of",
]


class SIEError(Exception):
    """Base of every SDK error. ``message`` is the server's text where there is one."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SIEConnectionError(SIEError):
    """The server could not be reached, or the connection broke mid-request."""


class StatusError(SIEError):
    """An HTTP error answer.

    Attributes:
        code: the stable error code (``INVALID_INPUT``, ``MODEL_NOT_FOUND``...).
        status_code: the HTTP status.
        field: the request field at fault, when the server named one.
        details: the whole error object the server sent.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status_code: int = 400,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status_code = status_code
        self.details: dict[str, Any] = dict(details or {})
        field = self.details.get("field", self.details.get("param"))
        self.field: str | None = field if isinstance(field, str) else None

    def __str__(self) -> str:
        return f"{self.status_code} {self.code or 'error'}: {self.message}"


class RequestError(StatusError):
    """A 4xx answer: the request itself is at fault (fields as ``StatusError``)."""


class ServerError(StatusError):
    """A 5xx answer (fields as ``StatusError``)."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status_code: int = 500,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, status_code=status_code, details=details)


class ModelLoadFailedError(ServerError):
    """502 ``MODEL_LOAD_FAILED``: the model's load failed (``error_class``, e.g.
    ``NOT_FOUND``; ``attempts``; ``permanent``). Raised at once, never retried."""

    def __init__(
        self,
        message: str,
        *,
        model: str,
        error_class: str = "UNKNOWN",
        permanent: bool = True,
        attempts: int = 1,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code="MODEL_LOAD_FAILED", status_code=502, details=details)
        self.model = model
        self.error_class = error_class
        self.permanent = permanent
        self.attempts = max(1, attempts)


class ResourceExhaustedError(ServerError):
    """503 ``RESOURCE_EXHAUSTED`` (out of memory) still answered after ``retries``
    retries, or before the next backoff would overrun the time budget."""

    def __init__(self, message: str, *, model: str, retries: int) -> None:
        super().__init__(message, code="RESOURCE_EXHAUSTED", status_code=503)
        self.model = model
        self.retries = retries


class ModelLoadingError(ServerError):
    """503 ``MODEL_LOADING`` still answered when the time budget ran out."""

    def __init__(self, message: str, *, model: str) -> None:
        super().__init__(message, code="MODEL_LOADING", status_code=503)
        self.model = model


class LoraLoadingError(ServerError):
    """503 ``LORA_LOADING`` still answered after the retries allowed for it."""

    def __init__(self, message: str, *, model: str, lora: str | None = None) -> None:
        super().__init__(message, code="LORA_LOADING", status_code=503)
        self.model = model
        self.lora = lora


class ProvisioningError(SIEError):
    """No worker serves the requested lane (503 ``PROVISIONING``, or a 202 from an
    older gateway): raised at once with ``wait_for_capacity=False``, else when the
    time budget ran out. ``retry_after`` is the server's hint in seconds."""

    def __init__(self, message: str, *, gpu: str | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.gpu = gpu
        self.retry_after = retry_after


class PoolError(StatusError):
    """A pool call failed (``pool_name``; ``state`` when the pool is known)."""

    def __init__(
        self,
        message: str,
        *,
        pool_name: str,
        state: str | None = None,
        code: str | None = None,
        status_code: int = 400,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, status_code=status_code, details=details)
        self.pool_name = pool_name
        self.state = state


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    """The ``Retry-After`` header in seconds (negative read as 0), or None when absent
    or not a number (an HTTP date is not sent by SIE)."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return max(0.0, value) if value == value else None  # NaN is not a delay


def parse_error_body(content: bytes, content_type: str | None) -> dict[str, Any]:
    """The error object of an answer body: ``{"code"?, "message"?, ...}``.

    Reads msgpack when the body says so, else JSON; takes ``error`` or ``detail``
    (an object or a string); a body that decodes to nothing known gives ``{}``.
    """
    data: Any = None
    if content:
        if content_type and "msgpack" in content_type:
            from sie.client.wire import unpack  # msgpack bodies are rare on errors

            try:
                data = unpack(content)
            except ValueError:
                data = None
        else:
            try:
                data = json.loads(content)
            except (ValueError, UnicodeDecodeError):
                text = content.decode("utf-8", "replace").strip()
                return {"message": text[:500]} if text else {}
    if not isinstance(data, dict):
        return {}
    for key in ("error", "detail"):
        inner = data.get(key)
        if isinstance(inner, dict):
            return dict(inner)
        if isinstance(inner, str):
            return {"message": inner, **({"code": data["code"]} if "code" in data else {})}
    if "message" in data:
        return dict(data)
    return {}


def error_from_response(
    status: int,
    headers: Mapping[str, str],
    content: bytes,
    *,
    model: str | None = None,
) -> SIEError:
    """The SDK error for an HTTP error answer (status >= 400).

    The code is ``X-SIE-Error-Code`` when present, else the body's ``code``
    (uppercased: the OpenAI envelope carries it in lowercase).
    """
    details = parse_error_body(content, headers.get("content-type"))
    code = headers.get("x-sie-error-code") or details.get("code")
    code = str(code).upper() if code else None
    message = str(details.get("message") or f"HTTP {status}")
    if status == 502 and code == "MODEL_LOAD_FAILED":
        attempts = details.get("attempts")
        permanent = details.get("permanent")
        return ModelLoadFailedError(
            message,
            model=model or "",
            error_class=str(details.get("error_class") or "UNKNOWN"),
            permanent=permanent if isinstance(permanent, bool) else True,
            attempts=attempts if isinstance(attempts, int) else 1,
            details=details,
        )
    if code == "PROVISIONING":
        return ProvisioningError(message, retry_after=retry_after_of(headers))
    if status >= 500:
        return ServerError(message, code=code, status_code=status, details=details)
    return RequestError(message, code=code, status_code=status, details=details)
