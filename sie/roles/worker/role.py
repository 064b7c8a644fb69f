"""The worker role: pull work items from its lane, batch them, publish results.

Lane: ``sie.work.{pool}.{machine_profile}.{bundle}.*`` on stream
``WORK_POOL_{pool}`` (architecture §8.2), durable consumer
``{bundle}_{machine_profile}``. For each work item (§16.2 step 3): decode, resolve
the model in the local registry, load it on first use (``sie.engines.runtime.cache``: memory
budget, LRU eviction), run its operation (encode, score or extract) through the
model's token-budget batcher (``sie.roles.worker.tasks``), publish the ``WorkResult`` on
the item's ``reply_subject``, and only then ack. A failing item yields an error result with
a code (the worker never dies of bad input); a result that cannot be published
is NAKed for redelivery, so acknowledged work is never lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from sie.control.sync import ConfigSync
from sie.core.errors import InferenceError, ModelNotFound, PoolNotFound, SieError
from sie.core.registry import ModelEntry, ModelRegistry
from sie.core.subjects import (
    CANCEL_WILDCARD,
    batch_cancel_wildcard,
    config_subject,
)
from sie.core.trust import ConfigTrust
from sie.core.wire import (
    GenerationChunk,
    Heartbeat,
    WorkItem,
    WorkResult,
    packb,
    salvage_reply,
)
from sie.engines.runtime.cache import ModelCache
from sie.roles.config_sync import run_config_sync
from sie.roles.worker.admission import ADMISSION_RETRY_S, PoolAdmission
from sie.roles.worker.cancels import Cancellations
from sie.roles.worker.direct import run_direct
from sie.roles.worker.generation import run_generation
from sie.roles.worker.heartbeats import Heartbeats
from sie.roles.worker.payloads import error_result, fetch_item, publish_result
from sie.roles.worker.streams import attach_pool
from sie.roles.worker.tasks import run_task, trace_context
from sie.settings_views import BusSettings, WorkerSettings
from sie.telemetry import METRICS, Metrics, tracer
from sie.transport.base import Bus, BusError, JsMsg, PullConsumer, Subscription
from sie.transport.payloads import PayloadStore

__all__ = ["WorkerRole"]

#: An item for a model this worker does not know yet is retried (NAK, seconds) this many
#: deliveries while its config catches up, then fails with MODEL_NOT_FOUND.
CONFIG_LAG_DELIVERIES = 5
CONFIG_LAG_RETRY_S = 1.0

log = logging.getLogger(__name__)


class WorkerRole:
    """Consumes one lane and serves every model of its bundle.

    ``trust``: the operator's policy each model load is checked against (default: built
    from ``settings``, ``sie.roles.trust``; docs/security.md "Trust model").
    """

    def __init__(
        self,
        bus: Bus,
        registry: ModelRegistry,
        settings: WorkerSettings,
        metrics: Metrics = METRICS,
        *,
        streams: BusSettings,
        sync: ConfigSync,
        models: ModelCache,
        trust: ConfigTrust,
        payloads: PayloadStore,
        pools: PoolAdmission,
    ) -> None:
        """Wire the role from its collaborators (``sie.container`` builds them); no I/O.

        ``settings``: the worker's own view; ``streams``: the work stream and consumer
        limits; ``sync``: config convergence over ``registry`` (deltas on
        ``sie.config.models.{bundle}``, plus the export reconciler when a config
        service URL is known, architecture §6, architecture §15); ``models``: the model cache
        (``sie.roles.worker.models.build_model_cache``); ``trust``: the policy each
        load is checked against; ``payloads``: where items sent by reference are
        fetched from (docs/api.md §12); ``pools``: which pools assign this worker
        and what they pin (docs/pools.md).
        """
        self.pools = pools
        self.bus = bus
        self.registry = registry
        self.trust = trust
        self.payloads = payloads
        self.settings = settings
        self.streams = streams
        self.metrics = metrics
        self.worker_id = settings.worker_id
        self.beats = Heartbeats(
            bus,
            self.worker_id,
            self.heartbeat,
            settings.heartbeat_interval_s,
            settings.admission_poll_interval_s,
        )
        self.models = models
        models.add_listener(self._notify)
        # fast_acquire: an uncontended acquire does not yield to the event loop (one trip
        # fewer per work item; docs/performance.md "Where the time goes")
        self._inflight = anyio.Semaphore(settings.max_inflight_items, fast_acquire=True)
        self.sync = sync
        sync.add_listener(self._notify)
        self.epoch = sync.epoch
        self._resync_lock = anyio.Lock()
        self._last_resync = 0.0
        # request ids abandoned by their gateway, and the live work of each request
        self.cancels = Cancellations()
        # requests whose direct items a gateway republished to the pool (§8)
        self.direct_cancels = Cancellations()
        # messages this worker holds (pulled, not yet settled): kept alive with
        # in_progress so only a dead or hung worker's items are redelivered
        self._held: dict[int, JsMsg] = {}
        self.ready = False

    def _notify(self) -> None:
        self.beats.changed()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start config sync, learn the bundle (from the seed, or from the config
        service's bootstrap when the worker has no seed), then heartbeats, attach the
        lane consumer (waiting for the bus if it is not reachable yet), preload, and
        serve until cancelled.

        Raises:
            SieError: the bundle is unknown to the seed and to the config service, or
                a ``--preload`` model id is unknown.
        """
        s = self.settings
        if s.bundle not in self.registry.snapshot.bundles and self.sync.base_url is None:
            raise SieError(
                f"worker bundle {s.bundle!r} is not among the loaded bundles (give "
                "--bundles-dir, or SIE_CONFIG_SERVICE_URL to load it from the config service)"
            )
        cancels = await self.bus.subscribe(CANCEL_WILDCARD)
        batch_cancels = await self.bus.subscribe(batch_cancel_wildcard(self.worker_id))
        async with anyio.create_task_group() as tg:
            await tg.start(self.models.run)
            tg.start_soon(self._read_cancels, cancels, self.cancels)
            tg.start_soon(self._read_cancels, batch_cancels, self.direct_cancels)
            await tg.start(run_config_sync, self.bus, self.sync, config_subject(s.bundle))
            task_status.started()
            await self._await_bundle()
            preload = [self.registry.resolve(m)[0] for m in s.preload]  # unknown id: fail
            tg.start_soon(self.beats.run)
            tg.start_soon(self._keep_held_alive)
            consumer = await attach_pool(self.bus, self.settings, self.streams)
            # work sent to this worker alone (architecture §8): durable, per worker
            start, take = self._start_generation(tg), self._take_direct(tg)
            tg.start_soon(run_direct, self.bus, s, self.streams, start, take)
            await tg.start(self.pools.run)  # pinned models load with the preloads
            for entry in preload:
                try:
                    await self.models.get(entry)
                except SieError as exc:
                    log.error("preload of %s failed: %s", entry.model_id, exc.message)
            self.ready = True
            self.beats.changed()
            loaded = [m.name for m in self.models.statuses() if m.state == "loaded"]
            log.info(
                "worker %s ready (lane %s/%s/%s); models loaded: %s",
                self.worker_id,
                s.pool,
                s.machine_profile,
                s.bundle,
                ", ".join(loaded) or "none",
            )
            await self._pull_loop(consumer, tg)

    async def _await_bundle(self) -> None:
        """Wait until the registry knows this worker's bundle (architecture §4: a worker
        without a seed learns its bundle from the config service's bootstrap, which
        retries with backoff while the service is away).

        Raises:
            SieError: the config service bootstrapped and does not know the bundle.
        """
        bundle = self.settings.bundle
        logged = False
        while bundle not in self.registry.snapshot.bundles:
            if self.sync.bootstrapped:
                raise SieError(
                    f"worker bundle {bundle!r} is unknown to the config service at "
                    f"{self.sync.base_url}"
                )
            if not logged:
                log.info("waiting for bundle %r from the config service", bundle)
                logged = True
            await anyio.sleep(0.1)

    async def _read_cancels(self, sub: Subscription, into: Cancellations) -> None:
        """``work_cancel.{router_id}.{request_id}`` (tombstone the request, stop its
        items) or ``batch_cancel.{router_id}.{worker_id}.{request_id}`` (drop its
        queued direct items, §8)."""
        async for msg in sub:
            into.cancel(msg.subject.rsplit(".", 1)[-1])

    def _take_direct(self, tg: anyio.abc.TaskGroup) -> Callable[[JsMsg, WorkItem], Awaitable[None]]:
        """Handle each encode/score/extract item sent to this worker alone in ``tg``."""

        async def take(msg: JsMsg, item: WorkItem) -> None:
            if item.request_id in self.direct_cancels:  # republished to the pool (§8)
                await self._drop_cancelled(msg, item)
                return
            await self._inflight.acquire()
            tg.start_soon(self._handle, msg, item, True)

        return take

    def _start_generation(self, tg: anyio.abc.TaskGroup) -> Callable[[WorkItem], None]:
        """Run each generation handed over in its own task of ``tg``."""

        def start(item: WorkItem) -> None:
            tg.start_soon(self._generate, item)

        return start

    async def _generate(self, item: WorkItem) -> None:
        """Run one generation, streaming its chunks to ``item.reply_subject``; a
        ``work_cancel`` for its request aborts it in the engine."""

        async def publish(chunk: GenerationChunk) -> None:
            await self.bus.publish(item.reply_subject, chunk.to_bytes())

        scope = self.cancels.open(item.request_id)
        try:
            if item.payload_ref is not None:  # sent by reference (docs/api.md §12)
                item = (await fetch_item(self.payloads, item, self.metrics))[0]
            with (
                scope,
                tracer.start_as_current_span(  # §15.1: nests under the gateway's span
                    "worker.streaming_processor",
                    context=trace_context(item),
                    attributes={
                        "sie.model": item.model_id,
                        "sie.request_id": item.request_id,
                        "sie.attempt_id": item.work_item_id,
                    },
                ),
            ):
                entry = self._entry(item)
                async with self.models.use(entry, self.settings.model_load_wait_s) as loaded:
                    await run_generation(loaded.engine, item, publish, self.worker_id)
        except Exception as exc:  # any failure ends this request; the worker lives on
            if not isinstance(exc, SieError):
                log.exception("generation %s failed", item.request_id)
            err = exc if isinstance(exc, SieError) else InferenceError(f"generation failed: {exc}")
            with anyio.CancelScope(shield=True):
                try:
                    await publish(
                        GenerationChunk(
                            request_id=item.request_id,
                            seq=0,
                            done=True,
                            error=err.message,
                            error_code=err.code,
                            worker_id=self.worker_id,
                        )
                    )
                except BusError:
                    pass
        except BusError as exc:
            log.warning("generation %s: cannot publish (%s); aborted", item.request_id, exc)
        finally:
            self.cancels.close(item.request_id, scope)

    async def _pull_loop(self, consumer: PullConsumer, tg: anyio.abc.TaskGroup) -> None:
        while True:
            await self._inflight.acquire()
            self._inflight.release()
            want = min(64, max(1, self._inflight.value))
            try:
                msgs = await consumer.fetch(want, timeout_s=1.0)
            except Exception as exc:  # nothing may stop the pull loop
                # e.g. a broker restart erased a memory stream and its consumer:
                # ensure both again (waits while the broker is away)
                log.warning(
                    "fetch failed (%s: %s); re-attaching to the work stream",
                    type(exc).__name__,
                    exc,
                )
                await anyio.sleep(0.5)
                consumer = await attach_pool(self.bus, self.settings, self.streams)
                continue
            for msg in msgs:
                try:
                    item: WorkItem | None = WorkItem.from_bytes(msg.data)
                except SieError:
                    item = None  # settled by _handle_one, with the reply salvaged
                if item is not None and item.request_id in self.cancels:
                    await self._drop_cancelled(msg, item)  # no task for work nobody awaits
                    continue
                await self._inflight.acquire()
                tg.start_soon(self._handle, msg, item)

    async def _drop_cancelled(self, msg: JsMsg, item: WorkItem) -> None:
        """Ack an item of a request its gateway abandoned, before any work (§8)."""
        try:
            await msg.ack()
        except Exception as exc:  # nothing may stop the pull loop; it is redelivered
            log.warning("cannot ack cancelled item %s: %s", item.work_item_id, exc)
            return
        self.metrics.work_items.labels(item.model_id, "cancelled").inc()

    async def _keep_held_alive(self) -> None:
        """Every third of ``SIE_ACK_WAIT_S``, mark each held message in progress (the
        broker restarts its ack timer): a live worker's items, however long they wait
        in its batcher, are never redelivered behind its back, while a dead or hung
        worker's are, one ack wait after its last keepalive (docs/topologies.md)."""
        interval = max(0.1, self.streams.ack_wait_s / 3)
        while True:
            await anyio.sleep(interval)
            for msg in list(self._held.values()):
                try:
                    await msg.in_progress()
                except Exception as exc:  # settled meanwhile, or the bus is away
                    log.debug("in_progress on %s: %s", msg.subject, exc)

    async def _handle(self, msg: JsMsg, item: WorkItem | None = None, direct: bool = False) -> None:
        """Settle one message (``direct``: from the worker's direct stream); nothing
        raised here may stop the worker."""
        self._held[id(msg)] = msg
        try:
            await self._handle_one(msg, item, direct)
        except Exception:
            log.exception(
                "unexpected failure handling a work item on %s; NAK for redelivery", msg.subject
            )
            with anyio.CancelScope(shield=True):
                try:
                    await msg.nak(5.0)
                except BusError:
                    pass
        finally:
            self._held.pop(id(msg), None)
            self._inflight.release()

    async def _handle_one(
        self, msg: JsMsg, decoded: WorkItem | None = None, direct: bool = False
    ) -> None:
        try:
            item = decoded if decoded is not None else WorkItem.from_bytes(msg.data)
        except SieError as exc:
            log.error("undecodable work item on %s: %s; terminating it", msg.subject, exc.message)
            salvaged = salvage_reply(msg.data)
            if salvaged is not None:
                try:
                    await self.bus.publish(salvaged[0], salvaged[1].to_bytes())
                except BusError:
                    pass
            await msg.term()
            return
        if item.request_id in self.cancels:
            await msg.ack()  # abandoned by its gateway: drop before any work (§8)
            self.metrics.work_items.labels(item.model_id, "cancelled").inc()
            return
        verdict = "run" if direct else await self.pools.verdict(item.admission_pool)
        if verdict == "elsewhere":  # the pool assigns other workers of this lane
            await msg.nak(ADMISSION_RETRY_S)
            self.metrics.work_items.labels(item.model_id, "not_assigned").inc()
            return
        if not self._serves(item.model_id) and msg.num_delivered < CONFIG_LAG_DELIVERIES:
            # The gateway routed a model this worker has not heard of yet: most likely a
            # config write whose delta has not reached us. Resync and retry shortly
            # rather than failing the request with a 404 (architecture §4.2).
            await self._resync_soon()
            await msg.nak(CONFIG_LAG_RETRY_S)
            return
        if item.operation == "generate":  # sent to the pool: its worker had no direct stream
            await msg.ack()
            await self._generate(item)
            return
        t0 = time.monotonic()
        scope = self.cancels.open(item.request_id)
        fetch_ms: float | None = None
        try:
            with scope:
                if verdict == "gone":  # fails closed at once (docs/pools.md)
                    raise PoolNotFound(f"pool {item.admission_pool!r} does not exist")
                if item.payload_ref is not None:  # sent by reference (docs/api.md §12)
                    item, fetch_ms = await fetch_item(self.payloads, item, self.metrics)
                result = await self._execute(item)
            outcome = "success"
            if scope.cancelled_caught:
                await msg.ack()
                self.metrics.work_items.labels(item.model_id, "cancelled").inc()
                return
        except SieError as exc:
            field = exc.fields.get("field")
            result = error_result(item, self.worker_id, exc.code, exc.message, field, exc.fields)
            outcome = exc.code
        except Exception as exc:
            log.exception("work item %s failed", item.work_item_id)
            result = error_result(
                item, self.worker_id, "INFERENCE_ERROR", f"inference error: {exc}"
            )
            outcome = "INFERENCE_ERROR"
        finally:
            self.cancels.close(item.request_id, scope)
        result.processing_ms = (time.monotonic() - t0) * 1000.0
        result.payload_fetch_ms = fetch_ms
        result.direct_origin = direct or None
        try:
            await publish_result(self.bus, item, result)
        except BusError as exc:
            log.warning(
                "cannot publish result of %s (%s); NAK for redelivery", item.work_item_id, exc
            )
            await msg.nak(1.0)
            return
        await msg.ack()
        self.metrics.work_items.labels(item.model_id, outcome).inc()

    def _serves(self, model_id: str) -> bool:
        entry = self.registry.snapshot.entries.get(model_id)
        return entry is not None and self.settings.bundle in entry.bundles

    async def _resync_soon(self) -> None:
        """One config poll at most per ``CONFIG_LAG_RETRY_S``, shared by all waiting items."""
        if self.sync.base_url is None or self._resync_lock.locked():
            return
        async with self._resync_lock:
            if time.monotonic() - self._last_resync < CONFIG_LAG_RETRY_S:
                return
            self._last_resync = time.monotonic()
            await self.sync.poll_once()

    def _entry(self, item: WorkItem) -> ModelEntry:
        entry = self.registry.snapshot.entries.get(item.model_id)
        if entry is None or self.settings.bundle not in entry.bundles:
            raise ModelNotFound(
                f"model {item.model_id!r} is not served by bundle {self.settings.bundle!r}"
            )
        return entry

    async def _execute(self, item: WorkItem) -> WorkResult:
        entry = self._entry(item)
        # never evicted while in use; a load past the wait bound is MODEL_LOADING (§2)
        async with self.models.use(entry, self.settings.model_load_wait_s) as loaded:
            out = await run_task(item, entry, loaded)
        queue_ms = max(0.0, (time.time() - item.timestamp) * 1000.0 - out.inference_ms)
        return WorkResult(
            work_item_id=item.work_item_id,
            request_id=item.request_id,
            item_index=item.item_index,
            success=True,
            result_msgpack=packb(out.result),
            inference_ms=out.inference_ms,
            queue_ms=queue_ms,
            tokenization_ms=out.tokenization_ms,
            worker_id=self.worker_id,
            input_tokens=out.tokens,
        )

    def heartbeat(self) -> Heartbeat:
        s = self.settings
        snap = self.registry.snapshot
        return Heartbeat(
            worker_id=self.worker_id,
            pool=s.pool,
            machine_profile=s.machine_profile,
            bundle=s.bundle,
            ready=self.ready,
            models=self.models.statuses(),
            # pool-scoped, the same projection the gateway expects (architecture §7)
            bundle_config_hash=snap.bundle_config_hash(s.bundle, s.pool),
            interval_s=s.heartbeat_interval_s,
        )
