"""What the drop-in routes share (docs/api.md §15): the default model of a request that
names none, reading and validating a body, counting the request, giving up when the
client leaves, and the error envelopes of the servers SIE stands in for.

Envelopes (every one keeps SIE's stable ``code``, ``X-SIE-Error-Code`` and, for
retryable errors, ``Retry-After``):

- Cohere / Jina rerank (``/v1/rerank``, ``/v2/rerank``): SIE's own envelope
  (docs/api.md §11) plus Cohere's top-level ``message``.
- TEI (``/embed``, ``/embed_sparse``, ``/rerank``, ``/info``):
  ``{"error": str, "error_type": "Validation" | "Overloaded" | "Backend" | "Unhealthy",
  "code", ...fields}``.
- OpenAI model lookups (``GET /v1/models/{id}``): OpenAI's ``{"error": {"message",
  "type", "param", "code"}}`` beside SIE's ``{"detail": {...}}``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from sie.core.errors import InvalidInput, ShuttingDown, SieError
from sie.http.disconnect import CLIENT_CLOSED_REQUEST, until_disconnect
from sie.http.errors import ErrorJSONResponse, error_headers
from sie.http.negotiation import read_payload, validate
from sie.roles.gateway import Collected, GatewayRole
from sie.settings import ENV_VARS
from sie.telemetry import Metrics

__all__ = [
    "DEFAULT_SETTINGS",
    "Envelope",
    "TeiError",
    "TeiErrorType",
    "abandonable",
    "cohere_error",
    "counted",
    "model_for",
    "openai_lookup_error",
    "ranking",
    "read_request",
    "renamed",
    "scores_of",
    "tei_error",
    "tei_error_type",
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

Envelope = Literal["cohere", "tei"]
TeiErrorType = Literal["Validation", "Overloaded", "Backend", "Unhealthy"]

#: The gateway setting that names the default model of each kind of drop-in request.
DEFAULT_SETTINGS = {
    "embed": "default_embed_model",
    "sparse": "default_sparse_model",
    "rerank": "default_rerank_model",
}
_ENV_OF = {setting: env for env, setting in ENV_VARS.items()}


class TeiError(BaseModel):
    """TEI's error body, with SIE's ``code`` (and the error's fields, e.g. ``field``,
    ``suggestions``) beside it (docs/api.md §15)."""

    error: str
    error_type: TeiErrorType
    code: str


def model_for(gateway: GatewayRole, given: str | None, kind: str) -> str:
    """The model a drop-in request runs on: its own ``model``, else the gateway's
    default for ``kind`` (``embed``, ``sparse`` or ``rerank``).

    Raises:
        InvalidInput: neither is set (400 naming ``model`` and the setting).
    """
    if given is not None:
        return given
    setting = DEFAULT_SETTINGS[kind]
    value: str | None = getattr(gateway.settings, setting)
    if value:
        return value
    env = _ENV_OF[setting]
    raise InvalidInput(
        f'model: this request names no model and {env} is not set; send "model" in '
        f"the body or set {env} on the gateway (docs/api.md §15)",
        field="model",
        setting=env,
    )


async def read_request(
    request: Request,
    gateway: GatewayRole,
    schema: type[M],
    prepare: Callable[[Any], Any] | None = None,
) -> M:
    """The body (JSON or msgpack, within ``SIE_MAX_BODY_BYTES``), reshaped by
    ``prepare`` when given, validated by ``schema``.

    Raises:
        WireError, PayloadTooLarge, UnsupportedMediaType: as ``read_payload``.
        InvalidInput: the body does not fit ``schema`` (400 naming the field), or
            ``prepare`` refused it.
    """

    def check(payload: Any) -> M:
        out: M = validate(schema, prepare(payload) if prepare is not None else payload)
        return out

    req: M = await read_payload(request, gateway.limits.max_body_bytes, check)
    return req


async def abandonable(request: Request, work: Callable[[], Awaitable[T]]) -> T | Response:
    """``await work()``, or a bare 499 response once the client has left (its work is
    cancelled, docs/api.md §1). Call it after the body has been read."""
    got = await until_disconnect(request, work)
    if got is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return got


def renamed(exc: SieError, items: str, query: str | None = None) -> SieError:
    """``exc`` speaking the route's field names: SIE's ``items[i].text`` becomes
    ``{items}[i]``, ``items`` ``{items}``, and ``query.text`` ``{query}``."""

    def sub(text: str) -> str:
        text = re.sub(r"\bitems\[(\d+)\]\.text\b", rf"{items}[\1]", text)
        text = re.sub(r"\bitems\b", items, text)
        return text.replace("query.text", query) if query else text

    field = exc.fields.get("field")
    if isinstance(field, str):
        exc.fields["field"] = sub(field)
    exc.message = sub(exc.message)
    return exc


def scores_of(collected: Collected, n: int) -> list[float]:
    """The ``n`` scores of a score request, in candidate order.

    Raises:
        SieError: the worker answered another number of scores (500).
    """
    raw = collected.results[0].result().get("scores")
    if not isinstance(raw, list) or len(raw) != n:
        got = len(raw) if isinstance(raw, list) else "no"
        raise SieError(f"worker returned {got} scores for {n} items")
    return [float(x) for x in raw]


def ranking(scores: list[float], top: int | None = None) -> list[int]:
    """Candidate indices best first, equal scores in input order, the first ``top`` of
    them: the order of ``POST /v1/score`` (docs/api.md §3)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order if top is None else order[:top]


def tei_error_type(exc: SieError) -> TeiErrorType:
    """TEI's ``error_type`` for an SIE error: 4xx ``Validation``, shutting down
    ``Unhealthy``, other retryable 5xx ``Overloaded``, the rest ``Backend``."""
    if exc.status < 500:
        return "Validation"
    if isinstance(exc, ShuttingDown):
        return "Unhealthy"
    if exc.retry_after_s is not None:
        return "Overloaded"
    return "Backend"


def tei_error(exc: SieError) -> Response:
    """TEI's envelope (docs/api.md §15) with SIE's status, code and fields."""
    body: dict[str, Any] = {"error": exc.message, "error_type": tei_error_type(exc)}
    body.update({"code": exc.code, **exc.fields})
    return ErrorJSONResponse(body, status_code=exc.status, headers=error_headers(exc))


def cohere_error(exc: SieError) -> Response:
    """SIE's envelope (docs/api.md §11) plus Cohere's top-level ``message``."""
    key = "error" if exc.status >= 500 else "detail"
    return ErrorJSONResponse(
        {"message": exc.message, key: exc.to_detail()},
        status_code=exc.status,
        headers=error_headers(exc),
    )


def openai_lookup_error(exc: SieError) -> Response:
    """OpenAI's envelope (``param`` ``model``, ``code`` e.g. ``model_not_found``, plus
    the error's ``suggestions``) beside SIE's ``detail``, for a model lookup."""
    err: dict[str, Any] = {
        "message": exc.message,
        "type": "invalid_request_error" if exc.status < 500 else "server_error",
        "param": exc.fields.get("field", "model"),
        "code": exc.code.lower(),
    }
    if "suggestions" in exc.fields:
        err["suggestions"] = exc.fields["suggestions"]
    return ErrorJSONResponse(
        {"error": err, "detail": exc.to_detail()},
        status_code=exc.status,
        headers=error_headers(exc),
    )


async def counted(
    request: Request,
    endpoint: str,
    run: Callable[[GatewayRole], Awaitable[Response]],
    envelope: Callable[[SieError], Response],
) -> Response:
    """Run a drop-in route: its SIE errors rendered by ``envelope``, the request counted
    in ``sie_requests_total{endpoint}`` and its duration observed, as on the native
    routes (model label ``_unknown`` for ids the registry does not hold)."""
    gateway: GatewayRole = request.app.state.gateway
    metrics: Metrics = request.app.state.metrics
    started = time.monotonic()
    status = "error"
    try:
        response = await run(gateway)
        status = str(response.status_code)
        return response
    except SieError as exc:
        status = str(exc.status)
        return envelope(exc)
    finally:
        model = getattr(request.state, "model", "")
        known = model if model in gateway.registry.snapshot.entries else "_unknown"
        metrics.requests.labels(endpoint, known, status).inc()
        metrics.request_duration.labels(endpoint, known).observe(time.monotonic() - started)
