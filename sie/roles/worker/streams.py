"""The two JetStream consumers of a worker (architecture §8, §8.2): its lane's durable
consumer ``{bundle}_{machine_profile}`` on ``WORK_POOL_{pool}``, and the consumer
``direct`` on its own stream ``WORK_DIRECT_{worker}``. Each is ensured (stream and
consumer) with backoff, 0.5 s doubling to 5 s, while the bus is unreachable."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from sie.core.subjects import direct_filter, direct_stream_name, lane_filter, stream_name
from sie.settings_views import BusSettings, WorkerSettings
from sie.transport.base import (
    Bus,
    BusError,
    ConsumerConfig,
    PullConsumer,
    direct_stream_config,
    work_stream_config,
)

__all__ = ["attach_direct", "attach_pool"]

log = logging.getLogger(__name__)


async def _retrying(what: str, attach: Callable[[], Awaitable[PullConsumer]]) -> PullConsumer:
    delay = 0.5
    while True:
        try:
            return await attach()
        except BusError as exc:
            log.warning("cannot attach to the %s yet (%s); retrying", what, exc.message)
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def attach_pool(bus: Bus, s: WorkerSettings, st: BusSettings) -> PullConsumer:
    """The lane's consumer on the pool's work stream (both ensured)."""

    async def attach() -> PullConsumer:
        await bus.add_stream(
            work_stream_config(
                s.pool,
                max_msgs=st.stream_max_msgs,
                max_age_s=st.stream_max_age_s,
                storage=st.stream_storage,
                replicas=st.stream_replicas,
            )
        )
        return await bus.pull_consumer(
            stream_name(s.pool),
            ConsumerConfig(
                durable=f"{s.bundle}_{s.machine_profile}",
                filter_subject=lane_filter(s.pool, s.machine_profile, s.bundle),
                ack_wait_s=st.ack_wait_s,
                max_deliver=st.max_deliver,
                max_ack_pending=max(1000, s.max_inflight_items),
            ),
        )

    return await _retrying("work stream", attach)


async def attach_direct(bus: Bus, s: WorkerSettings, st: BusSettings) -> PullConsumer:
    """The consumer ``direct`` on the worker's own stream (both ensured)."""

    async def attach() -> PullConsumer:
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
                max_ack_pending=max(1000, s.max_inflight_items),
            ),
        )

    return await _retrying("direct stream", attach)
