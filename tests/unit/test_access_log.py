"""The gateway's request span without trace export (docs/observability.md "Traces"):
a request without trace headers gets no span at all but the same access line; one
with a ``traceparent`` still carries the caller's context to the work items and the
response header; ``PublishSpan`` outside any trace carries nothing."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from opentelemetry import trace

import sie.http.access as access
import sie.roles.gateway.publish as publish
from sie.http.access import AccessLog
from sie.roles.gateway.publish import PublishSpan

pytestmark = pytest.mark.anyio

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture(autouse=True)
def no_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process without a tracer provider, whatever other tests installed."""
    monkeypatch.setattr(access, "tracing_active", lambda: False)
    monkeypatch.setattr(publish, "tracing_active", lambda: False)


seen: dict[str, Any] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Records what the request's handler sees, as the OpenAI route would use it."""
    seen["trace_id"] = scope["state"]["trace_id"]
    seen["current"] = trace.get_current_span().get_span_context()
    seen["publish"] = PublishSpan("encode", "m", "default")
    scope["state"]["model"] = "m"
    status = 418 if scope["path"] == "/v1/teapot" else 200
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _get(path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=AccessLog(app))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        return await c.get(path, headers=headers)


async def test_without_trace_headers_no_span_but_the_same_access_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="sie.access"):
        r = await _get("/v1/teapot")
    assert r.status_code == 418 and "x-sie-trace-id" not in r.headers
    assert seen["trace_id"] is None and not seen["current"].is_valid
    assert seen["publish"].traceparent is None and seen["publish"].span is trace.INVALID_SPAN
    seen["publish"].end(1.0)  # ends quietly
    (line,) = [r for r in caplog.records if r.name == "sie.access"]
    assert line.status == 418 and line.path == "/v1/teapot" and line.model == "m"  # type: ignore[attr-defined]
    assert line.trace_id is None  # type: ignore[attr-defined]


async def test_a_callers_traceparent_still_reaches_the_work_items_and_the_header(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="sie.access"):
        r = await _get("/v1/ok", headers={"traceparent": TRACEPARENT})
    assert r.status_code == 200 and r.headers["x-sie-trace-id"] == TRACE_ID
    assert seen["trace_id"] == TRACE_ID and f"{seen['current'].trace_id:032x}" == TRACE_ID
    assert seen["publish"].traceparent is not None and TRACE_ID in seen["publish"].traceparent
    (line,) = [r for r in caplog.records if r.name == "sie.access"]
    assert line.trace_id == TRACE_ID  # type: ignore[attr-defined]


def test_publish_span_outside_a_trace_carries_nothing() -> None:
    span = PublishSpan("encode", "m", "default")
    assert span.traceparent is None and span.tracestate is None
    span.end()
