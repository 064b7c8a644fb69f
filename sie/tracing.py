"""Trace export (docs/observability.md "Traces"; architecture §13, §15.1).

Spans are made through ``sie.telemetry.tracer`` everywhere; they are exported only
when ``SIE_TRACING_ENABLED`` is on *and* an OTLP endpoint is known:
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (used as given) before
``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` appended); whitespace-only values are
ignored. The protocol (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, then
``OTEL_EXPORTER_OTLP_PROTOCOL``) must be ``http/protobuf`` (the default; ``grpc`` is
not built in: tracing stays off with a warning, serving goes on). Needs the
``tracing`` extra (``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``).

- service name: ``OTEL_SERVICE_NAME``, else by role (``sie-gateway``, ``sie-worker``,
  ``sie-config``; ``sie-server`` for several roles in one process);
- resource: ``deployment.environment`` and ``cloud.region`` always (``unknown`` unless
  ``OTEL_RESOURCE_ATTRIBUTES`` gives them);
- sampler: ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` as the SDK reads them,
  else parent-based trace-id ratio at ``OTEL_TRACES_SAMPLER_ARG`` (default 1.0): an
  inbound sampled decision is honoured;
- spans leave in batches (``BatchSpanProcessor``); ``Tracing.shutdown`` flushes for at
  most a bounded time at exit.

Without export the W3C propagator still carries an inbound ``traceparent`` through
work items, so a caller's trace id reaches every log line and response header.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace

__all__ = ["Tracing", "configure_tracing", "service_name", "traces_endpoint"]

log = logging.getLogger(__name__)

#: Seconds a shutdown waits for spans still queued.
FLUSH_TIMEOUT_S = 3.0


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def traces_endpoint(env: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces URL the environment names, or None."""
    specific = _env(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if specific is not None:
        return specific
    generic = _env(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
    return None if generic is None else generic.rstrip("/") + "/v1/traces"


def service_name(roles: Sequence[str], env: Mapping[str, str]) -> str:
    """``OTEL_SERVICE_NAME``, else a name for the roles this process runs."""
    given = _env(env, "OTEL_SERVICE_NAME")
    if given is not None:
        return given
    return f"sie-{roles[0]}" if len(roles) == 1 else "sie-server"


class Tracing:
    """The installed tracer provider; ``shutdown`` flushes and stops it."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def shutdown(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Export what is queued (at most ``timeout_s``), then stop."""
        try:
            self.provider.force_flush(timeout_millis=int(timeout_s * 1000))
        finally:
            self.provider.shutdown()


def configure_tracing(
    enabled: bool,
    roles: Sequence[str],
    env: Mapping[str, str],
    *,
    exporter: Any = None,
) -> Tracing | None:
    """Install a tracer provider exporting spans (see the module docstring); None when
    tracing stays off. ``exporter``: a span exporter to use instead of OTLP (tests:
    the SDK's in-memory exporter); ``env``: the ``OTEL_*`` variables
    (``sie.settings.otel_env``). Never raises for a bad setting: it warns and leaves
    tracing off."""
    if not enabled:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError:
        log.warning("SIE_TRACING_ENABLED is on but the tracing extra is not installed: no spans")
        return None
    if exporter is None:
        exporter = _otlp_exporter(env)
        if exporter is None:
            return None
    detected = Resource.create({}).attributes  # OTEL_RESOURCE_ATTRIBUTES
    attributes = {k: detected.get(k, "unknown") for k in ("deployment.environment", "cloud.region")}
    attributes["service.name"] = service_name(roles, env)
    resource = Resource.create(attributes)
    sampler = None  # the SDK reads OTEL_TRACES_SAMPLER when it is set
    if _env(env, "OTEL_TRACES_SAMPLER") is None:
        sampler = ParentBased(TraceIdRatioBased(_ratio(env)))
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    log.info("tracing: exporting spans as %s", attributes["service.name"])
    return Tracing(provider)


def _ratio(env: Mapping[str, str]) -> float:
    raw = _env(env, "OTEL_TRACES_SAMPLER_ARG")
    try:
        ratio = 1.0 if raw is None else float(raw)
    except ValueError:
        log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a number: sampling every trace", raw)
        return 1.0
    return min(1.0, max(0.0, ratio))


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    endpoint = traces_endpoint(env)
    if endpoint is None:
        log.warning("SIE_TRACING_ENABLED is on but no OTLP endpoint is set: no spans")
        return None
    protocol = (
        _env(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or _env(env, "OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if protocol.lower() != "http/protobuf":
        log.warning("OTLP protocol %r is not supported (http/protobuf is): no spans", protocol)
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint)
