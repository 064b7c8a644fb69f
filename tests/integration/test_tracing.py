"""Traces over a real nats-server, collected by the OpenTelemetry SDK's in-memory
exporter (docs/observability.md "Traces"; architecture §15.1): one encode request with
the client's ``traceparent`` yields ``gateway.request`` → ``gateway.publish`` →
``worker.run_batch`` in the client's trace, with the §15.1 attributes, and the response
names the trace; concurrent requests batched together give one batch span with links.

The tracer provider is process-wide (OpenTelemetry allows one): this module installs
it through ``sie.tracing.configure_tracing`` and shuts it down at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sie.tracing import Tracing, configure_tracing
from tests.conftest import MINILM, run_stack, wait_for

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing = configure_tracing(True, ("gateway", "worker"), {}, exporter=exporter)
    assert isinstance(tracing, Tracing)
    try:
        yield exporter
    finally:
        tracing.shutdown(1.0)


def _finished(exporter: InMemorySpanExporter, trace_id: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id]


def test_one_encode_is_one_trace_from_the_client_to_the_worker(
    spans: InMemorySpanExporter, nats_server: Any
) -> None:
    common = {"bus": "nats", "nats_url": nats_server.url, "config_poll_interval_s": 60}
    with (
        run_stack(roles=("gateway", "config"), wait_worker=False, **common) as gw,
        run_stack(roles=("worker",), preload=(MINILM,), worker_id="traced", **common),
        httpx.Client(base_url=gw.base_url, timeout=30) as c,
    ):
        wait_for(lambda: gw.running.gateway.live_workers() != [], 30)  # type: ignore[union-attr]
        r = c.post(
            f"/v1/encode/{MINILM}",
            json={"items": [{"text": "follow me"}]},
            headers={"traceparent": TRACEPARENT},
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-sie-trace-id"] == TRACE_ID
        names = {"gateway.request", "gateway.publish", "worker.run_batch"}
        wait_for(lambda: names <= {s.name for s in _finished(spans, TRACE_ID)}, 10)
        by_name = {s.name: s for s in _finished(spans, TRACE_ID)}
        request, publish = by_name["gateway.request"], by_name["gateway.publish"]
        batch = by_name["worker.run_batch"]
        assert request.parent.span_id == int("00f067aa0ba902b7", 16)  # the client's span
        assert publish.parent.span_id == request.context.span_id
        assert batch.parent.span_id == publish.context.span_id  # across NATS
        assert publish.attributes["sie.endpoint"] == "encode"
        assert publish.attributes["sie.model"] == MINILM
        assert publish.attributes["sie.pool"] == "default"
        assert publish.attributes["sie.publish_ms"] >= 0
        assert batch.attributes["sie.model"] == MINILM and batch.attributes["sie.op"] == "encode"
        assert batch.attributes["sie.batch_size"] >= 1 and "sie.batch_id" in batch.attributes
        assert request.resource.attributes["service.name"] == "sie-server"
        assert request.resource.attributes["deployment.environment"] == "unknown"

        # /v1/embeddings joins the caller's trace the same way
        r = c.post(
            "/v1/embeddings",
            json={"model": MINILM, "input": "also traced"},
            headers={"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"},
        )
        assert r.status_code == 200 and r.headers["x-sie-trace-id"] == "1" * 32
        wait_for(lambda: "worker.run_batch" in {s.name for s in _finished(spans, "1" * 32)}, 10)

        # requests batched together: one batch span, parented on one, linked to the rest
        async def together() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=30) as ac:
                return await asyncio.gather(
                    *(
                        ac.post(
                            f"/v1/encode/{MINILM}",
                            json={"items": [{"text": f"batch mate {i}"}]},
                            headers={"traceparent": f"00-{i + 10:032x}-{i + 1:016x}-01"},
                        )
                        for i in range(16)
                    )
                )

        replies = asyncio.run(together())
        assert all(r.status_code == 200 for r in replies)
        ids = {f"{i + 10:032x}" for i in range(16)}

        def batches() -> list[Any]:
            return [
                s
                for s in spans.get_finished_spans()
                if s.name == "worker.run_batch" and f"{s.context.trace_id:032x}" in ids
            ]

        wait_for(lambda: sum(s.attributes["sie.batch_size"] for s in batches()) >= 16, 10)
        shared = [s for s in batches() if s.attributes["sie.batch_size"] > 1]
        assert shared, "no two of 16 concurrent requests shared a batch"
        for s in shared:
            linked = {f"{link.context.trace_id:032x}" for link in s.links}
            assert len(s.links) == s.attributes["sie.batch_size"] - 1
            assert linked <= ids and f"{s.context.trace_id:032x}" not in linked


def test_without_a_client_trace_the_gateway_starts_one(
    spans: InMemorySpanExporter, nats_server: Any
) -> None:
    with (
        run_stack(preload=(MINILM,)) as stack,
        httpx.Client(base_url=stack.base_url, timeout=30) as c,
    ):
        r = c.post(f"/v1/encode/{MINILM}", json={"items": [{"text": "a new trace"}]})
        assert r.status_code == 200
        trace_id = r.headers["x-sie-trace-id"]
        assert len(trace_id) == 32 and trace_id != "0" * 32
        wait_for(
            lambda: (
                {"gateway.request", "gateway.publish", "worker.run_batch"}
                <= {s.name for s in _finished(spans, trace_id)}
            ),
            10,
        )


def test_a_chat_request_traces_the_generation_spans(spans: InMemorySpanExporter) -> None:
    llm = "HuggingFaceTB/SmolLM2-135M-Instruct"
    trace_id = "5" * 32
    with (
        run_stack(preload=(llm,)) as stack,
        httpx.Client(base_url=stack.base_url, timeout=60) as c,
    ):
        r = c.post(
            "/v1/chat/completions",
            json={"model": llm, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            headers={"traceparent": f"00-{trace_id}-{'6' * 16}-01"},
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-sie-trace-id"] == trace_id
        names = {"gateway.request", "gateway.proxy_chat", "worker.streaming_processor"}
        wait_for(lambda: names <= {s.name for s in _finished(spans, trace_id)}, 10)
        by_name = {s.name: s for s in _finished(spans, trace_id)}
        proxy, worker = by_name["gateway.proxy_chat"], by_name["worker.streaming_processor"]
        assert proxy.parent.span_id == by_name["gateway.request"].context.span_id
        assert worker.parent.span_id == proxy.context.span_id
        assert proxy.attributes["http.route"] == "/v1/chat/completions"
        assert proxy.attributes["sie.model"] == llm and proxy.attributes["sie.request_id"]
        assert worker.attributes["sie.request_id"] == proxy.attributes["sie.request_id"]
        assert worker.attributes["sie.model"] == llm and worker.attributes["sie.attempt_id"]


def test_openai_user_is_the_request_span_enduser_id(spans: InMemorySpanExporter) -> None:
    """OpenAI's ``user`` / ``safety_identifier`` are honoured as the ``gateway.request``
    span's ``enduser.id`` (docs/api.md §5.1)."""
    llm = "HuggingFaceTB/SmolLM2-135M-Instruct"
    with (
        run_stack(preload=(llm, MINILM)) as stack,
        httpx.Client(base_url=stack.base_url, timeout=60) as c,
    ):
        calls = [
            ("/v1/embeddings", {"model": MINILM, "input": "x", "user": "ada"}, "7" * 32, "ada"),
            (
                "/v1/chat/completions",
                {
                    "model": llm,
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 2,
                    "safety_identifier": "bob",
                },
                "8" * 32,
                "bob",
            ),
        ]
        for path, body, trace_id, user in calls:
            r = c.post(path, json=body, headers={"traceparent": f"00-{trace_id}-{'6' * 16}-01"})
            assert r.status_code == 200, r.text

            def request_span(tid: str = trace_id) -> Any:
                got = [s for s in _finished(spans, tid) if s.name == "gateway.request"]
                return got[0] if got else None

            wait_for(lambda: request_span() is not None, 10)
            assert request_span().attributes["enduser.id"] == user
