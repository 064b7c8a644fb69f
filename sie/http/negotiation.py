"""Request body decoding and response encoding by ``Content-Type`` / ``Accept``.

Requests: msgpack when ``Content-Type`` contains ``msgpack``, otherwise JSON.
Responses: msgpack (numpy arrays in msgpack-numpy form, reference §1.2) when
``Accept`` names msgpack, otherwise JSON with arrays expanded to lists (the
gateway default, reference §9 item 1).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sie.core.errors import InvalidInput, PayloadTooLarge, WireError
from sie.core.wire import packb, to_jsonable, unpackb

__all__ = ["MSGPACK", "read_payload", "render", "validate", "wants_msgpack"]

MSGPACK = "application/msgpack"


async def read_payload(request: Request, max_bytes: int) -> Any:
    """Read and decode the body.

    Raises:
        PayloadTooLarge: more than ``max_bytes`` bytes (413).
        WireError: empty or malformed JSON / msgpack (400 INVALID_PAYLOAD).
    """
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes")
    if not body:
        raise WireError("request body is empty", field="body")
    if "msgpack" in request.headers.get("content-type", ""):
        return unpackb(bytes(body))
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WireError(f"malformed JSON body: {exc}", field="body") from exc


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


_BRANCH_TAGS = frozenset({"str", "int", "bool", "float", "list", "dict"})

#: Plain wording for pydantic error types whose default text names our classes.
_MESSAGES = {
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "dict_type": "expected an object",
    "list_type": "expected a list",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "int_type": "expected an integer",
    "missing": "required",
    "extra_forbidden": "unknown field",
}


def validate(model: type[BaseModel], payload: Any) -> Any:
    """Validate a decoded payload.

    Raises:
        InvalidInput: naming the first offending field (``field``) and listing all.
    """
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        msgs = []
        for e in errors:
            # drop pydantic's union/validator branch tags ("str", "list[...]", "function-after[...]")
            loc = tuple(
                p for p in e["loc"] if not (isinstance(p, str) and ("[" in p or p in _BRANCH_TAGS))
            )
            msg = _MESSAGES.get(e["type"], e["msg"])
            if e["type"] == "too_short" and loc and loc[-1] == "items":
                msg = "must not be empty"
            msgs.append((_loc(loc), msg))
        field, first = msgs[0]
        raise InvalidInput(
            f"{field}: {first}", field=field, errors=[f"{f}: {m}" for f, m in msgs]
        ) from exc


def wants_msgpack(request: Request) -> bool:
    return "msgpack" in request.headers.get("accept", "")


def render(
    request: Request, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> Response:
    """Encode a successful response per ``Accept``."""
    if wants_msgpack(request):
        return Response(packb(payload), media_type=MSGPACK, headers=headers)
    return JSONResponse(to_jsonable(payload), headers=headers)
