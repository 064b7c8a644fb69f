"""The engine-state admission gate a gateway puts in front of generation
(admission-gate.md "The decision", "Parked streaming requests").

Usage from a gateway handler::

    gate = AdmissionGate(admission_config(settings), metrics)
    gate.observe("llama", "http://vllm:8000/metrics")   # external engine, polled
    # in-process engines: gate.update(model, state) from each worker heartbeat
    await tg.start(gate.run)                            # polls the HTTP observers

    async def keepalive() -> None:                      # streaming requests only
        await send_sse_comment(": keep-alive\\n\\n")
    await gate.admit(model, on_keepalive=keepalive)     # raises AdmissionRejected (503)

Per gated model the gate keeps one ``EngineObserver`` (its state source), a FIFO of
parked requests and the times of its own admissions. ``admit``:

1. returns at once for a model not in ``observe_models`` (and fails open when the
   engine was never read or its state is stale);
2. otherwise, when nobody is parked, applies ``sie.core.admission.decide`` with this
   gateway's admissions since the reading was taken counted against the headroom;
3. else parks the request at the back of the model's queue. Only the head of the
   queue decides, so a later request never overtakes an earlier parked one. The
   head re-checks on every new reading or stale transition and at least every
   ``poll_interval_s``; each admission wakes the next. A parked request calls
   ``on_keepalive`` every ``keepalive_s`` and, after ``max_park_s``, leaves the queue
   with ``AdmissionRejected`` (503 ``ENGINE_SATURATED``, Retry-After 5). A cancelled
   waiter (client disconnect) leaves the queue too.

The cross-replica bound of this accounting is derived in ``sie.core.admission``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import httpx

from sie.core.admission import (
    REASON_INFLIGHT,
    REASON_UNGATED,
    AdmissionConfig,
    Decision,
    EngineState,
    decide,
)
from sie.core.errors import AdmissionRejected
from sie.engines.runtime.observer import EngineObserver
from sie.settings_views import AdmissionSettings
from sie.telemetry import Metrics

__all__ = ["AdmissionGate", "admission_config"]

log = logging.getLogger(__name__)


def admission_config(settings: AdmissionSettings) -> AdmissionConfig:
    """The ``AdmissionConfig`` of ``SIE_ADMISSION_*`` settings (admission-gate.md)."""
    return AdmissionConfig(
        kv_threshold=settings.admission_kv_threshold,
        max_inflight=settings.admission_max_inflight,
        max_park_s=settings.admission_max_park_s,
        poll_interval_s=settings.admission_poll_interval_s,
        keepalive_s=settings.admission_keepalive_s,
        observe_models=frozenset(settings.admission_observe_models) or None,
    )


class _Lane:
    """Per-model gate state: the state source, the FIFO of parked requests, own admits."""

    def __init__(self, observer: EngineObserver) -> None:
        self.observer = observer
        self.queue: deque[object] = deque()
        #: monotonic times of this gateway's admissions not yet older than the reading
        self.admits: deque[float] = deque()
        self.last_reason = REASON_INFLIGHT
        self._event: anyio.Event | None = None
        observer.subscribe(self.notify)

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    def event(self) -> anyio.Event:
        if self._event is None:
            self._event = anyio.Event()
        return self._event

    def decide(self, cfg: AdmissionConfig) -> Decision:
        reading = self.observer.current()
        if reading is None:
            self.admits.clear()
            return decide(None, cfg, local_admits=0)
        while self.admits and self.admits[0] < reading.taken_at:
            self.admits.popleft()
        return decide(reading.state, cfg, local_admits=len(self.admits))


class AdmissionGate:
    """Engine-state admission for generation (admission-gate.md).

    Args:
        cfg: thresholds, intervals (seconds) and the gated models.
        metrics: ``admission_parked_total``, ``admission_rejected_total`` and the
            observers' series.
        client_factory: builds each HTTP observer's own client (default: httpx with
            the observer's timeout).
        clock: monotonic seconds, shared with the observers.
    """

    def __init__(
        self,
        cfg: AdmissionConfig,
        metrics: Metrics,
        *,
        client_factory: Callable[[], httpx.AsyncClient] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self._client_factory = client_factory
        self._clock = clock
        self._lanes: dict[str, _Lane] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    def gated(self, model: str) -> bool:
        """Whether ``admit`` checks ``model`` (it is in ``observe_models``)."""
        return self.cfg.gates(model)

    def observe(
        self, model: str, url: str | None = None, *, max_num_seqs: int | None = None
    ) -> EngineObserver:
        """Register the engine serving ``model``: polled at ``url`` (its ``/metrics``)
        once ``run`` is running, or, with no URL, fed through ``update``. Replaces an
        observer registered before ``run`` started; returns the observer."""
        lane = self._lanes.get(model)
        if lane is not None and lane.observer.url == url:
            lane.observer.max_num_seqs = max_num_seqs or lane.observer.max_num_seqs
            return lane.observer
        observer = EngineObserver(
            url,
            model=model,
            cfg=self.cfg,
            metrics=self.metrics,
            client_factory=self._client_factory,
            max_num_seqs=max_num_seqs,
            clock=self._clock,
        )
        if lane is None:
            self._lanes[model] = _Lane(observer)
        else:
            lane.observer = observer
            observer.subscribe(lane.notify)
        if url is not None and self._tg is not None:
            self._tg.start_soon(observer.run)
        return observer

    def observer(self, model: str) -> EngineObserver:
        """The state source of ``model`` (a push-fed one is created on first use)."""
        return self._lane(model).observer

    def _lane(self, model: str) -> _Lane:
        lane = self._lanes.get(model)
        if lane is None:
            self.observe(model)
            lane = self._lanes[model]
        return lane

    def update(self, model: str, state: EngineState, *, taken_at: float | None = None) -> None:
        """Feed an in-process reading of ``model``'s engine (a worker heartbeat)."""
        self.observer(model).update(state, taken_at=taken_at)

    def parked(self, model: str) -> int:
        """Requests parked for ``model`` now."""
        lane = self._lanes.get(model)
        return len(lane.queue) if lane is not None else 0

    def local_admits(self, model: str) -> int:
        """This gateway's admissions of ``model`` counted against the latest reading."""
        lane = self._lanes.get(model)
        if lane is None:
            return 0
        lane.decide(self.cfg)  # prunes admissions older than the reading
        return len(lane.admits)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run every HTTP observer (each self-checks first) until cancelled; observers
        registered later start at once. Signals started after the self-checks."""
        models = sorted(self.cfg.observe_models or ())
        log.info(
            "admission gate: models=%s kv_threshold=%.2f max_inflight=%s max_park_s=%g "
            "poll_interval_s=%g keepalive_s=%g",
            ",".join(models) or "(none: gate off)",
            self.cfg.kv_threshold,
            self.cfg.max_inflight or "engine max_num_seqs",
            self.cfg.max_park_s,
            self.cfg.poll_interval_s,
            self.cfg.keepalive_s,
        )
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for lane in list(self._lanes.values()):
                    if lane.observer.url is not None:
                        await tg.start(lane.observer.run)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None

    async def admit(
        self,
        model: str,
        *,
        on_keepalive: Callable[[], Awaitable[None]] | None = None,
        on_park: Callable[[], None] | None = None,
    ) -> Decision:
        """Wait until ``model``'s engine has room for one more request.

        Args:
            model: the requested model.
            on_keepalive: awaited every ``keepalive_s`` seconds while parked (a streaming
                handler writes ``: keep-alive\\n\\n``); an exception it raises (client
                gone) ends the wait and leaves the queue.
            on_park: called once, before waiting, when the request is parked.

        Returns:
            The admitting decision (``reason``: ``ungated``, ``unknown`` or ``headroom``).

        Raises:
            AdmissionRejected: parked for ``max_park_s`` seconds (503, Retry-After 5);
                ``fields``: ``model``, ``reason`` (``kv_cache`` / ``inflight``),
                ``parked_s``.
        """
        if not self.cfg.gates(model):
            return Decision(True, REASON_UNGATED)
        lane = self._lane(model)
        if not lane.queue:
            d = lane.decide(self.cfg)
            if d.admit:
                lane.admits.append(self._clock())
                return d
            lane.last_reason = d.reason
        if on_park is not None:  # e.g. a streaming handler starts its response now
            on_park()
        return await self._park(model, lane, on_keepalive)

    async def _park(
        self,
        model: str,
        lane: _Lane,
        on_keepalive: Callable[[], Awaitable[None]] | None,
    ) -> Decision:
        cfg = self.cfg
        self.metrics.admission_parked.labels(model).inc()
        me = object()
        lane.queue.append(me)
        start = self._clock()
        deadline = start + cfg.max_park_s
        next_keepalive = start + cfg.keepalive_s
        try:
            while True:
                if lane.queue[0] is me:
                    d = lane.decide(cfg)
                    if d.admit:
                        lane.queue.popleft()
                        lane.admits.append(self._clock())
                        lane.notify()  # the next parked request re-checks now
                        return d
                    lane.last_reason = d.reason
                now = self._clock()
                if now >= deadline:
                    reason = lane.last_reason
                    self.metrics.admission_rejected.labels(model, reason).inc()
                    raise AdmissionRejected(
                        f"model {model!r} engine saturated ({reason}); parked "
                        f"{now - start:.1f} s, retry later",
                        model=model,
                        reason=reason,
                        parked_s=round(now - start, 3),
                    )
                if on_keepalive is not None and now >= next_keepalive:
                    await on_keepalive()
                    next_keepalive += cfg.keepalive_s
                    now = self._clock()
                    if next_keepalive <= now:  # the callback was slow: no burst
                        next_keepalive = now + cfg.keepalive_s
                    continue  # re-check: things may have changed during the callback
                wake = min(deadline, now + cfg.poll_interval_s)
                if on_keepalive is not None:
                    wake = min(wake, next_keepalive)
                # no await between the checks above and taking the event: no lost wake-up
                event = lane.event()
                with anyio.move_on_after(max(0.0, wake - now)):
                    await event.wait()
        finally:
            if me in lane.queue:
                was_head = lane.queue[0] is me
                lane.queue.remove(me)
                if was_head:
                    lane.notify()
