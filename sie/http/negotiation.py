"""Request body decoding and response encoding by ``Content-Type`` / ``Accept``.

Requests: msgpack when ``Content-Type`` is a msgpack type, otherwise JSON in UTF-8
(the only charset accepted: anything else is 415, decided by ``check_charset``).
Bodies are nested at most ``DEFAULT_MAX_DEPTH`` levels; bodies over
``OFF_LOOP_BYTES`` are decoded on a small thread pool, not on the event loop
(docs/security.md "Limits").
Responses: msgpack (numpy arrays in msgpack-numpy form, docs/api.md §1) when
``Accept`` names msgpack, otherwise JSON with arrays expanded to lists (the
gateway default).
"""

from __future__ import annotations

import asyncio
import json
import math
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import numpy as np
from pydantic_core import to_json
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from sie.core.errors import PayloadTooLarge, UnsupportedMediaType, WireError
from sie.core.nesting import DEFAULT_MAX_DEPTH, check_depth, too_deep
from sie.core.validation import validate
from sie.core.wire import packb, unpackb

__all__ = [
    "MSGPACK",
    "FastJSONResponse",
    "check_charset",
    "decode_json",
    "decode_off_loop",
    "is_msgpack",
    "read_body",
    "read_payload",
    "render",
    "validate",
    "wants_msgpack",
]

MSGPACK = "application/msgpack"
T = TypeVar("T")

#: Charsets a JSON body may declare: UTF-8 (RFC 8259 §8.1) and its ASCII subset.
#: Every other codec is refused before decoding: some (punycode, utf-7) are
#: superlinear, and none is needed by a JSON client.
JSON_CHARSETS = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})
#: Bodies larger than this decode on at most ``DECODER_THREADS`` threads per event
#: loop instead of on the loop itself.
OFF_LOOP_BYTES = 1024 * 1024
DECODER_THREADS = 2
_decoders: weakref.WeakKeyDictionary[Any, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()


def _decoder_limiter() -> anyio.CapacityLimiter:
    loop = asyncio.get_running_loop()
    limiter = _decoders.get(loop)
    if limiter is None:
        limiter = _decoders[loop] = anyio.CapacityLimiter(DECODER_THREADS)
    return limiter


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


def is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names JSON (``application/json`` or ``+json``)."""
    kind = _media(content_type or "")[0]
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def is_msgpack(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names msgpack (any of its media types)."""
    return _media(content_type or "")[0] in MSGPACK_TYPES


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
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes", field="body")
    except ClientDisconnect as exc:
        raise WireError("request body incomplete: the client disconnected", field="body") from exc
    # one copy into a buffer of the final size: growing a buffer copies the body several
    # times over, about 1 ms per MiB each on the serving loop
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def check_charset(content_type: str | None) -> None:
    """Refuse a declared charset other than UTF-8 (or its ASCII subset); the one place
    that decides it, for every route that reads a text body.

    Raises:
        UnsupportedMediaType: 415 ``UNSUPPORTED_MEDIA_TYPE``, field ``content-type``.
    """
    charset = _media(content_type or "")[1].get("charset")
    if charset is not None and charset not in JSON_CHARSETS:
        raise UnsupportedMediaType(
            f"content-type: charset {charset[:40]!r} is not supported; send UTF-8",
            field="content-type",
        )


def decode_json(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """A UTF-8 JSON body as Python values, finite numbers only, nested at most
    ``max_depth`` levels.

    Raises:
        WireError: not UTF-8, malformed, a non-finite number, or too deep
            (400 INVALID_PAYLOAD, field ``body``).
    """
    try:
        value = json.loads(
            body.decode("utf-8-sig"), parse_constant=_reject_constant, parse_float=_finite_float
        )
    except RecursionError:  # the C decoder's own stop, far below any memory concern
        raise too_deep(max_depth) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"malformed JSON body: {exc}", field="body") from exc
    check_depth(value, max_depth)
    return value


def _decode_msgpack(body: bytes, max_depth: int) -> Any:
    try:
        value = unpackb(body)
    except WireError as exc:
        exc.fields.setdefault("field", "body")
        raise
    check_depth(value, max_depth)
    return value


async def read_payload(
    request: Request, max_bytes: int, then: Callable[[Any], Any] | None = None
) -> Any:
    """Read and decode the body: msgpack when ``Content-Type`` is a msgpack type,
    otherwise UTF-8 JSON; then ``then(payload)`` (e.g. pydantic validation) when given,
    whose result is returned. Bodies over ``OFF_LOOP_BYTES`` are decoded and passed
    to ``then`` off the event loop: a 4096-item body costs tens of milliseconds.

    Raises:
        PayloadTooLarge: more than ``max_bytes`` bytes (413).
        UnsupportedMediaType: a charset other than UTF-8 (415).
        WireError: empty, truncated (client went away), malformed or too deeply
            nested JSON / msgpack (400 INVALID_PAYLOAD, field ``body``).
    """
    content_type = request.headers.get("content-type", "")
    is_msgpack = _media(content_type)[0] in MSGPACK_TYPES
    if not is_msgpack:
        check_charset(content_type)  # 415 before the body is read or decoded
    body = await read_body(request, max_bytes)
    if not body:
        raise WireError("request body is empty", field="body")
    decode = _decode_msgpack if is_msgpack else decode_json
    if then is None:
        return await decode_off_loop(decode, body, DEFAULT_MAX_DEPTH)
    return await decode_off_loop(lambda b: then(decode(b, DEFAULT_MAX_DEPTH)), body)


async def decode_off_loop(decode: Callable[..., T], body: bytes, *args: Any) -> T:
    """``decode(body, *args)``: inline for a small body, else on one of
    ``DECODER_THREADS`` threads so the event loop keeps serving (probes, heartbeats)."""
    if len(body) <= OFF_LOOP_BYTES:
        return decode(body, *args)
    return await anyio.to_thread.run_sync(decode, body, *args, limiter=_decoder_limiter())


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
