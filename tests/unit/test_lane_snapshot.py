"""The autoscaling snapshot's per-lane rules (sie.roles.gateway.keda; docs/observability.md
"Autoscaling series") on the in-memory bus: no stream is 0, no consumer counts the
lane's exact subjects, a consumer with the wrong filter is not reported, and a lane
whose read fails keeps its value and timestamp while the others refresh."""

from __future__ import annotations

from typing import Any

import pytest

from sie.core.lane_catalog import LaneCatalog
from sie.core.registry import ModelRegistry
from sie.roles.gateway.directory import WorkerDirectory
from sie.roles.gateway.keda import LaneSnapshot
from sie.roles.gateway.lanes import LaneTelemetry
from sie.roles.gateway.pools import PoolManager
from sie.telemetry import Metrics
from sie.transport.base import BusError, ConsumerConfig, work_stream_config
from sie.transport.memory import MemoryBus
from sie.transport.pools import MemoryPoolStore

pytestmark = pytest.mark.anyio

L4 = ("default", "l4", "default")
A100 = ("default", "a100", "default")
H100 = ("default", "h100", "default")


def _snapshot(bus: Any, metrics: Metrics) -> LaneSnapshot:
    catalog = LaneCatalog(physical_lanes=frozenset({L4, A100, H100}))
    pools = PoolManager(MemoryPoolStore(), WorkerDirectory(1.0), ModelRegistry(), catalog=catalog)
    return LaneSnapshot(bus, pools, LaneTelemetry(metrics), metrics, "gw-test")


def _get(metrics: Metrics, name: str, lane: tuple[str, str, str]) -> float | None:
    labels = dict(zip(("pool", "machine_profile", "bundle"), lane, strict=True))
    return metrics.registry.get_sample_value(name, labels)


async def test_each_lane_by_its_own_rule_and_a_failing_lane_keeps_its_value() -> None:
    metrics = Metrics()
    async with MemoryBus() as bus:
        snap = _snapshot(bus, metrics)
        await snap.refresh()  # no stream at all: every lane is 0
        assert {_get(metrics, "sie_gateway_lane_queue_depth", x) for x in (L4, A100, H100)} == {0.0}
        h100_stamp = _get(metrics, "sie_gateway_lane_queue_snapshot_timestamp_seconds", H100)
        await bus.add_stream(work_stream_config("default"))
        for _ in range(3):
            await bus.js_publish("sie.work.default.l4.default.m", b"queued")
        for _ in range(2):
            await bus.js_publish("sie.work.default.a100.default.m", b"no consumer yet")
        await bus.js_publish("sie.work.default.h100.default.m", b"wrong filter")
        l4 = await bus.pull_consumer(
            "WORK_POOL_default",
            ConsumerConfig("default_l4", "sie.work.default.l4.default.*", ack_wait_s=30),
        )
        # h100's durable filters another subject than its lane's: never reported
        await bus.pull_consumer(
            "WORK_POOL_default",
            ConsumerConfig("default_h100", "sie.work.default.h100.default.m", ack_wait_s=30),
        )
        await l4.fetch(1, 1.0)  # delivered, not acked: still counted
        await snap.refresh()
        assert _get(metrics, "sie_gateway_lane_queue_depth", L4) == 3.0
        assert _get(metrics, "sie_gateway_lane_queue_depth", A100) == 2.0  # exact subjects
        assert _get(metrics, "sie_gateway_lane_queue_depth", H100) == 0.0  # the first reading
        assert (
            _get(metrics, "sie_gateway_lane_queue_snapshot_timestamp_seconds", H100) == h100_stamp
        )

        # the a100 lane's read fails: its value and timestamp stay; l4 refreshes
        stamp = _get(metrics, "sie_gateway_lane_queue_snapshot_timestamp_seconds", A100)
        real = bus.subject_count

        async def failing(stream: str, subjects: str) -> int:
            if ".a100." in subjects:
                raise BusError("timeout")
            return await real(stream, subjects)

        bus.subject_count = failing  # type: ignore[method-assign]
        for m in await l4.fetch(5, 1.0):
            await m.ack()
        await snap.refresh()
        assert _get(metrics, "sie_gateway_lane_queue_depth", L4) == 1.0
        assert _get(metrics, "sie_gateway_lane_queue_depth", A100) == 2.0
        assert _get(metrics, "sie_gateway_lane_queue_snapshot_timestamp_seconds", A100) == stamp
        assert (
            _get(metrics, "sie_gateway_lane_queue_snapshot_timestamp_seconds", H100) == h100_stamp
        )
        gateway = {"gateway": "gw-test"}
        assert metrics.registry.get_sample_value(
            "sie_gateway_capacity_reconcile_timestamp_seconds", gateway
        )
