"""Load shedding before a request publishes (architecture §2 backpressure): the
pool's work stream must stay within ``max_stream_pending``, and a lane's in-flight
items within ``max_lane_in_flight_items`` when that is enforced."""

from __future__ import annotations

from sie.core.errors import Backpressure
from sie.roles.gateway.lanes import Lane, LaneTelemetry
from sie.roles.gateway.pending import StreamPending
from sie.settings_views import BusSettings, GatewaySettings

__all__ = ["admit"]


async def admit(
    settings: GatewaySettings,
    streams: BusSettings,
    lanes: LaneTelemetry,
    pending: StreamPending,
    lane: Lane,
    pool: str,
    n_items: int,
    record: bool = True,
) -> None:
    """Backpressure (architecture §2). The per-lane decision against this gateway's
    in-flight items is always computed and recorded (``admit`` / ``would_shed`` /
    ``shed``) but only sheds when ``lane_backpressure_enforce`` is set; the pool-wide
    check always applies: the work stream's stored count (read from the broker at
    most every 250 ms) plus the items this gateway admitted since that reading plus
    this request's must stay within ``max_stream_pending``, so one gateway never
    overshoots it (several share the broker's ``max_msgs`` ceiling). Both sheds
    record pending demand.

    Raises:
        Backpressure: 503 with Retry-After 5.
    """
    s = settings
    in_flight = lanes.in_flight.get(lane, 0) + n_items
    over = in_flight > s.max_lane_in_flight_items
    shed = over and s.lane_backpressure_enforce
    if record:
        lanes.decision(lane, "shed" if shed else "would_shed" if over else "admit")
    stored = await pending.count(pool)
    if stored + max(n_items, 1) > streams.max_stream_pending:
        lanes.record_demand(lane, "queue_full")
        raise Backpressure(
            f"work queue for pool {pool!r} holds {stored} items (limit "
            f"{streams.max_stream_pending}, this request {n_items}); retry later",
            pool=pool,
        )
    if shed:
        lanes.record_demand(lane, "lane_full")
        raise Backpressure(
            f"lane {pool}/{lane[1]}/{lane[2]} has {in_flight} items in flight on this "
            f"gateway (limit {s.max_lane_in_flight_items}); retry later",
            pool=pool,
        )
