"""Workers as one gateway knows them: the last heartbeat of each (``sie.health.>``),
refreshed by the results they send (docs/security.md "Liveness").

Feeds ``/health``, model states and counts (docs/api.md §7, §10), worker acks
(architecture §6) and the provisioning rule (architecture §2). Pure bookkeeping: the
gateway role subscribes and calls ``observe`` / ``saw``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sie.control.ack_status import WorkerAck
from sie.core.wire import Heartbeat, ModelStatus

__all__ = ["WorkerDirectory", "WorkerView"]


@dataclass(slots=True)
class WorkerView:
    """A worker's last heartbeat and when it was last heard from (monotonic seconds)."""

    heartbeat: Heartbeat
    seen_at: float


class WorkerDirectory:
    """Every worker heard from, by worker id; a worker is live while heard from within
    three of its heartbeat intervals.

    ``heartbeat_interval_s``: the fleet's interval (seconds), for the startup grace of
    ``lane_served``.
    """

    def __init__(self, heartbeat_interval_s: float) -> None:
        self.workers: dict[str, WorkerView] = {}
        self.heartbeat_interval_s = heartbeat_interval_s
        #: monotonic seconds when this directory started listening
        self.started_mono = time.monotonic()

    def observe(self, hb: Heartbeat) -> None:
        """A heartbeat arrived."""
        self.workers[hb.worker_id] = WorkerView(hb, time.monotonic())

    def saw(self, worker_id: str) -> None:
        """A result from ``worker_id`` arrived: proof of life between heartbeats."""
        view = self.workers.get(worker_id)
        if view is not None:
            view.seen_at = time.monotonic()

    def live(self) -> list[Heartbeat]:
        """Workers heard from within three heartbeat intervals."""
        now = time.monotonic()
        return [
            w.heartbeat
            for w in self.workers.values()
            if now - w.seen_at <= 3 * max(w.heartbeat.interval_s, 0.1)
        ]

    def is_live(self, worker_id: str) -> bool:
        """Whether ``worker_id`` was heard from within three of its heartbeat intervals."""
        view = self.workers.get(worker_id)
        if view is None:
            return False
        return time.monotonic() - view.seen_at <= 3 * max(view.heartbeat.interval_s, 0.1)

    def in_startup_grace(self) -> bool:
        """Whether the directory has listened for less than three heartbeat intervals
        (so it cannot yet know that a lane has no worker)."""
        return time.monotonic() - self.started_mono < 3 * self.heartbeat_interval_s

    def lane_served(self, pool: str, machine_profile: str, bundle: str) -> bool:
        """Whether a live worker consumes this lane (architecture §2 provisioning rule);
        True during the startup grace, so that early requests queue rather than fail."""
        lane = (pool, machine_profile, bundle)
        if any(
            (hb.pool.lower(), hb.machine_profile.lower(), hb.bundle) == lane for hb in self.live()
        ):
            return True
        return self.in_startup_grace()

    def connected(self) -> dict[str, int]:
        """Live workers per bundle."""
        out: dict[str, int] = {}
        for hb in self.live():
            out[hb.bundle] = out.get(hb.bundle, 0) + 1
        return out

    def acks(self) -> list[WorkerAck]:
        """Each known worker's config hash and health, for worker-ack status (§6)."""
        live = {hb.worker_id for hb in self.live()}
        return [
            WorkerAck(
                worker_id=w.heartbeat.worker_id,
                bundle=w.heartbeat.bundle,
                pool=w.heartbeat.pool,
                bundle_config_hash=w.heartbeat.bundle_config_hash,
                healthy=w.heartbeat.worker_id in live and w.heartbeat.ready,
            )
            for w in self.workers.values()
        ]

    def model_state(self, model_id: str) -> tuple[str, dict[str, Any] | None]:
        """Aggregate state over live workers (docs/api.md §7 precedence):
        loading > unloading > loaded > failed > available."""
        states: list[str] = []
        last_error = None
        for m in self._model_reports(model_id):
            states.append(m.state)
            last_error = m.last_error or last_error
        for s in ("loading", "unloading", "loaded", "failed"):
            if s in states:
                return s, last_error
        return "available", last_error

    def model_counts(self, model_id: str) -> dict[str, int]:
        """Loads and evictions of ``model_id`` summed over live workers (docs/api.md §10)."""
        reports = self._model_reports(model_id)
        return {
            "loads": sum(m.loads for m in reports),
            "evictions": sum(m.evictions for m in reports),
        }

    def model_engines(self, model_id: str) -> list[str]:
        """The engines live workers serve ``model_id`` with, when its profile picks one
        at load (``ModelStatus.engine``; docs/api.md §7), sorted and distinct."""
        return sorted(
            {m.engine for m in self._model_reports(model_id) if m.engine and m.state == "loaded"}
        )

    def _model_reports(self, model_id: str) -> list[ModelStatus]:
        return [m for hb in self.live() for m in hb.models if m.name == model_id]
