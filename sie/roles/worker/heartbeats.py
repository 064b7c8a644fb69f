"""A worker's heartbeats on ``sie.health.{worker_id}`` (architecture §6, §8.1): one every
``SIE_HEARTBEAT_INTERVAL_S``, and one at once when something it reports changes (a
model's state, readiness). While a generation engine is loaded the interval is at most
``SIE_ADMISSION_POLL_INTERVAL_S``: the gateways' admission gate reads the engine's state
from these heartbeats (admission-gate.md "What the gate reads")."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from sie.core.subjects import health_subject
from sie.core.wire import Heartbeat
from sie.transport.base import Bus, BusError

__all__ = ["Heartbeats"]

log = logging.getLogger(__name__)


class Heartbeats:
    """Publishes what ``make()`` reports; ``changed()`` sends the next one now."""

    def __init__(
        self,
        bus: Bus,
        worker_id: str,
        make: Callable[[], Heartbeat],
        interval_s: float,
        engine_interval_s: float,
    ) -> None:
        self.bus = bus
        self.subject = health_subject(worker_id)
        self.make = make
        self.interval_s = interval_s
        self.engine_interval_s = engine_interval_s
        self._changed = anyio.Event()

    def changed(self) -> None:
        self._changed.set()

    async def run(self) -> None:
        """Publish until cancelled; a broker outage is logged once, not per beat."""
        failing = False
        while True:
            hb = self.make()
            try:
                await self.bus.publish(self.subject, hb.to_bytes())
                if failing:
                    log.info("heartbeats flowing again")
                failing = False
            except BusError as exc:
                if not failing:
                    log.warning("heartbeat publish failed: %s", exc)
                failing = True
            self._changed = anyio.Event()
            interval = self.interval_s
            if any(m.engine_state is not None for m in hb.models):
                interval = min(interval, self.engine_interval_s)
            with anyio.move_on_after(interval):
                await self._changed.wait()
