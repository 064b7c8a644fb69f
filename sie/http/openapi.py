"""OpenAPI 3.1 descriptions of SIE's HTTP apps, built from one source of truth
(docs/api.md §14).

Each app declares its routes once, in a table of ``Operation`` rows (path as routed,
method, summary, auth, request body and its media types, replies per status);
``build_document`` turns a table into the OpenAPI 3.1.0 document, taking every body
schema from the pydantic models the routes validate with (``sie.http.schemas``,
``sie.core.config``, ``sie.core.pools``) or answer with (``sie.http.responses``,
``sie.http.responses_admin``) through pydantic's JSON Schema generator (draft 2020-12,
the dialect of OpenAPI 3.1), ``$ref`` s pointing into ``components/schemas``.

``api_routes(table)`` serves it: ``GET /openapi.json`` (built once per process) and
``GET /docs``, a page from the package (``static/docs.html``, nothing loaded from
elsewhere) that reads ``openapi.json`` and lists the operations. Both are reads: with
auth on they need the inference (or admin) token, which ``/docs`` also takes as
``?token=`` (``sie.http.pages.BrowserAuth``).

Tables: ``sie.http.openapi_gateway`` (the gateway) and ``sie.http.openapi_config``
(the config role). ``tests/unit/test_openapi.py`` checks that every route an app
registers is in its document and that the document is valid OpenAPI 3.1.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sie import __version__
from sie.http.pages import static_page
from sie.http.responses_admin import (
    ConfigErrorEnvelope,
    OpenAIErrorEnvelope,
    SieClientErrorEnvelope,
    SieServerErrorEnvelope,
)

__all__ = [
    "HTML",
    "JSON",
    "MSGPACK",
    "SSE",
    "TEXT",
    "YAML",
    "ApiTable",
    "Auth",
    "Content",
    "Operation",
    "Param",
    "Reply",
    "Schema",
    "WebSocketOp",
    "api_routes",
    "build_document",
    "document_bytes",
    "errors",
    "openapi_path",
    "self_operations",
]

JSON = "application/json"
MSGPACK = "application/msgpack"
YAML = "application/yaml"
TEXT = "text/plain"
HTML = "text/html"
SSE = "text/event-stream"
REF = "#/components/schemas/{model}"

#: A body's schema: a pydantic model, or a JSON Schema written out (text bodies).
Schema = type[BaseModel] | dict[str, Any]
#: ``open``: no token ever (probes); ``read``: the inference or admin token when auth is
#: on; ``admin``: the admin token (docs/security.md "Authentication").
Auth = Literal["open", "read", "admin"]


@dataclass(frozen=True, slots=True)
class Content:
    """A body: its schema (None: not described, e.g. an event stream) and media types."""

    schema: Schema | None
    media_types: tuple[str, ...] = (JSON,)
    description: str = ""


@dataclass(frozen=True, slots=True)
class Reply:
    """One documented answer: what it means, its bodies, and header names (``HEADERS``)."""

    description: str
    content: tuple[Content, ...] = ()
    headers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Param:
    """A path, query or header parameter. Path parameters are derived from the route's
    path; a ``Param`` of the same name gives their description and schema."""

    name: str
    location: Literal["path", "query", "header"]
    description: str
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True, slots=True)
class Operation:
    """One route and method, as the app routes it (``path`` keeps Starlette's
    converters, e.g. ``/v1/encode/{model:path}``)."""

    method: str
    path: str
    summary: str
    replies: Mapping[int, Reply]
    auth: Auth = "read"
    body: Content | None = None
    params: tuple[Param, ...] = ()
    tag: str = ""
    description: str = ""


@dataclass(frozen=True, slots=True)
class WebSocketOp:
    """A websocket route: OpenAPI has no websockets, so these go under
    ``x-websockets`` (path → summary, description, auth, message schema)."""

    path: str
    summary: str
    message: type[BaseModel]
    auth: Auth = "read"
    description: str = ""


@dataclass(frozen=True, slots=True)
class ApiTable:
    """Everything one app serves, for ``build_document``."""

    title: str
    description: str
    operations: tuple[Operation, ...]
    websockets: tuple[WebSocketOp, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)


#: Response headers a ``Reply`` may name.
HEADERS: dict[str, dict[str, Any]] = {
    "X-SIE-Request-Id": {
        "description": "the request's id (UUIDv7), on every /v1/ answer, errors included",
        "schema": {"type": "string"},
    },
    "X-SIE-Error-Code": {"description": "the error's code", "schema": {"type": "string"}},
    "Retry-After": {
        "description": "seconds to wait before retrying (retryable codes only)",
        "schema": {"type": "string"},
    },
    "WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}},
    "X-SIE-Worker": {
        "description": "the workers that answered, comma-separated",
        "schema": {"type": "string"},
    },
    **{
        h: {"description": "milliseconds (docs/api.md §1)", "schema": {"type": "string"}}
        for h in (
            "X-Queue-Publish-Time",
            "X-Queue-Time",
            "X-Inference-Time",
            "X-Tokenization-Time",
            "X-Total-Time",
        )
    },
}

#: What each error status means, whichever route answers it (docs/api.md §11).
STATUS_TEXT: dict[int, str] = {
    400: "INVALID_INPUT / INVALID_PAYLOAD (or a config code): the message names the field",
    401: "UNAUTHORIZED: the bearer token is missing or wrong (auth on)",
    403: "FORBIDDEN: the token does not grant this route (admin routes, config writes)",
    404: "not found: MODEL_NOT_FOUND, POOL_NOT_FOUND, BUNDLE_NOT_FOUND, or NOT_FOUND "
    "when the path (with its parameters) names no route",
    405: "METHOD_NOT_ALLOWED: the path (with its parameters) names a route that does "
    "not take this method",
    408: "REQUEST_TIMEOUT: the body did not arrive within SIE_HTTP_BODY_TIMEOUT_S",
    409: "a conflict (POOL_CONFLICT, CONTENT_CONFLICT, BUNDLE_CONFLICT, ...)",
    413: "PAYLOAD_TOO_LARGE: the body (or the reply) is over its limit",
    415: "UNSUPPORTED_MEDIA_TYPE: a charset other than UTF-8, or a media type the route "
    "does not read",
    422: "VALIDATION_ERROR / UNROUTABLE_MODEL / IDEMPOTENCY_MISMATCH",
    500: "INTERNAL_ERROR, INFERENCE_ERROR, AUTH_MISCONFIGURED (auth on, no token set)",
    502: "MODEL_LOAD_FAILED: terminal, no Retry-After",
    503: "retryable (Retry-After): MODEL_LOADING, QUEUE_FULL, PROVISIONING, "
    "RESOURCE_EXHAUSTED, SHUTTING_DOWN, ... ",
    504: "GATEWAY_TIMEOUT: no result within SIE_GATEWAY_REQUEST_TIMEOUT",
}

#: The three error envelopes (``sie.http.errors``, ``sie.http.config``).
Envelope = Literal["sie", "openai", "config"]


def errors(envelope: Envelope, *statuses: int) -> dict[int, Reply]:
    """Replies for error ``statuses`` in ``envelope``: SIE-native (``{"detail"}`` below
    500, ``{"error"}`` from 500), OpenAI (``{"error": {message, type, param, code}}``)
    or the config role's (``{"detail": {code, error, message}}``)."""
    if envelope == "openai":
        return error_replies(OpenAIErrorEnvelope, OpenAIErrorEnvelope, *statuses)
    if envelope == "config":
        return error_replies(ConfigErrorEnvelope, ConfigErrorEnvelope, *statuses)
    return error_replies(SieClientErrorEnvelope, SieServerErrorEnvelope, *statuses)


def error_replies(
    client: type[BaseModel], server: type[BaseModel], *statuses: int
) -> dict[int, Reply]:
    """Replies for error ``statuses``: ``client`` below 500, ``server`` from 500, each
    with ``X-SIE-Error-Code`` (plus ``Retry-After`` on 503/504, ``WWW-Authenticate``
    on 401)."""
    out: dict[int, Reply] = {}
    for status in statuses:
        headers = ["X-SIE-Error-Code"]
        if status in (503, 504):
            headers.append("Retry-After")
        if status == 401:
            headers.append("WWW-Authenticate")
        model = client if status < 500 else server
        out[status] = Reply(STATUS_TEXT[status], (Content(model),), tuple(headers))
    return out


_CONVERTER = re.compile(r"\{(\w+)(?::\w+)?\}")


def openapi_path(route_path: str) -> str:
    """``/v1/encode/{model:path}`` → ``/v1/encode/{model}``."""
    return _CONVERTER.sub(r"{\1}", route_path)


def _path_params(op: Operation) -> list[dict[str, Any]]:
    given = {p.name: p for p in op.params if p.location == "path"}
    out = []
    for m in re.finditer(r"\{(\w+)(?::(\w+))?\}", op.path):
        name, converter = m.group(1), m.group(2)
        p = given.get(name)
        description = p.description if p else name
        if converter == "path":
            description += " (may contain '/')"
        schema = dict(p.schema) if p else {"type": "string"}
        out.append(
            {
                "name": name,
                "in": "path",
                "required": True,
                "description": description,
                "schema": schema,
            }
        )
    return out


def _models(table: ApiTable) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    """Every pydantic model the table names: request bodies in validation mode, replies
    and websocket messages in serialization mode (no duplicates)."""
    seen: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {}

    def add(schema: Schema | None, mode: JsonSchemaMode) -> None:
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            seen[(schema, mode)] = None

    for op in table.operations:
        if op.body is not None:
            add(op.body.schema, "validation")
        for reply in op.replies.values():
            for c in reply.content:
                add(c.schema, "serialization")
    for ws in table.websockets:
        add(ws.message, "serialization")
    return list(seen)


def _content(
    contents: Iterable[Content], mode: JsonSchemaMode, refs: Mapping[Any, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in contents:
        for media_type in c.media_types:
            obj: dict[str, Any] = {}
            if isinstance(c.schema, dict):
                obj["schema"] = c.schema
            elif c.schema is not None:
                obj["schema"] = refs[(c.schema, mode)]
            if c.description:
                obj["x-description"] = c.description
            out[media_type] = obj
    return out


def _operation(op: Operation, refs: Mapping[Any, Any]) -> dict[str, Any]:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", openapi_path(op.path)).strip("_") or "root"
    doc: dict[str, Any] = {
        "operationId": f"{op.method.lower()}_{slug}",
        "summary": op.summary,
        "x-sie-auth": op.auth,
        "security": [] if op.auth == "open" else [{"bearerAuth": []}],
    }
    if op.description:
        doc["description"] = op.description
    if op.tag:
        doc["tags"] = [op.tag]
    params = _path_params(op) + [
        {
            "name": p.name,
            "in": p.location,
            "required": p.required,
            "description": p.description,
            "schema": dict(p.schema),
        }
        for p in op.params
        if p.location != "path"
    ]
    if params:
        doc["parameters"] = params
    if op.body is not None:
        doc["requestBody"] = {
            "required": True,
            "content": _content([op.body], "validation", refs),
        }
        if op.body.description:
            doc["requestBody"]["description"] = op.body.description
    responses: dict[str, Any] = {}
    for status in sorted(op.replies):
        reply = op.replies[status]
        r: dict[str, Any] = {"description": reply.description}
        if reply.content:
            r["content"] = _content(reply.content, "serialization", refs)
        if reply.headers:
            r["headers"] = {h: HEADERS[h] for h in reply.headers}
        responses[str(status)] = r
    doc["responses"] = responses
    return doc


class _Names(GenerateJsonSchema):
    """Component names without a leading underscore (a module-private model, e.g. a
    worker's generation body, is still a public schema)."""

    def normalize_name(self, name: str) -> str:
        return super().normalize_name(name).lstrip("_") or name


def build_document(table: ApiTable, version: str = __version__) -> dict[str, Any]:
    """The OpenAPI 3.1.0 document of ``table`` (module docstring).

    Raises:
        ValueError: two operations for one path and method.
    """
    refs, defs = models_json_schema(_models(table), ref_template=REF, schema_generator=_Names)
    paths: dict[str, dict[str, Any]] = {}
    for op in table.operations:
        item = paths.setdefault(openapi_path(op.path), {})
        method = op.method.lower()
        if method in item:
            raise ValueError(f"{op.method} {op.path} is declared twice")
        item[method] = _operation(op, refs)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": {"title": table.title, "version": version, "description": table.description},
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "SIE_AUTH_TOKEN(S) for reads and inference, "
                    "SIE_ADMIN_TOKEN for admin routes; not checked when auth is off",
                }
            },
        },
    }
    if table.tags:
        doc["tags"] = [{"name": n, "description": d} for n, d in table.tags.items()]
    if table.websockets:
        doc["x-websockets"] = {
            ws.path: {
                "summary": ws.summary,
                "description": ws.description,
                "x-sie-auth": ws.auth,
                "message": refs[(ws.message, "serialization")],
            }
            for ws in table.websockets
        }
    return doc


@cache
def document_bytes(table: Callable[[], ApiTable]) -> bytes:
    """``build_document(table())`` as JSON, built once per process and table."""
    return json.dumps(build_document(table()), separators=(",", ":")).encode()


def self_operations(envelope: Envelope, auth_errors: tuple[int, ...]) -> tuple[Operation, ...]:
    """The two routes ``api_routes`` adds, for the tables to list."""
    return (
        Operation(
            "GET",
            "/openapi.json",
            "This API description (OpenAPI 3.1)",
            {200: Reply("the document", (Content({"type": "object"}),))}
            | errors(envelope, *auth_errors),
            tag="meta",
        ),
        Operation(
            "GET",
            "/docs",
            "The API reference page (reads /openapi.json; ?token= for auth)",
            {200: Reply("HTML", (Content({"type": "string"}, (HTML,)),))}
            | errors(envelope, *auth_errors),
            tag="meta",
            params=(Param("token", "query", "the bearer token, for a browser (auth on)"),),
        ),
    )


def api_routes(table: Callable[[], ApiTable]) -> list[Route]:
    """``GET /openapi.json`` and ``GET /docs`` for an app whose routes ``table`` lists."""

    async def openapi_json(request: Request) -> Response:
        return Response(document_bytes(table), media_type=JSON)

    async def docs(request: Request) -> Response:
        return static_page("docs.html")

    return [
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/docs", docs, methods=["GET"]),
    ]
