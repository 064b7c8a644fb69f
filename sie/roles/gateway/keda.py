"""The autoscaler's inputs per lane, refreshed every 5 s by the gateway itself,
independently of requests and scrapes (docs/observability.md "Autoscaling series";
architecture §15, §16.3).

Each refresh covers the gateway's catalog lanes: the declared ones
(``SIE_GATEWAY_CONFIGURED_PHYSICAL_LANES``), those live workers serve, and those
requests already resolved through the catalog (at most 1,024 in all; caller input
never adds one). Per lane:

- ``sie_gateway_lane_queue_depth``: the lane's work in the broker, read from the lane's
  durable consumer ``{bundle}_{machine_profile}`` on ``WORK_POOL_{pool}`` as
  ``num_pending + num_ack_pending`` (the second keeps work visible while a worker loads
  a model, or dies before acking). The consumer's filter must be exactly the lane's
  ``sie.work.{pool}.{machine_profile}.{bundle}.*``. No stream: 0. No consumer (no
  worker ever attached): the messages the stream holds on the lane's exact subjects,
  so another lane's consumer cannot hide orphaned work. A timeout, an unreachable
  broker or a filter mismatch leaves that lane's value and freshness as they were.
- ``sie_gateway_lane_queue_snapshot_timestamp_seconds``: when that lane's depth was
  last read successfully (epoch seconds): a stale lane is visible as such.
- ``sie_gateway_pool_active_lease_gpus``: workers assigned to at least one live pool,
  by the lane each serves.
- the warm floor and pinned-model snapshot (``sie.roles.gateway.pool_signals``).
- ``sie_gateway_capacity_reconcile_timestamp_seconds{gateway}``: when the last refresh
  ended (labelled with the router id: only gateways export it).

At most 32 lane reads run at once and a whole snapshot is bounded to 4 s. Each
gateway starts at an offset within the cadence taken from its router id, so replicas
rolled out together do not read the broker in one burst. Pending demand and rejected
requests are counted as requests arrive (``sie.roles.gateway.lanes``).
"""

from __future__ import annotations

import hashlib
import logging
import time

import anyio
import anyio.abc

from sie.core.pools import assign
from sie.core.subjects import lane_filter, stream_name
from sie.roles.gateway.lanes import OVERFLOW_LANE, Lane, LaneTelemetry
from sie.roles.gateway.pool_signals import PoolSignals
from sie.roles.gateway.pools import PoolManager
from sie.telemetry import Metrics
from sie.transport.base import Bus, BusError, ConsumerNotFoundError, NoStreamError

__all__ = ["CADENCE_S", "MAX_CONCURRENT_READS", "SNAPSHOT_TIMEOUT_S", "LaneSnapshot"]

log = logging.getLogger(__name__)

#: Seconds between two refreshes.
CADENCE_S = 5.0
#: Lane reads in flight at once.
MAX_CONCURRENT_READS = 32
#: Seconds a whole snapshot may take; lanes not read by then keep their last value.
SNAPSHOT_TIMEOUT_S = 4.0


class LaneSnapshot:
    """One gateway's autoscaling series. Start ``run`` in a task group."""

    def __init__(
        self,
        bus: Bus,
        pools: PoolManager,
        lanes: LaneTelemetry,
        metrics: Metrics,
        router_id: str,
    ) -> None:
        self.bus = bus
        self.pools = pools
        self.lanes = lanes
        self.metrics = metrics
        self.signals = PoolSignals(pools, metrics)
        self.router_id = router_id
        digest = hashlib.blake2b(router_id.encode(), digest_size=4).digest()
        self.offset_s = int.from_bytes(digest) / 2**32 * CADENCE_S
        self._leases: set[Lane] = set()

    def catalog(self) -> set[Lane]:
        """The lanes a refresh covers (see the module docstring)."""
        out = set(self.pools.catalog.physical_lanes)
        out |= {
            (hb.pool.lower(), hb.machine_profile.lower(), hb.bundle)
            for hb in self.pools.directory.live()
        }
        out |= self.lanes.known()
        out.discard(OVERFLOW_LANE)
        return set(sorted(out)[:1024])

    async def depth(self, lane: Lane) -> int | None:
        """The lane's queued and unacknowledged work (None: unknown this time)."""
        pool, profile, bundle = lane
        stream, subjects = stream_name(pool), lane_filter(pool, profile, bundle)
        try:
            info = await self.bus.consumer_info(stream, f"{bundle}_{profile}")
        except NoStreamError:
            return 0
        except ConsumerNotFoundError:
            try:
                return await self.bus.subject_count(stream, subjects)
            except NoStreamError:
                return 0
            except BusError as exc:
                log.debug("lane %s: %s", lane, exc.message)
                return None
        except BusError as exc:
            log.debug("lane %s: %s", lane, exc.message)
            return None
        if info.filter_subject != subjects:
            log.warning(
                "lane %s: consumer %s filters %r, not %r; its depth is not reported",
                lane,
                info.durable,
                info.filter_subject,
                subjects,
            )
            return None
        return info.num_pending + info.num_ack_pending

    async def refresh(self) -> None:
        """One snapshot of every series."""
        gauge = self.metrics.lane_queue_depth
        stamp = self.metrics.lane_queue_snapshot_timestamp
        limit = anyio.Semaphore(MAX_CONCURRENT_READS)

        async def read(lane: Lane) -> None:
            async with limit:
                n = await self.depth(lane)
            if n is not None:
                gauge.labels(*lane).set(n)
                stamp.labels(*lane).set(time.time())

        with anyio.move_on_after(SNAPSHOT_TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                for lane in sorted(self.catalog()):
                    tg.start_soon(read, lane)
        self._set_leases(self.active_lease_gpus())
        self.signals.update()
        self.metrics.capacity_reconcile_timestamp.labels(self.router_id).set(time.time())

    def active_lease_gpus(self) -> dict[Lane, int]:
        """Workers assigned to at least one live pool, per the lane each serves (a
        worker two pools share counts once)."""
        workers = self.pools.workers()
        leased: dict[Lane, set[str]] = {}
        for pool in self.pools.live_pools():
            for w in assign(pool.spec, workers):
                lane = (w.pool.lower(), w.machine_profile.lower(), w.bundle)
                leased.setdefault(lane, set()).add(w.worker_id)
        return {lane: len(ids) for lane, ids in leased.items()}

    def _set_leases(self, values: dict[Lane, int]) -> None:
        gauge = self.metrics.pool_active_lease_gpus
        for lane in self._leases - values.keys():
            gauge.remove(*lane)
        for lane, n in values.items():
            gauge.labels(*lane).set(n)
        self._leases = set(values)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Refresh every ``CADENCE_S`` (after this gateway's offset) until cancelled."""
        task_status.started()
        await anyio.sleep(self.offset_s)
        while True:
            started = anyio.current_time()
            try:
                await self.refresh()
            except Exception:  # telemetry must never stop the gateway
                log.exception("lane snapshot")
            await anyio.sleep(max(0.0, CADENCE_S - (anyio.current_time() - started)))
