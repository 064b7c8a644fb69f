"""Per-lane gateway telemetry (architecture §2, §8): pending demand with a refreshable
120 s expiry, bounded lane labels, and gauges computed at scrape time."""

from __future__ import annotations

import gc

from prometheus_client import generate_latest

from sie.roles.gateway.lanes import OVERFLOW_LANE, LaneTelemetry
from sie.telemetry import Metrics

A = ("default", "l4", "default")
B = ("tenant", "h100", "default")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_demand_counts_refreshes_expires_and_clears() -> None:
    clock = Clock()
    lanes = LaneTelemetry(Metrics(), demand_ttl_s=120, clock=clock)
    lanes.record_demand(A, "provisioning")
    clock.t += 100
    lanes.record_demand(A, "provisioning")  # refreshes the expiry
    clock.t += 100  # 200 s after the first, 100 s after the last
    assert lanes.pending_demand() == {A: 2}
    clock.t += 20.5
    assert lanes.pending_demand() == {}
    lanes.record_demand(A, "queue_full")  # starts again from one
    lanes.record_demand(B, "lane_full")
    lanes.clear_demand(A)  # a publish to A
    assert lanes.pending_demand() == {B: 1}


def test_lane_labels_are_bounded() -> None:
    lanes = LaneTelemetry(Metrics(), max_lanes=2)
    assert lanes.lane(*A) == A and lanes.lane(*B) == B
    assert lanes.lane("x", "y", "z") == OVERFLOW_LANE
    assert lanes.lane(*A) == A  # known lanes keep their labels


def test_in_flight_returns_to_empty() -> None:
    lanes = LaneTelemetry(Metrics())
    lanes.add_in_flight(A, 3)
    lanes.add_in_flight(A, -3)
    assert lanes.in_flight == {}


def test_gauges_sum_live_gateways_and_forget_dropped_ones() -> None:
    metrics = Metrics()
    one, two = LaneTelemetry(metrics), LaneTelemetry(metrics)
    one.record_demand(A, "provisioning")
    two.record_demand(A, "provisioning")
    one.add_in_flight(B, 5)
    one.decision(B, "would_shed")
    text = generate_latest(metrics.registry).decode()
    a = 'bundle="default",machine_profile="l4",pool="default"'
    b = 'bundle="default",machine_profile="h100",pool="tenant"'
    assert f"sie_gateway_pending_demand{{{a}}} 2.0" in text
    assert f"sie_gateway_lane_in_flight_items{{{b}}} 5.0" in text
    decided = 'bundle="default",decision="would_shed",machine_profile="h100",pool="tenant"'
    assert f"sie_gateway_queue_lane_admission_decisions_total{{{decided}}} 1.0" in text
    assert one.decisions(B, "would_shed") == 1 and one.decisions(B, "shed") == 0
    del two
    gc.collect()
    assert f"sie_gateway_pending_demand{{{a}}} 1.0" in generate_latest(metrics.registry).decode()
