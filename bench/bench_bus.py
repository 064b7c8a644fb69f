"""Per-request overhead of the NATS bus against the in-memory bus (issue 4, acceptance 5).

A trivial engine isolates the bus: an echo worker consumes the lane and answers each
work item at once with a 384-float result. One item per request, over the in-memory
bus and over a real nats-server (JetStream work queue + core inbox). Two views:

1. **role**: the gateway role called directly (no HTTP), ``--requests`` requests at 1
   and 32 concurrent requests: the bus's own cost;
2. **http**: the gateway behind hypercorn (``sie serve --roles=gateway``'s container)
   driven by ``bench/_load.py`` in another process over 1 and 32 keep-alive
   connections for ``--seconds`` each: what a client sees.

Reported: p50 / p99 latency in milliseconds and the NATS - memory difference.
Usage: ``.venv/bin/python bench/bench_bus.py [--requests 2000] [--seconds 8]``
(part of ``make bench``, never of ``make test``).
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
sys.path.insert(0, str(ROOT / "bench"))

from _load import run_load  # noqa: E402

from sie.container import Container, build_gateway_role  # noqa: E402
from sie.control.seed import load_bundles, load_models  # noqa: E402
from sie.core.registry import ModelRegistry  # noqa: E402
from sie.core.subjects import health_subject, lane_filter, stream_name  # noqa: E402
from sie.core.wire import Heartbeat, WorkItem, WorkResult, packb  # noqa: E402
from sie.settings import ServeSettings  # noqa: E402
from sie.telemetry import Metrics  # noqa: E402
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
    gateway = build_gateway_role(bus, registry, settings)
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


async def measure_http(bus: Bus, connections: int, seconds: float) -> tuple[float, float, float]:
    """p50 ms, p99 ms and requests/s of ``POST /v1/encode`` (1 item) through HTTP."""
    settings = ServeSettings(
        roles=("gateway",),
        port=0,
        models_dir=str(ROOT / "configs"),
        bundles_dir=str(ROOT / "bundles"),
        router_id=f"gw-bench-{time.monotonic_ns()}",
        heartbeat_interval_s=0.5,
    )
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        running = await tg.start(Container(settings, bus=bus, metrics=Metrics()).run, shutdown)
        async with anyio.create_task_group() as echo:
            await echo.start(echo_worker, running.bus, settings)
            port = running.gateway_port
            await anyio.to_thread.run_sync(run_load, port, MODEL, connections, 1.0)  # warm-up
            out = await anyio.to_thread.run_sync(run_load, port, MODEL, connections, seconds)
            echo.cancel_scope.cancel()
        shutdown.set()  # hypercorn stops by its own shutdown trigger, not by cancellation
    if out["errors"]:
        raise SystemExit(f"{out['errors']} failed requests over HTTP")
    return out["p50_ms"], out["p99_ms"], out["rps"]


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


async def clean(nb: Any) -> None:
    for info in await nb._js.streams_info():
        await nb.delete_stream(info.config.name)


async def main(requests: int, seconds: float) -> None:
    results: dict[tuple[str, int], list[float]] = {}
    http: dict[tuple[str, int], tuple[float, float, float]] = {}
    from sie.transport.nats import NatsBus  # the nats extra

    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats")
        server.start()
        try:
            for conc in (1, 32):
                async with MemoryBus() as mem:
                    results[("memory", conc)] = await measure(mem, requests, conc)
                async with NatsBus(server.url, initial_connect_attempts=3) as nb:
                    results[("nats", conc)] = await measure(nb, requests, conc)
                    await clean(nb)
            for conc in (1, 32):
                print(f"HTTP runs, {conc} connection(s)...", flush=True)
                http[("memory", conc)] = await measure_http(MemoryBus(), conc, seconds)
                nb = NatsBus(server.url, initial_connect_attempts=3)
                http[("nats", conc)] = await measure_http(nb, conc, seconds)
                async with NatsBus(server.url, initial_connect_attempts=3) as admin:
                    await clean(admin)
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
    print(f"POST /v1/encode over HTTP, 1 item each, {seconds:g} s per run, keep-alive connections")
    for conc in (1, 32):
        (m50, m99, mrps), (n50, n99, nrps) = http[("memory", conc)], http[("nats", conc)]
        print(
            f"  connections={conc:>2}: memory p50 {m50:6.3f} ms p99 {m99:6.3f} ms {mrps:6.0f} req/s | "
            f"nats p50 {n50:6.3f} ms p99 {n99:6.3f} ms {nrps:6.0f} req/s | "
            f"NATS adds p50 {n50 - m50:+.3f} ms, p99 {n99 - m99:+.3f} ms"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000, help="per role-level run")
    ap.add_argument("--seconds", type=float, default=8.0, help="per HTTP run")
    a = ap.parse_args()
    anyio.run(main, a.requests, a.seconds)
