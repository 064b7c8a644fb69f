"""Prometheus metrics and the OpenTelemetry tracer (a leaf: any layer may import it).

Metric names follow reference §4.12 where one exists.
"""

from __future__ import annotations

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["METRICS", "Metrics", "tracer"]

tracer = trace.get_tracer("sie")


class Metrics:
    """One set of collectors on its own registry (tests may build their own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "sie_requests_total",
            "HTTP inference requests",
            ["endpoint", "model", "status"],
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "sie_request_duration_seconds",
            "HTTP inference request duration (seconds)",
            ["endpoint"],
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "sie_batch_size",
            "Items per engine call",
            ["model"],
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.tokens = Counter(
            "sie_tokens_processed_total",
            "Tokens run through engines",
            ["model"],
            registry=self.registry,
        )
        self.work_items = Counter(
            "sie_worker_items_total",
            "Work items settled by workers",
            ["model", "outcome"],
            registry=self.registry,
        )

        # config convergence (architecture §4, §15; reference §5.9)
        self.config_epoch = Gauge(
            "sie_config_epoch", "Local config epoch", ["role"], registry=self.registry
        )
        self.config_bootstrap_degraded = Gauge(
            "sie_gateway_config_bootstrap_degraded",
            "1 after 10 failed config bootstrap attempts or 5 minutes of failure",
            ["role"],
            registry=self.registry,
        )
        self.config_operations = Counter(
            "sie_gateway_config_operations_total",
            "Config bootstrap and poll operations",
            ["role", "operation", "outcome"],
            registry=self.registry,
        )
        self.config_deltas = Counter(
            "sie_gateway_config_deltas_total",
            "Config deltas received, by outcome",
            ["role", "outcome"],
            registry=self.registry,
        )
        self.config_publishes = Counter(
            "sie_config_nats_publishes_total",
            "Config delta publishes by the authority",
            ["result"],
            registry=self.registry,
        )


METRICS = Metrics()
