"""Capped pools, warm floors and pinned models over a real nats-server (docs/pools.md;
architecture §8, §16.3): a pool capped to one of two workers on one lane gets all its
traffic on that worker (worker-direct), the other worker NAKs pool-subject work of the
pool, the pool's pinned model is loaded on its worker only, and the gateway publishes
the warm floor and the pinned-model snapshot."""

from __future__ import annotations

import re
from typing import Any

import anyio
import httpx
import pytest

from sie.core.subjects import inbox_subject, work_subject
from sie.core.wire import WorkResult
from sie.transport.nats import NatsBus
from tests.builders import encode_item
from tests.conftest import MINILM, run_stack, wait_for

pytestmark = pytest.mark.slow

SPLADE = "rasyosef/splade-tiny"
LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if got == labels:
            return float(line.rsplit(" ", 1)[1])
    return None


def _loaded(stack: Any) -> set[str]:
    return {m.name for m in stack.running.worker.models.statuses() if m.state == "loaded"}


def test_a_capped_pool_runs_on_its_assigned_worker_only(nats_server: Any) -> None:
    common = {
        "bus": "nats",
        "nats_url": nats_server.url,
        "config_poll_interval_s": 60,
        "machine_profile": "l4",
        "pool_poll_s": 1.0,
    }
    with (
        run_stack(roles=("gateway", "config"), wait_worker=False, **common) as gw_stack,
        run_stack(roles=("worker",), preload=(MINILM,), worker_id="cap-a", **common) as a,
        # the other worker has the LLM loaded: left to itself, generation would go there
        run_stack(roles=("worker",), preload=(MINILM, LLM), worker_id="cap-b", **common) as b,
        httpx.Client(base_url=gw_stack.base_url, timeout=30) as c,
    ):
        gw = gw_stack.running.gateway
        assert gw is not None
        wait_for(lambda: {"cap-a", "cap-b"} <= {h.worker_id for h in gw.live_workers()}, 30)
        spec = {
            "name": "capped",
            "gpus": {"l4": 1},
            "gpu_caps": {"l4": 1},
            "minimum_worker_count": 2,
            "pinned_models": [SPLADE],
        }
        r = c.post("/v1/pools", json=spec)
        assert r.status_code == 201, r.text
        assert [w["name"] for w in r.json()["status"]["assigned_workers"]] == ["cap-a"]

        # every request of the pool runs on its one assigned worker
        body = {"items": [{"text": "capped traffic"}]}
        served: dict[str, int] = {}
        for _ in range(20):
            r = c.post(f"/v1/encode/{MINILM}", json=body, headers={"X-SIE-Pool": "capped"})
            assert r.status_code == 200, r.text
            served[r.headers["x-sie-worker"]] = served.get(r.headers["x-sie-worker"], 0) + 1
        assert served == {"cap-a": 20}
        # ...sent to it directly: the other worker never saw (and NAKed) any of them
        not_assigned = {"model": MINILM, "outcome": "not_assigned"}
        assert b.metrics.registry.get_sample_value("sie_worker_items_total", not_assigned) is None
        # generation too: offered only to the pool's worker
        chat = {
            "model": LLM,
            "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 4,
        }
        for _ in range(3):
            r = c.post("/v1/chat/completions", json=chat, headers={"X-SIE-Pool": "capped"})
            assert r.status_code == 200, r.text
            assert r.headers["x-sie-worker"] == "cap-a"
        # uncapped default traffic still uses both workers
        seen = {
            c.post(f"/v1/encode/{MINILM}", json=body).headers["x-sie-worker"] for _ in range(30)
        }
        assert seen == {"cap-a", "cap-b"}

        # work of the pool put on the lane's pool subject: the unassigned worker NAKs
        # its deliveries, so only the assigned one answers
        async def pool_subject_items(n: int) -> list[WorkResult]:
            async with NatsBus(nats_server.url) as bus:
                reply = inbox_subject("capped-test", "req-1")
                sub = await bus.subscribe(reply)
                for i in range(n):
                    item = encode_item(
                        "req-1",
                        i,
                        n,
                        f"queued for the pool {i}",
                        machine_profile="l4",
                        router_id="capped-test",
                        reply_subject=reply,
                        admission_pool="capped",
                    )
                    subject = work_subject("default", "l4", "default", MINILM)
                    await bus.js_publish(subject, item.to_bytes(), msg_id=item.work_item_id)
                out: list[WorkResult] = []
                with anyio.fail_after(30):
                    async for msg in sub:
                        out.append(WorkResult.from_bytes(msg.data))
                        if len(out) == n:
                            break
                return out

        results = anyio.run(pool_subject_items, 12)
        assert {r.worker_id for r in results} == {"cap-a"}
        assert all(r.success for r in results), [r.error for r in results if not r.success]
        nak = b.metrics.registry.get_sample_value("sie_worker_items_total", not_assigned)
        assert nak is not None and nak >= 1

        # the pinned model is loaded on the pool's worker, not on the other one
        wait_for(lambda: SPLADE in _loaded(a), 60)
        assert SPLADE not in _loaded(b)

        # the gateway's signals: the warm floor of the backing lane and the pinned model
        def signals() -> tuple[float | None, float | None]:
            text = c.get("/metrics").text
            floor = _metric(
                text,
                "sie_gateway_pool_warm_floor",
                bundle="default",
                machine_profile="l4",
                pool="default",
            )
            pinned = _metric(
                text, "sie_gateway_pool_pinned_model_loaded", model=SPLADE, pool="capped"
            )
            return floor, pinned

        wait_for(lambda: signals() == (2.0, 1.0), 20)

        # the pool deleted: its floor goes, its pin is zeroed, the worker unpins it
        assert c.delete("/v1/pools/capped").status_code == 200
        wait_for(lambda: signals() == (None, 0.0), 20)
        wait_for(lambda: SPLADE not in a.running.worker.models.pinned, 10)
