"""Prometheus metrics and the OpenTelemetry tracer (a leaf: any layer may import it).

Metric names follow architecture §15 where one exists.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Protocol

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["LANE_LABELS", "METRICS", "LaneGauges", "LaneSource", "Metrics", "tracer"]

tracer = trace.get_tracer("sie")

#: Labels of every per-lane series (architecture §8: the physical lane).
LANE_LABELS = ("pool", "machine_profile", "bundle")

_LANE_GAUGES = {
    "sie_gateway_pending_demand": "Requests turned away (provisioning or backpressure) per "
    "lane since its last publish; expires 120 s after the last one (architecture §2)",
    "sie_gateway_lane_in_flight_items": "Work items in flight on this gateway per lane",
}


class LaneSource(Protocol):
    def lane_values(self) -> dict[str, dict[tuple[str, str, str], float]]: ...


class LaneGauges(Collector):
    """Per-lane gauges computed at scrape time from every live source (gateways),
    summed per lane, so expiry needs no timer and several gateways in one process add up."""

    def __init__(self) -> None:
        self._sources: weakref.WeakSet[LaneSource] = weakref.WeakSet()

    def add(self, source: LaneSource) -> None:
        self._sources.add(source)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        totals: dict[str, dict[tuple[str, str, str], float]] = {n: {} for n in _LANE_GAUGES}
        for source in list(self._sources):
            for name, values in source.lane_values().items():
                acc = totals.setdefault(name, {})
                for lane, v in values.items():
                    acc[lane] = acc.get(lane, 0.0) + v
        for name, doc in _LANE_GAUGES.items():
            family = GaugeMetricFamily(name, doc, labels=LANE_LABELS)
            for lane, v in sorted(totals[name].items()):
                family.add_metric(lane, v)
            yield family


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
        self.batch_inference = Histogram(
            "sie_batch_inference_duration_seconds",
            "Wall time of one engine call (seconds); its sum over time is the engine's busy time",
            ["model"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.tokens = Counter(
            "sie_tokens_processed_total",
            "Tokens run through engines",
            ["model"],
            registry=self.registry,
        )
        # per-lane gateway admission (architecture §2; bounded labels, see sie.roles.gateway.lanes)
        self.lane_gauges = LaneGauges()
        self.registry.register(self.lane_gauges)
        self.lane_admission_decisions = Counter(
            "sie_gateway_queue_lane_admission_decisions",
            "Per-lane admission decisions: admit, would_shed (over the limit, not enforced), shed",
            [*LANE_LABELS, "decision"],
            registry=self.registry,
        )
        self.rejected_requests = Counter(
            "sie_gateway_rejected_requests",
            "Requests turned away before publishing, per lane and reason "
            "(provisioning, queue_full, lane_full)",
            [*LANE_LABELS, "reason"],
            registry=self.registry,
        )
        self.evictions = Counter(
            "sie_model_evictions",
            "Models unloaded by the worker to fit the memory budget or when idle",
            ["model", "reason"],
            registry=self.registry,
        )
        self.work_items = Counter(
            "sie_worker_items_total",
            "Work items settled by workers",
            ["model", "outcome"],
            registry=self.registry,
        )

        # the autoscaler's inputs per lane (docs/observability.md; architecture §15)
        self.lane_queue_depth = Gauge(
            "sie_gateway_lane_queue_depth",
            "Work of the lane in the broker: its durable consumer's pending plus "
            "unacknowledged messages, read every 5 s",
            LANE_LABELS,
            registry=self.registry,
        )
        self.lane_queue_snapshot_timestamp = Gauge(
            "sie_gateway_lane_queue_snapshot_timestamp_seconds",
            "When the lane's queue depth was last read successfully (epoch seconds)",
            LANE_LABELS,
            registry=self.registry,
        )
        self.pool_active_lease_gpus = Gauge(
            "sie_gateway_pool_active_lease_gpus",
            "Workers assigned to live pools, by the lane each serves",
            LANE_LABELS,
            registry=self.registry,
        )
        self.capacity_reconcile_timestamp = Gauge(
            "sie_gateway_capacity_reconcile_timestamp_seconds",
            "When the gateway last refreshed its autoscaling series (epoch seconds)",
            registry=self.registry,
        )

        # pools (docs/pools.md "Warm floors and pinned models"; architecture §16.3)
        self.pool_warm_floor = Gauge(
            "sie_gateway_pool_warm_floor",
            "Workers to keep warm on a lane: the largest minimum_worker_count of the pools it backs",
            LANE_LABELS,
            registry=self.registry,
        )
        self.pool_pinned_model_loaded = Gauge(
            "sie_gateway_pool_pinned_model_loaded",
            "1 when a live worker assigned to the pool reports the pinned model loaded, else 0",
            ["pool", "model"],
            registry=self.registry,
        )

        # large payloads (docs/api.md §12)
        self.chunk_reserved_bytes = Gauge(
            "sie_gateway_queue_result_chunk_reserved_bytes",
            "Bytes reserved by chunked results being reassembled (limit 256 MiB per process)",
            registry=self.registry,
        )
        self.chunk_rejections = Counter(
            "sie_gateway_queue_result_chunk_rejections_total",
            "Chunked results refused, by reason (global_budget, request_budget, conflict, "
            "digest, length, malformed, identity, too_large, decode)",
            ["reason"],
            registry=self.registry,
        )
        self.payload_refs = Counter(
            "sie_payload_refs_total",
            "Work items sent by reference through the payload store, by role and outcome",
            ["role", "outcome"],
            registry=self.registry,
        )

        # config convergence (architecture §4, §15)
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

        # engine-state admission for generation (admission-gate.md "Metrics the gate exports")
        self.admission_parked = Counter(
            "sie_admission_parked_total",
            "Generation requests parked by the engine-state admission gate",
            ["model"],
            registry=self.registry,
        )
        self.admission_rejected = Counter(
            "sie_admission_rejected_total",
            "Parked generation requests answered 503 ENGINE_SATURATED after the park limit, "
            "by the last park reason (kv_cache, inflight)",
            ["model", "reason"],
            registry=self.registry,
        )
        self.engine_state_stale = Counter(
            "sie_engine_state_stale_total",
            "Transitions of an engine's observed state to unhealthy (consecutive failed reads); "
            "the gate then fails open",
            ["model"],
            registry=self.registry,
        )
        self.vllm_requests_running = Gauge(
            "sie_vllm_requests_running",
            "The admission gate's latest reading of the engine's running requests",
            ["model"],
            registry=self.registry,
        )
        self.vllm_kv_usage_perc = Gauge(
            "sie_vllm_kv_usage_perc",
            "The admission gate's latest reading of the engine's KV-cache usage (fraction 0..1)",
            ["model"],
            registry=self.registry,
        )
        self.observer_degraded = Gauge(
            "sie_observer_degraded",
            "1 when the engine-state observer's startup self-check could not read the engine, "
            "until a read succeeds",
            ["model"],
            registry=self.registry,
        )


METRICS = Metrics()
