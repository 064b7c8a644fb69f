"""A worker's durable direct dispatch (architecture §8; docs/topologies.md): its own
JetStream stream ``WORK_DIRECT_{worker}`` and durable pull consumer, from which it takes
the generations gateways send it. A generation published while the worker restarts
waits in the stream; one it took is acknowledged at once (a gateway that sees the
worker die before the first chunk offers the generation to another worker)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from sie.core.errors import SieError
from sie.core.subjects import direct_filter, direct_stream_name
from sie.core.wire import WorkItem
from sie.settings_views import BusSettings, WorkerSettings
from sie.transport.base import Bus, BusError, ConsumerConfig, PullConsumer, direct_stream_config

__all__ = ["run_direct"]

log = logging.getLogger(__name__)


async def _attach(bus: Bus, s: WorkerSettings, st: BusSettings) -> PullConsumer:
    """Ensure the stream and the consumer ``direct``; retried with backoff (0.5 s
    doubling to 5 s) while the bus is unreachable."""
    delay = 0.5
    while True:
        try:
            await bus.add_stream(
                direct_stream_config(
                    s.pool,
                    s.machine_profile,
                    s.bundle,
                    s.worker_id,
                    storage=st.stream_storage,
                    replicas=st.stream_replicas,
                )
            )
            return await bus.pull_consumer(
                direct_stream_name(s.worker_id),
                ConsumerConfig(
                    durable="direct",
                    filter_subject=direct_filter(s.pool, s.machine_profile, s.bundle, s.worker_id),
                    ack_wait_s=st.ack_wait_s,
                    max_deliver=st.max_deliver,
                ),
            )
        except BusError as exc:
            log.warning("cannot attach to the direct stream yet (%s); retrying", exc.message)
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def run_direct(
    bus: Bus, settings: WorkerSettings, streams: BusSettings, start: Callable[[WorkItem], None]
) -> None:
    """Take direct work until cancelled: each item is acknowledged, decoded and handed
    to ``start`` (which runs it in the worker's task group)."""
    consumer = await _attach(bus, settings, streams)
    while True:
        try:
            msgs = await consumer.fetch(16, timeout_s=1.0)
        except Exception as exc:  # nothing may stop this loop: re-attach, as the pool's
            log.warning("direct fetch failed (%s); re-attaching", exc)
            await anyio.sleep(0.5)
            consumer = await _attach(bus, settings, streams)
            continue
        for msg in msgs:
            try:
                await msg.ack()
                item = WorkItem.from_bytes(msg.data)
            except SieError as exc:
                log.error("dropping a direct work item on %s: %s", msg.subject, exc.message)
                continue
            except Exception as exc:  # settled meanwhile: the broker redelivers it
                log.warning("cannot take direct work item on %s: %s", msg.subject, exc)
                continue
            start(item)
