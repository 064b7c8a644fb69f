"""Per-lane gateway telemetry: pending demand, in-flight items, admission decisions.

A lane is the physical queue ``(pool, machine_profile, bundle)`` (architecture §8.2).
What is recorded, per lane (architecture §2, §8; the KEDA triggers of architecture §15):

- **pending demand**: requests turned away because no worker serves the lane
  (PROVISIONING) or because it is full (backpressure), so an autoscaler can wake it.
  Each record refreshes a 120 s expiry; a successful work publish to the exact lane
  clears it. Exported as the gauge ``sie_gateway_pending_demand``.
- **in-flight work items** of this gateway (``sie_gateway_lane_in_flight_items``), the
  input of the per-lane admission check.
- **admission decisions** (``sie_gateway_queue_lane_admission_decisions_total``:
  ``admit``, ``would_shed`` when over the limit but not enforced, ``shed``) and
  **rejected requests** (``sie_gateway_rejected_requests_total`` by ``reason``).

Pool and machine profile come from request headers, so label values are bounded:
the first ``max_lanes`` distinct lanes get their own labels, later ones share the
overflow lane ``("_other", "_other", "_other")`` (logged once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sie.telemetry import Metrics

__all__ = ["DEMAND_TTL_S", "MAX_LANES", "OVERFLOW_LANE", "Lane", "LaneTelemetry"]

log = logging.getLogger(__name__)

Lane = tuple[str, str, str]

#: Seconds a pending-demand record lives without being refreshed (architecture §2).
DEMAND_TTL_S = 120.0
#: Most distinct lanes with their own labels (the spec's 1,024-entry lane catalog, §8).
MAX_LANES = 1024
OVERFLOW_LANE: Lane = ("_other", "_other", "_other")


class LaneTelemetry:
    """One gateway's per-lane counts; exported through ``metrics.lane_gauges``."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        demand_ttl_s: float = DEMAND_TTL_S,
        max_lanes: int = MAX_LANES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.demand_ttl_s = demand_ttl_s
        self.max_lanes = max_lanes
        self._clock = clock
        self._lanes: set[Lane] = set()
        self._overflow_logged = False
        #: work items in flight on this gateway, per lane
        self.in_flight: dict[Lane, int] = {}
        # lane -> (requests turned away since the last publish, expiry on the clock)
        self._demand: dict[Lane, tuple[int, float]] = {}
        metrics.lane_gauges.add(self)

    def lane(self, pool: str, machine_profile: str, bundle: str) -> Lane:
        """The lane key: itself, or ``OVERFLOW_LANE`` once ``max_lanes`` are known."""
        lane = (pool, machine_profile, bundle)
        if lane in self._lanes:
            return lane
        if len(self._lanes) < self.max_lanes:
            self._lanes.add(lane)
            return lane
        if not self._overflow_logged:
            log.warning(
                "more than %d distinct lanes seen; further lanes share the labels %s",
                self.max_lanes,
                OVERFLOW_LANE,
            )
            self._overflow_logged = True
        return OVERFLOW_LANE

    def known(self) -> set[Lane]:
        """The lanes requests have resolved to (each through the lane catalog)."""
        return set(self._lanes)

    # -- in flight and admission ----------------------------------------------------------

    def add_in_flight(self, lane: Lane, items: int) -> None:
        """``items`` (may be negative) more work items in flight on ``lane``."""
        n = self.in_flight.get(lane, 0) + items
        if n:
            self.in_flight[lane] = n
        else:
            self.in_flight.pop(lane, None)

    def decision(self, lane: Lane, decision: str) -> None:
        """Record a per-lane admission decision: ``admit``, ``would_shed`` or ``shed``."""
        self.metrics.lane_admission_decisions.labels(*lane, decision).inc()

    def decisions(self, lane: Lane, decision: str) -> float:
        """How many ``decision``s were recorded for ``lane`` (for tests and /health)."""
        return (
            self.metrics.registry.get_sample_value(
                "sie_gateway_queue_lane_admission_decisions_total",
                dict(
                    zip(("pool", "machine_profile", "bundle"), lane, strict=True), decision=decision
                ),
            )
            or 0.0
        )

    # -- pending demand -------------------------------------------------------------------

    def record_demand(self, lane: Lane, reason: str) -> None:
        """A request for ``lane`` was turned away (``reason``: ``provisioning``,
        ``queue_full`` or ``lane_full``): count it and refresh the lane's expiry."""
        count, _ = self._live_demand(lane)
        self._demand[lane] = (count + 1, self._clock() + self.demand_ttl_s)
        self.metrics.rejected_requests.labels(*lane, reason).inc()

    def clear_demand(self, lane: Lane) -> None:
        """Work was published to ``lane``: its demand is being served."""
        self._demand.pop(lane, None)

    def _live_demand(self, lane: Lane) -> tuple[int, float]:
        entry = self._demand.get(lane)
        if entry is None:
            return 0, 0.0
        if entry[1] <= self._clock():
            del self._demand[lane]
            return 0, 0.0
        return entry

    def pending_demand(self) -> dict[Lane, int]:
        """Unexpired demand per lane (expired entries are dropped here)."""
        now = self._clock()
        for lane in [k for k, (_, exp) in self._demand.items() if exp <= now]:
            del self._demand[lane]
        return {lane: count for lane, (count, _) in self._demand.items()}

    def lane_values(self) -> dict[str, dict[Lane, float]]:
        """Gauge values for the collector: ``{gauge name: {lane: value}}``."""
        return {
            "sie_gateway_pending_demand": {k: float(v) for k, v in self.pending_demand().items()},
            "sie_gateway_lane_in_flight_items": {k: float(v) for k, v in self.in_flight.items()},
        }
