"""Request body decoding and response encoding by ``Content-Type`` / ``Accept``.

Requests: msgpack when ``Content-Type`` contains ``msgpack``, otherwise JSON.
Responses: msgpack (numpy arrays in msgpack-numpy form, reference §1.2) when
``Accept`` names msgpack, otherwise JSON with arrays expanded to lists (the
gateway default, reference §9 item 1).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from pydantic_core import to_json
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from sie.core.errors import PayloadTooLarge, WireError
from sie.core.validation import validate
from sie.core.wire import packb, unpackb

__all__ = [
    "MSGPACK",
    "FastJSONResponse",
    "read_body",
    "read_payload",
    "render",
    "validate",
    "wants_msgpack",
]

MSGPACK = "application/msgpack"


MSGPACK_TYPES = frozenset(
    {"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}
)


def _media(value: str) -> tuple[str, dict[str, str]]:
    """``"application/json; charset=UTF-8"`` → ``("application/json", {"charset": "utf-8"})``."""
    kind, *params = value.split(";")
    out = {}
    for p in params:
        k, _, v = p.partition("=")
        out[k.strip().lower()] = v.strip().strip('"').lower()
    return kind.strip().lower(), out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # e.g. 1e999999: JSON has no infinity
        raise ValueError(f"number {literal[:40]} is out of range")
    return value


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body, refused (413) as soon as it exceeds ``max_bytes``, before buffering it.

    Raises:
        PayloadTooLarge: a declared or actual size over ``max_bytes`` (413).
        WireError: the client disconnected mid-body (400 INVALID_PAYLOAD).
    """
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes", field="body")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes", field="body")
    except ClientDisconnect as exc:
        raise WireError("request body incomplete: the client disconnected", field="body") from exc
    return bytes(body)


async def read_payload(request: Request, max_bytes: int) -> Any:
    """Read and decode the body: msgpack when ``Content-Type`` is a msgpack type,
    otherwise JSON (UTF-8/16/32 detected, or the declared ``charset``).

    Raises:
        PayloadTooLarge: more than ``max_bytes`` bytes (413).
        WireError: empty, truncated (client went away) or malformed JSON / msgpack
            (400 INVALID_PAYLOAD, field ``body``).
    """
    body = await read_body(request, max_bytes)
    if not body:
        raise WireError("request body is empty", field="body")
    kind, params = _media(request.headers.get("content-type", ""))
    if kind in MSGPACK_TYPES:
        try:
            return unpackb(body)
        except WireError as exc:
            exc.fields.setdefault("field", "body")
            raise
    try:
        charset = params.get("charset", "")
        text: str | bytes = body
        if charset and charset.replace("-", "") not in ("utf8", "utf16", "utf32"):
            text = body.decode(charset)
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, UnicodeDecodeError, LookupError, RecursionError) as exc:
        raise WireError(f"malformed JSON body: {exc}", field="body") from exc


def wants_msgpack(request: Request) -> bool:
    """msgpack when the best-weighted msgpack type in ``Accept`` has q > 0 and at
    least the weight of ``application/json``; JSON otherwise (the gateway default)."""
    best_msgpack = best_json = 0.0
    for part in request.headers.get("accept", "").split(","):
        kind, params = _media(part)
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            q = 0.0
        if kind in MSGPACK_TYPES:
            best_msgpack = max(best_msgpack, q)
        elif kind == "application/json":
            best_json = max(best_json, q)
    return best_msgpack > 0 and best_msgpack >= best_json


def render(
    request: Request, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> Response:
    """Encode a successful response per ``Accept``."""
    if wants_msgpack(request):
        return Response(packb(payload), media_type=MSGPACK, headers=headers)
    return FastJSONResponse(payload, headers=headers)


def _expand(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


class FastJSONResponse(JSONResponse):
    """Compact UTF-8 JSON rendered by pydantic-core (Rust), numpy arrays and scalars as
    lists and numbers.

    About 10x faster than ``json.dumps`` on a 384-float vector (19 vs 174 µs), which
    is per-request CPU on the serving hot path (bench/bench_encode.py). Floats keep
    their shortest round-trip form; a non-finite value, which JSON cannot carry, is
    ``null`` (msgpack responses keep it). Bytes map keys become strings.

    Raises:
        pydantic_core.PydanticSerializationError: a value of another unknown type.
    """

    def render(self, content: Any) -> bytes:
        return to_json(content, fallback=_expand, inf_nan_mode="null")
