"""What pools ask of the autoscaler and of workers, as gateway telemetry (docs/pools.md
"Warm floors and pinned models"; architecture §16.3).

- ``sie_gateway_pool_warm_floor{pool,machine_profile,bundle}``: for each backing lane
  a pool with ``minimum_worker_count`` can name, the largest floor of the pools sharing
  it (a maximum, not a sum); lanes no pool floors any more are removed.
- ``sie_gateway_pool_pinned_model_loaded{pool,model}``: 1 when a live worker assigned
  to the pool reports the pinned model loaded, else 0; a pin or pool that went away is
  set to 0 once, then removed.

Both are recomputed with the other autoscaling series, every 5 s
(``sie.roles.gateway.keda``), independently of requests and scrapes. Lane labels come only from the lane catalog and live workers' lanes, never
from a request.
"""

from __future__ import annotations

from sie.core.pools import Pool, assign
from sie.roles.gateway.pools import PoolManager
from sie.telemetry import Metrics

__all__ = ["PoolSignals"]

Lane = tuple[str, str, str]


class PoolSignals:
    """Warm floors and the pinned-model snapshot of one gateway's pools."""

    def __init__(self, pools: PoolManager, metrics: Metrics) -> None:
        self.pools = pools
        self.metrics = metrics
        self._floors: set[Lane] = set()
        self._pins: set[tuple[str, str]] = set()
        self._zeroed: set[tuple[str, str]] = set()

    def lanes_of(self, pool: Pool) -> set[Lane]:
        """The backing lanes ``pool`` can name: its queue pool, each of its machine profiles and
        its bundle (or every bundle the catalog declares or a live worker serves on
        that queue pool and profile)."""
        spec = pool.spec
        known = set(self.pools.catalog.physical_lanes)
        known |= {
            (hb.pool.lower(), hb.machine_profile.lower(), hb.bundle)
            for hb in self.pools.directory.live()
        }
        out: set[Lane] = set()
        for profile in spec.gpus:
            if spec.bundle is not None:
                out.add((spec.queue_pool, profile, spec.bundle))
            else:
                out |= {lane for lane in known if lane[:2] == (spec.queue_pool, profile)}
        return out

    def warm_floors(self) -> dict[Lane, int]:
        """Lane → the largest ``minimum_worker_count`` of the live pools naming it."""
        floors: dict[Lane, int] = {}
        for pool in self.pools.live_pools():
            n = pool.spec.minimum_worker_count
            if n <= 0:
                continue
            for lane in self.lanes_of(pool):
                floors[lane] = max(floors.get(lane, 0), n)
        return floors

    def pinned_loaded(self) -> dict[tuple[str, str], int]:
        """(pool, pinned model) → 1 when one of the pool's assigned live workers
        reports the model loaded, else 0."""
        live = {hb.worker_id: hb for hb in self.pools.directory.live()}
        workers = self.pools.workers()
        out: dict[tuple[str, str], int] = {}
        for pool in self.pools.live_pools():
            loaded: set[str] = set()
            for w in assign(pool.spec, workers):
                hb = live.get(w.worker_id)
                if hb is not None:
                    loaded |= {m.name for m in hb.models if m.state == "loaded"}
            for model in pool.spec.pinned_models:
                out[(pool.spec.name, model)] = int(model in loaded)
        return out

    def update(self) -> None:
        """Recompute both families and set the gauges."""
        floors = self.warm_floors()
        for lane in self._floors - floors.keys():
            self.metrics.pool_warm_floor.remove(*lane)
        for lane, n in floors.items():
            self.metrics.pool_warm_floor.labels(*lane).set(n)
        self._floors = set(floors)
        pins = self.pinned_loaded()
        gauge = self.metrics.pool_pinned_model_loaded
        for key in self._zeroed - pins.keys():
            gauge.remove(*key)  # zeroed on the last update
        self._zeroed = self._pins - pins.keys()
        for key in self._zeroed:
            gauge.labels(*key).set(0)
        for key, v in pins.items():
            gauge.labels(*key).set(v)
        self._pins = set(pins)
