"""Per-request overhead of the NATS bus against the in-memory bus (issue 4, acceptance 5).

A trivial engine isolates the bus: an echo worker consumes the lane and answers each
work item at once with a 384-float result. The gateway role publishes one work item per
request (1 item per request) and waits for its result, over the in-memory bus and over a
real nats-server (JetStream work queue + core inbox), at 1 and 32 concurrent requests.
Reported: p50 / p99 latency in milliseconds and the NATS - memory difference.

No HTTP and no model: HTTP costs the same on both buses (see bench_encode.py).
Usage: ``.venv/bin/python bench/bench_bus.py [--requests 2000]`` (not part of make test).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sie.control.seed import load_bundles, load_models  # noqa: E402
from sie.core.registry import ModelRegistry  # noqa: E402
from sie.core.subjects import health_subject, lane_filter, stream_name  # noqa: E402
from sie.core.wire import Heartbeat, WorkItem, WorkResult, packb  # noqa: E402
from sie.roles.gateway import GatewayRole  # noqa: E402
from sie.settings import ServeSettings  # noqa: E402
from sie.transport.base import Bus, ConsumerConfig, work_stream_config  # noqa: E402
from sie.transport.memory import MemoryBus  # noqa: E402
from tests.natsserver import NatsServer  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
VECTOR = np.linspace(-1, 1, 384, dtype=np.float32)
RESULT = packb({"dense": {"dims": 384, "dtype": "float32", "values": VECTOR}})


async def echo_worker(bus: Bus, settings: ServeSettings, *, task_status: Any) -> None:
    await bus.add_stream(work_stream_config(settings.pool))
    consumer = await bus.pull_consumer(
        stream_name(settings.pool),
        ConsumerConfig(
            durable="bench", filter_subject=lane_filter(settings.pool, "default", "default")
        ),
    )
    hb = Heartbeat(
        worker_id="echo", pool="default", machine_profile="default", bundle="default", ready=True
    )

    async def beat() -> None:
        while True:
            await bus.publish(health_subject("echo"), hb.to_bytes())
            await anyio.sleep(0.5)

    async def answer(msg: Any) -> None:
        wi = WorkItem.from_bytes(msg.data)
        r = WorkResult(
            work_item_id=wi.work_item_id,
            request_id=wi.request_id,
            item_index=wi.item_index,
            success=True,
            result_msgpack=RESULT,
            worker_id="echo",
        )
        await bus.publish(wi.reply_subject, r.to_bytes())
        await msg.ack()

    async with anyio.create_task_group() as tg:
        tg.start_soon(beat)
        task_status.started()
        while True:
            for msg in await consumer.fetch(64, 1.0):
                tg.start_soon(answer, msg)


async def measure(bus: Bus, requests: int, concurrency: int) -> list[float]:
    settings = ServeSettings(router_id=f"gw-bench-{time.monotonic_ns()}", heartbeat_interval_s=0.5)
    registry = ModelRegistry()
    registry.install_bundles(load_bundles(str(ROOT / "bundles")))
    for cfg in load_models(str(ROOT / "configs")):
        registry.add_model_config(cfg)
    gateway = GatewayRole(bus, registry, settings)
    lat: list[float] = []
    async with anyio.create_task_group() as tg:
        await tg.start(gateway.run)
        await tg.start(echo_worker, bus, settings)
        for _ in range(50):  # warm-up
            await gateway.encode(MODEL, [{"text": "warm"}])
        sem = anyio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                t0 = time.perf_counter()
                await gateway.encode(MODEL, [{"text": "x"}])
                lat.append((time.perf_counter() - t0) * 1000.0)

        async with anyio.create_task_group() as load:
            for _ in range(requests):
                load.start_soon(one)
        tg.cancel_scope.cancel()
    return lat


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


async def main(requests: int) -> None:
    results: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats")
        server.start()
        try:
            for conc in (1, 32):
                async with MemoryBus() as mem:
                    results[("memory", conc)] = await measure(mem, requests, conc)
                from sie.transport.nats import NatsBus

                async with NatsBus(server.url, initial_connect_attempts=3) as nb:
                    results[("nats", conc)] = await measure(nb, requests, conc)
                    for info in await nb._js.streams_info():
                        await nb.delete_stream(info.config.name)
        finally:
            server.stop()
    print(f"{requests} requests of 1 item each, echo worker, gateway role (no HTTP)")
    for conc in (1, 32):
        m, n = results[("memory", conc)], results[("nats", conc)]
        print(
            f"  c={conc:>2}: memory p50 {pct(m, 50):6.3f} ms p99 {pct(m, 99):6.3f} ms | "
            f"nats p50 {pct(n, 50):6.3f} ms p99 {pct(n, 99):6.3f} ms | "
            f"NATS adds p50 {pct(n, 50) - pct(m, 50):+.3f} ms, p99 {pct(n, 99) - pct(m, 99):+.3f} ms"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    anyio.run(main, ap.parse_args().requests)
