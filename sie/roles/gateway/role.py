"""The gateway role: route requests to lanes, publish work items, collect results.

Architecture §2 and §16.2: resolve model → bundle → pool → machine profile
(``X-SIE-Pool`` / ``X-SIE-Machine-Profile`` override), publish one ``WorkItem`` per
input item on ``sie.work.{pool}.{machine_profile}.{bundle}.{model}``, and collect
``WorkResult``s on the one app-wide inbox subscription ``_INBOX.{router_id}.>``,
keyed by request id. Worker heartbeats on ``sie.health.>`` feed ``/health`` and
model states. The role knows nothing of HTTP.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import anyio.abc

from sie.control.ack_status import worker_ack_status
from sie.control.sync import ConfigSync
from sie.core.errors import (
    GatewayTimeout,
    Provisioning,
    ShuttingDown,
    SieError,
)
from sie.core.ids import uuid7
from sie.core.registry import ModelEntry, ModelRegistry
from sie.core.subjects import (
    HEALTH_WILDCARD,
    cancel_subject,
    config_subject,
    inbox_subject,
    inbox_wildcard,
    work_subject,
)
from sie.core.wire import Heartbeat, WorkItem
from sie.roles.config_sync import run_config_sync
from sie.roles.gateway.admission import AdmissionGate
from sie.roles.gateway.capped import CappedDispatch
from sie.roles.gateway.collect import Collected, Collector, raise_failures, window_credits
from sie.roles.gateway.directory import WorkerDirectory
from sie.roles.gateway.dlq import DeadLetters
from sie.roles.gateway.functions import FunctionRequests
from sie.roles.gateway.generation import GenerationDispatch
from sie.roles.gateway.inbox import ResultInbox
from sie.roles.gateway.keda import LaneSnapshot
from sie.roles.gateway.lanes import Lane, LaneTelemetry
from sie.roles.gateway.offload import Offloader, sweep_orphans
from sie.roles.gateway.pending import StreamPending
from sie.roles.gateway.pools import PoolManager, PoolRoute
from sie.roles.gateway.publish import PublishSpan, WorkPublisher
from sie.roles.gateway.rates import RateMeter
from sie.roles.gateway.requests import Routing
from sie.roles.gateway.shedding import admit
from sie.roles.gateway.work import encode_work
from sie.settings_views import BusSettings, GatewaySettings, LimitsSettings
from sie.telemetry import METRICS, Metrics
from sie.transport.base import Bus, Subscription
from sie.transport.payloads import PayloadStore

__all__ = ["GatewayRole"]

log = logging.getLogger(__name__)


class GatewayRole(FunctionRequests):
    """Routing, dispatch and result collection. Start ``run`` in a task group."""

    def __init__(
        self,
        bus: Bus,
        registry: ModelRegistry,
        settings: GatewaySettings,
        *,
        streams: BusSettings,
        limits: LimitsSettings,
        sync: ConfigSync,
        admission: AdmissionGate,
        directory: WorkerDirectory,
        payloads: PayloadStore,
        pools: PoolManager,
        metrics: Metrics = METRICS,
    ) -> None:
        """Wire the role from its collaborators (``sie.container`` builds them); no I/O.

        ``settings``: the gateway's own view; ``streams``: the work-stream limits it
        publishes under; ``limits``: per-request bounds; ``sync``: config convergence
        over ``registry``; ``admission``: the generation gate; ``directory``: workers
        as their heartbeats describe them; ``payloads``: where work items over the
        bus's ``max_payload`` go (docs/api.md §12); ``pools``: pools and the
        resolution of ``X-SIE-Pool`` (docs/pools.md).
        """
        self.bus = bus
        self.registry = registry
        self.settings = settings
        self.streams = streams
        self.limits = limits
        self.router_id = settings.router_id
        self._given_up = False
        self.payloads = payloads
        self.offloader = Offloader(bus, payloads, self.router_id, metrics)
        self.requests = RateMeter()  # encode/score/extract requests, for /health
        self.metrics = metrics
        # results (whole or chunked) to the requests waiting for them
        self.inbox = ResultInbox(metrics, directory.saw, max_result_bytes=limits.max_response_bytes)
        self._pending = self.inbox.pending
        # per-lane in-flight items, admission decisions and pending demand (§2)
        self.lanes = LaneTelemetry(metrics)
        self.pending = StreamPending(bus, streams)  # items per pool's work stream
        self.publisher = WorkPublisher(bus, self.pending, self.lanes)
        # capped pools: worker-direct with pool fallback (architecture §8)
        self.capped = CappedDispatch(
            bus, self.publisher, directory, self.router_id, settings.direct_fallback_s
        )
        self.directory = directory
        self.started_at = time.time()
        self.sync = sync
        self.epoch = sync.epoch
        # generation: engine-state admission (admission-gate.md) and worker-direct dispatch
        self.admission = admission
        self.pools = pools
        self.generation = GenerationDispatch(
            bus=bus,
            registry=registry,
            directory=directory,
            lanes=self.lanes,
            admission=admission,
            router_id=self.router_id,
            lane_of=self.lane_of,
            capped_ring=pools.capped_ring,
            offloader=self.offloader,
        )
        self.dead_letters = DeadLetters(
            bus, storage=streams.stream_storage, replicas=streams.stream_replicas
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Subscribe (inbox, health, config deltas on ``sie.config.models._all``), start
        config sync (never blocking startup, §4), then collect results until cancelled."""
        inbox = await self.bus.subscribe(inbox_wildcard(self.router_id))
        health = await self.bus.subscribe(HEALTH_WILDCARD)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read_health, health)
                tg.start_soon(sweep_orphans, self.payloads, self.streams.stream_max_age_s)
                await tg.start(self.pools.run)
                snapshot = LaneSnapshot(
                    self.bus, self.pools, self.lanes, self.metrics, self.router_id
                )
                await tg.start(snapshot.run)  # the autoscaler's inputs (§15)
                await tg.start(run_config_sync, self.bus, self.sync, config_subject("_all"))
                await tg.start(self.dead_letters.run)
                await tg.start(self.admission.run)
                task_status.started()
                await self._read_inbox(inbox)
        finally:
            with anyio.CancelScope(shield=True):
                await inbox.unsubscribe()
                await health.unsubscribe()

    def model_status(self, model_id: str) -> dict[str, Any]:
        """Worker-ack status of ``model_id`` as this gateway sees it (architecture §6).

        Raises:
            ModelNotFound: unknown base model id.
        """
        acks = self.directory.acks()
        return worker_ack_status(self.registry.snapshot, model_id, acks, self.epoch.get())

    @property
    def late_results(self) -> int:
        """Results dropped undecoded: their request had already ended."""
        return self.inbox.late_results

    async def _read_inbox(self, sub: Subscription) -> None:
        async for msg in sub:
            # The inbox subject names the request (_INBOX.{router_id}.{request_id}): late
            # results of finished or abandoned requests are dropped before decoding.
            rid = msg.subject.rsplit(".", 1)[-1]
            if self.generation.owns(rid):
                self.generation.deliver(rid, msg.data)
            else:
                self.inbox.deliver(rid, msg.data)

    async def _read_health(self, sub: Subscription) -> None:
        async for msg in sub:
            try:
                hb = Heartbeat.from_bytes(msg.data)
            except SieError:
                continue
            self.directory.observe(hb)
            self.generation.observe_heartbeat(hb)

    def live_workers(self) -> list[Heartbeat]:
        """Workers heard from within three heartbeat intervals."""
        return self.directory.live()

    def lane_served(self, pool: str, machine_profile: str, bundle: str) -> bool:
        """Whether a live worker consumes this lane (``WorkerDirectory.lane_served``)."""
        return self.directory.lane_served(pool, machine_profile, bundle)

    async def _admit(self, lane: Lane, pool: str, n_items: int, *, record: bool = True) -> None:
        """Backpressure (``sie.roles.gateway.shedding.admit``).

        Raises:
            Backpressure: 503 with Retry-After 5.
        """
        await admit(
            self.settings, self.streams, self.lanes, self.pending, lane, pool, n_items, record
        )

    async def refuse_if_full(
        self, model_id: str, pool: str | None = None, machine_profile: str | None = None
    ) -> None:
        """Before a request's body is read: refuse it if its pool's work stream is
        already at ``max_stream_pending``, so an overloaded gateway does not spend the
        body's decoding and validation on work it must refuse (docs/security.md
        "Liveness"). Anything else (an unknown model, a bad header) is left to the
        request's own checks.

        Raises:
            Backpressure: 503 ``QUEUE_FULL``, Retry-After 5.
        """
        try:
            entry, bundle = self.registry.resolve(model_id)
            route, profile = self.lane_of(entry, bundle, pool, machine_profile)
        except SieError:
            return
        pool_ = route.queue_pool
        await self._admit(self.lanes.lane(pool_, profile, bundle), pool_, 0, record=False)

    def lane_of(
        self, entry: ModelEntry, bundle: str, pool: str | None, machine_profile: str | None
    ) -> tuple[PoolRoute, str]:
        """Where a request goes (``PoolManager.lane``: pool, machine profile, catalog).

        Raises:
            InvalidInput (400), PoolNotFound (404), Provisioning (503).
        """
        return self.pools.lane(entry.config.effective_pool, bundle, pool, machine_profile)

    async def _run(
        self,
        entry: ModelEntry,
        bundle: str,
        operation: str,
        works: list[dict[str, Any]],
        routing: Routing,
    ) -> Collected:
        """Route to the lane, admit, publish one work item per ``works`` entry (its
        fields go into the ``WorkItem``; entries differ only in ``item``) and collect
        every result (§2, §16.2)."""
        t0 = time.monotonic()
        self.requests.tick()
        model_id = entry.model_id  # canonical: "m:default" is "m"
        route, profile = self.lane_of(entry, bundle, routing.pool, routing.machine_profile)
        pool = route.queue_pool
        lane = self.lanes.lane(pool, profile, bundle)
        request_id = routing.request_id or uuid7()
        direct = self.pools.direct_worker(route, profile, bundle, request_id)
        # a pool the caller named is published to even with no worker yet (§2: its
        # capacity scales from zero), unless it is capped and none of its workers is
        # live (only they could take it); otherwise no live worker is PROVISIONING
        empty = direct is None and self.pools.capped_ring(route, profile, bundle) == []
        if empty or (not route.pinned and not self.lane_served(pool, profile, bundle)):
            self.lanes.record_demand(lane, "provisioning")  # for the autoscaler (§2)
            raise Provisioning(
                f"no worker serves pool {route.logical!r}, machine profile {profile!r}, "
                f"bundle {bundle!r}; retry later",
                pool=pool,
                machine_profile=profile,
                bundle=bundle,
            )
        n = len(works)
        await self._admit(lane, pool, n)
        self.pending.reserve(pool, n)
        unsent = [n]  # this request's admitted items not yet published
        subject = work_subject(pool, profile, bundle, model_id)
        reply = inbox_subject(self.router_id, request_id)
        col = Collector(
            n, [None] * n, n, credits=window_credits(n, self.settings.request_window_items)
        )
        self.lanes.add_in_flight(lane, n)
        self._pending[request_id] = col
        published = False
        stored: list[str] = []  # payload-store keys of items sent by reference
        span = PublishSpan(operation, model_id, route.logical)  # §15.1
        try:
            await self.pending.ensure_stream(pool)
            first = WorkItem(
                work_item_id=f"{request_id}.0",
                request_id=request_id,
                item_index=0,
                total_items=n,
                operation=operation,
                model_id=model_id,
                profile_id=entry.profile.name,
                pool_name=pool,
                admission_pool=route.logical,
                machine_profile=profile,
                router_id=self.router_id,
                reply_subject=reply,
                timestamp=time.time(),
                accepts_result_chunks=True,
                traceparent=span.traceparent,
                tracestate=span.tracestate,
                **works[0],
            )
            work = await encode_work(first, works)
            await self.offloader.offload(work, stored, request_id)
            published = True
            wait_s = routing.timeout_s or self.settings.request_timeout_s
            try:
                with anyio.fail_after(wait_s):
                    if direct is not None:  # a capped pool's assigned worker (§8)
                        publish_ms = (time.monotonic() - t0) * 1000.0
                        await self.capped.run(
                            direct, subject, lane, pool, work, unsent, col, request_id
                        )
                    else:  # a large request publishes a window ahead of its results
                        await self.publisher.publish_all(
                            subject, lane, pool, work, unsent, col.credits
                        )
                        publish_ms = (time.monotonic() - t0) * 1000.0
                    self.lanes.clear_demand(lane)  # the lane is being served (§8)
                    span.end(publish_ms)
                    if not self._given_up:
                        await col.done.wait()
            except TimeoutError:
                got = sum(r is not None for r in col.results)
                raise GatewayTimeout(
                    f"the request did not complete within {wait_s:g}s ({got}/{n} items arrived)",
                    request_id=request_id,
                ) from None
            if col.failure is not None:
                raise col.failure
            if col.remaining:
                raise ShuttingDown(
                    f"the gateway is shutting down ({n - col.remaining}/{n} items arrived); "
                    "retry on another replica",
                    request_id=request_id,
                )
        finally:
            span.end()
            self.pending.release(pool, unsent[0])
            self.inbox.close(request_id)
            self.lanes.add_in_flight(lane, -n)
            if published and col.remaining:
                await self._abandon(request_id)
            await self.offloader.release(stored)
        results = [r for r in col.results if r is not None]
        raise_failures(results)
        return Collected(request_id, entry, results, publish_ms, (time.monotonic() - t0) * 1000.0)

    def give_up_waiting(self) -> None:
        """End of the shutdown drain: every request still waiting for worker results
        answers 503 ``SHUTTING_DOWN`` (Retry-After 5) now, while the listener can still
        send it, and later ones at once. Workers get ``work_cancel`` for their items."""
        self._given_up = True
        for col in self._pending.values():
            col.done.set()
            if col.credits is not None:  # a windowed publisher stops waiting too
                for _ in range(col.total):
                    col.credits.release()

    async def _abandon(self, request_id: str) -> None:
        """Best-effort ``work_cancel`` so workers drop this request's remaining items (§8)."""
        with anyio.CancelScope(shield=True):
            try:
                await self.bus.publish(cancel_subject(self.router_id, request_id), b"")
            except SieError as exc:
                log.warning("cannot publish work_cancel for %s: %s", request_id, exc.message)
