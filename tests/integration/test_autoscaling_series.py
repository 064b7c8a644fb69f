"""The autoscaler's per-lane series over a real nats-server (docs/observability.md
"Autoscaling series"; architecture §15): the lane queue depth follows a backlog on a
lane no worker serves yet (read from the stream's exact subjects), and returns to 0
once a worker attaches and drains it (read from its durable consumer), refreshed by
the gateway's own loop while nobody scrapes ``/metrics``."""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
import pytest

from sie.core.subjects import work_subject
from sie.transport.nats import NatsBus
from tests.builders import encode_item
from tests.conftest import MINILM, run_stack, wait_for

pytestmark = pytest.mark.slow

A100 = ("default", "a100", "default")
L4 = ("default", "l4", "default")


def _lane(lane: tuple[str, str, str]) -> dict[str, str]:
    return dict(zip(("pool", "machine_profile", "bundle"), lane, strict=True))


def test_lane_queue_depth_follows_a_backlog_and_drains_to_zero(nats_server: Any) -> None:
    common = {"bus": "nats", "nats_url": nats_server.url, "config_poll_interval_s": 60}
    catalog = {
        "configured_gpus": ("l4", "a100"),
        "configured_physical_lanes": (L4, A100),
        "machine_profile": "l4",
    }
    with (
        run_stack(roles=("gateway", "config"), wait_worker=False, **common, **catalog) as gw,
        run_stack(
            roles=("worker",), preload=(MINILM,), machine_profile="l4", worker_id="q-l4", **common
        ),
    ):
        registry = gw.metrics.registry  # read in-process: nobody scrapes /metrics

        def depth(lane: tuple[str, str, str]) -> float | None:
            return registry.get_sample_value("sie_gateway_lane_queue_depth", _lane(lane))

        def fresh(lane: tuple[str, str, str]) -> float:
            got = registry.get_sample_value(
                "sie_gateway_lane_queue_snapshot_timestamp_seconds", _lane(lane)
            )
            return got or 0.0

        wait_for(lambda: depth(L4) == 0.0 and depth(A100) == 0.0, 15)

        async def backlog(n: int) -> None:
            async with NatsBus(nats_server.url) as bus:
                for i in range(n):
                    item = encode_item(
                        "backlog",
                        i,
                        n,
                        f"waiting for an a100 {i}",
                        machine_profile="a100",
                        router_id="backlog-test",
                        reply_subject="_INBOX.backlog-test.backlog",
                    )
                    subject = work_subject(*A100, MINILM)
                    await bus.js_publish(subject, item.to_bytes(), msg_id=item.work_item_id)

        anyio.run(backlog, 30)
        t0 = time.monotonic()
        wait_for(lambda: depth(A100) == 30.0, 12)
        assert time.monotonic() - t0 < 11  # within two refreshes
        assert depth(L4) == 0.0  # the other lane's work is not counted here
        before = fresh(A100)
        wait_for(lambda: fresh(A100) > before, 8)  # refreshed with nobody scraping
        # a worker attaches to the a100 lane and drains it: back to 0
        with run_stack(
            roles=("worker",),
            preload=(MINILM,),
            machine_profile="a100",
            worker_id="q-a100",
            **common,
        ):
            wait_for(lambda: depth(A100) == 0.0, 30)
        with httpx.Client(base_url=gw.base_url) as c:  # and /metrics shows the same
            text = c.get("/metrics").text
        assert 'sie_gateway_lane_queue_depth{bundle="default",machine_profile="a100"' in text
        assert "sie_gateway_capacity_reconcile_timestamp_seconds{gateway=" in text
