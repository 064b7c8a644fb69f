"""The gateway's request span, trace id header and access log (docs/observability.md
"Traces", "Logs"; architecture §15.1).

For every HTTP request this middleware:

- makes the caller's W3C ``traceparent`` / ``tracestate`` (if any) the parent of a
  ``gateway.request`` span, current while the request is handled, so the spans the
  gateway opens (``gateway.publish``, ``gateway.proxy_chat``) and the work items it
  publishes join the caller's trace. Without trace export the span records nothing but
  still carries the inbound context; with neither export nor trace headers no span is
  built at all (``sie.telemetry.tracing_active``: it could only be a no-op);
- answers ``X-SIE-Trace-Id`` (32 hex digits) whenever the request belongs to a trace;
- writes one access line at INFO on the logger ``sie.access`` for each ``/v1/`` request
  (other paths, e.g. probes and ``/metrics``, at DEBUG): request id, trace id, method,
  path, model, items, status and duration. Successful requests are sampled at
  ``SIE_ACCESS_LOG_SAMPLE`` (1.0: all); errors are always written. With
  ``SIE_LOG_JSON`` the same fields are JSON keys.

Handlers add what only they know to ``request.state``: ``model`` (the model id the
request named) and ``items`` (how many inputs it carried).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from opentelemetry import propagate, trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sie.telemetry import tracer, tracing_active

__all__ = ["AccessLog", "trace_id_of"]

log = logging.getLogger("sie.access")


#: Characters of a client-chosen value (path, model) an access line carries.
MAX_FIELD_CHARS = 256


def _clean(value: str) -> str:
    """``value`` safe for one log line: control characters (newlines, ANSI escapes)
    written as escapes, so a client cannot forge or paint lines; at most
    ``MAX_FIELD_CHARS`` characters, longer ones cut with ``...``."""
    if value.isprintable() and len(value) <= MAX_FIELD_CHARS:
        return value
    cut = value[:MAX_FIELD_CHARS]
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in cut)
    return out + ("..." if len(value) > MAX_FIELD_CHARS else "")


def _trace_headers(scope: Scope) -> dict[str, str]:
    """The request's ``traceparent`` / ``tracestate``; a header sent twice is dropped
    (W3C trace context: several ``traceparent`` values make the context invalid)."""
    seen: dict[str, list[str]] = {}
    for k, v in scope.get("headers", []):
        if k in (b"traceparent", b"tracestate"):
            seen.setdefault(k.decode("latin-1"), []).append(v.decode("latin-1"))
    if len(seen.get("traceparent", ())) > 1:
        return {}
    return {k: vs[0] for k, vs in seen.items() if len(vs) == 1}


def trace_id_of(span: trace.Span) -> str | None:
    """The span's trace id as 32 hex digits, or None outside a trace."""
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


class AccessLog:
    """ASGI middleware (see the module docstring); ``sample``: the share of
    successful requests logged (0..1)."""

    def __init__(self, app: ASGIApp, sample: float = 1.0) -> None:
        self.app = app
        self.sample = sample

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        carrier = _trace_headers(scope)
        path = str(scope.get("path", ""))
        if not carrier and not tracing_active():  # no trace to join or record
            await self._untraced(scope, receive, send, path, started)
            return
        with tracer.start_as_current_span(
            "gateway.request",
            context=propagate.extract(carrier),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": scope.get("method", ""), "url.path": path},
        ) as span:
            await self._serve(scope, receive, send, path, started, span)

    async def _untraced(
        self, scope: Scope, receive: Receive, send: Send, path: str, started: float
    ) -> None:
        """The request without a span: no trace id, the same access line."""
        await self._serve(scope, receive, send, path, started, None)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        path: str,
        started: float,
        span: trace.Span | None,
    ) -> None:
        """Run the app, noting the response status (and, with a span, adding
        ``X-SIE-Trace-Id`` and the status attribute), then write the access line."""
        trace_id = trace_id_of(span) if span is not None else None
        scope.setdefault("state", {})["trace_id"] = trace_id
        status = 500  # unless a response starts

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if trace_id is not None:
                    extra = (b"x-sie-trace-id", trace_id.encode())
                    message["headers"] = [*message.get("headers", []), extra]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            if span is not None:
                span.set_attribute("http.response.status_code", status)
            self._log(scope, path, status, time.monotonic() - started, trace_id)

    def _log(
        self, scope: Scope, path: str, status: int, seconds: float, trace_id: str | None
    ) -> None:
        level = logging.INFO if path.startswith("/v1/") else logging.DEBUG
        if status < 400 and self.sample < 1.0 and random.random() >= self.sample:
            return
        if not log.isEnabledFor(level):
            return
        state: dict[str, Any] = scope.get("state", {})
        model = state.get("model")
        fields = {
            "request_id": state.get("request_id"),
            "trace_id": trace_id,
            "method": _clean(str(scope.get("method", ""))),
            "path": _clean(path),
            "model": None if model is None else _clean(str(model)),
            "items": state.get("items"),
            "status": status,
            "duration_ms": round(seconds * 1000.0, 2),
        }
        log.log(
            level,
            "%s %s %s %.1fms model=%s items=%s request_id=%s trace_id=%s",
            fields["method"],
            fields["path"],
            status,
            fields["duration_ms"],
            fields["model"],
            fields["items"],
            fields["request_id"],
            trace_id,
            extra=fields,
        )
