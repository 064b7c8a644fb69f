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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from sie.control.ack_status import WorkerAck, worker_ack_status
from sie.core.config import POOL_RE
from sie.core.errors import (
    Backpressure,
    GatewayTimeout,
    InferenceError,
    InvalidInput,
    Provisioning,
    ShuttingDown,
    SieError,
    WireError,
    error_for_code,
)
from sie.core.ids import uuid7
from sie.core.registry import ModelEntry, ModelRegistry
from sie.core.subjects import (
    HEALTH_WILDCARD,
    cancel_subject,
    config_subject,
    inbox_subject,
    inbox_wildcard,
    stream_name,
    work_subject,
)
from sie.core.wire import Heartbeat, WorkItem, WorkResult, packb
from sie.roles.config_sync import build_config_sync, run_config_sync
from sie.roles.gateway.admission import AdmissionGate, admission_config
from sie.roles.gateway.dlq import DeadLetters
from sie.roles.gateway.generation import GenerationDispatch
from sie.roles.gateway.lanes import Lane, LaneTelemetry
from sie.settings import ServeSettings
from sie.telemetry import METRICS, Metrics
from sie.transport.base import Bus, NoStreamError, StreamFullError, work_stream_config

__all__ = ["Collected", "GatewayRole"]

log = logging.getLogger(__name__)

#: Most JetStream publishes of one request awaiting their acks at once (§8.2).
PUBLISH_CONCURRENCY = 64
#: Work items a request builds or publishes between two yields to the event loop, so
#: a 4096-item request never holds it for long (docs/security.md "Liveness").
YIELD_EVERY = 128

#: Worker codes that mean "retry later" when every item carries the same one (§2).
RETRYABLE_CODES = frozenset({"RESOURCE_EXHAUSTED", "MODEL_LOADING", "LORA_LOADING"})


@dataclass(slots=True)
class _Collector:
    total: int
    results: list[WorkResult | None]
    remaining: int
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass(slots=True)
class Collected:
    """All results of one request, in input order, plus routing facts for headers.

    Times are milliseconds.
    """

    request_id: str
    entry: ModelEntry
    results: list[WorkResult]
    publish_ms: float
    total_ms: float

    def timing(self) -> dict[str, float]:
        def mx(attr: str) -> float:
            return max((getattr(r, attr) or 0.0) for r in self.results) if self.results else 0.0

        return {
            "publish_ms": self.publish_ms,
            "queue_ms": mx("queue_ms"),
            "inference_ms": mx("inference_ms"),
            "tokenization_ms": mx("tokenization_ms"),
            "total_ms": self.total_ms,
        }

    @property
    def workers(self) -> list[str]:
        return sorted({r.worker_id for r in self.results if r.worker_id})


@dataclass(slots=True)
class WorkerView:
    heartbeat: Heartbeat
    seen_at: float


class GatewayRole:
    """Routing, dispatch and result collection. Start ``run`` in a task group."""

    def __init__(
        self,
        bus: Bus,
        registry: ModelRegistry,
        settings: ServeSettings,
        *,
        config_service_url: str | None = None,
        metrics: Metrics = METRICS,
    ) -> None:
        self.bus = bus
        self.registry = registry
        self.settings = settings
        self.router_id = settings.router_id
        self._pending: dict[str, _Collector] = {}
        self._given_up = False
        self.late_results = 0
        # per-lane in-flight items, admission decisions and pending demand (§2)
        self.lanes = LaneTelemetry(metrics)
        self._stream_pending_cache: dict[str, tuple[int, float]] = {}
        # per pool: items admitted and not yet published, and items published since the
        # last broker reading began; the pending check adds both to that reading, so
        # concurrent requests cannot overshoot the limit
        self._unpublished: dict[str, int] = {}
        self._unread_published: dict[str, int] = {}
        self._streams: set[str] = set()
        self.workers: dict[str, WorkerView] = {}
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self.sync = build_config_sync(
            registry,
            settings,
            config_service_url=config_service_url,
            metrics=metrics,
            role="gateway",
        )
        self.epoch = self.sync.epoch
        # generation: engine-state admission (admission-gate.md) and worker-direct dispatch
        self.admission = AdmissionGate(admission_config(settings), metrics)
        self.generation = GenerationDispatch(self)
        self.dead_letters = DeadLetters(
            bus, storage=settings.stream_storage, replicas=settings.stream_replicas
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
        live = {hb.worker_id for hb in self.live_workers()}
        acks = [
            WorkerAck(
                worker_id=w.heartbeat.worker_id,
                bundle=w.heartbeat.bundle,
                pool=w.heartbeat.pool,
                bundle_config_hash=w.heartbeat.bundle_config_hash,
                healthy=w.heartbeat.worker_id in live and w.heartbeat.ready,
            )
            for w in self.workers.values()
        ]
        return worker_ack_status(self.registry.snapshot, model_id, acks, self.epoch.get())

    def connected_workers(self) -> dict[str, int]:
        """Live workers per bundle."""
        out: dict[str, int] = {}
        for hb in self.live_workers():
            out[hb.bundle] = out.get(hb.bundle, 0) + 1
        return out

    async def _read_inbox(self, sub: Any) -> None:
        async for msg in sub:
            # The inbox subject names the request (_INBOX.{router_id}.{request_id}): late
            # results of finished or abandoned requests are dropped before decoding.
            rid = msg.subject.rsplit(".", 1)[-1]
            if self.generation.owns(rid):
                self.generation.deliver(rid, msg.data)
                continue
            if rid not in self._pending:
                self.late_results += 1
                continue
            try:
                result = WorkResult.from_bytes(msg.data)
            except SieError as exc:
                log.warning("dropping undecodable result on %s: %s", msg.subject, exc.message)
                continue
            col = self._pending.get(result.request_id)
            if col is None or not 0 <= result.item_index < col.total:
                continue  # finished, abandoned or stale: drop (architecture §16.2 step 4)
            if result.worker_id is not None:  # a result is proof of life (docs/security.md)
                view = self.workers.get(result.worker_id)
                if view is not None:
                    view.seen_at = time.monotonic()
            if col.results[result.item_index] is None:
                col.results[result.item_index] = result
                col.remaining -= 1
                if col.remaining == 0:
                    col.done.set()

    async def _read_health(self, sub: Any) -> None:
        async for msg in sub:
            try:
                hb = Heartbeat.from_bytes(msg.data)
            except SieError:
                continue
            self.workers[hb.worker_id] = WorkerView(hb, time.monotonic())
            self.generation.observe_heartbeat(hb)

    def live_workers(self) -> list[Heartbeat]:
        """Workers heard from within three heartbeat intervals."""
        now = time.monotonic()
        return [
            w.heartbeat
            for w in self.workers.values()
            if now - w.seen_at <= 3 * max(w.heartbeat.interval_s, 0.1)
        ]

    def lane_served(self, pool: str, machine_profile: str, bundle: str) -> bool:
        """Whether a live worker consumes this lane (architecture §2 provisioning rule).

        Until the gateway has been up for three heartbeat intervals it cannot know,
        and answers True so that early requests queue rather than fail.
        """
        lane = (pool, machine_profile, bundle)
        if any(
            (hb.pool.lower(), hb.machine_profile.lower(), hb.bundle) == lane
            for hb in self.live_workers()
        ):
            return True
        return time.monotonic() - self._started_mono < 3 * self.settings.heartbeat_interval_s

    def model_state(self, model_id: str) -> tuple[str, dict[str, Any] | None]:
        """Aggregate state over live workers (reference §1.9 precedence):
        loading > unloading > loaded > failed > available."""
        states: list[str] = []
        last_error = None
        for m in self._model_reports(model_id):
            states.append(m.get("state", "available"))
            last_error = m.get("last_error") or last_error
        for s in ("loading", "unloading", "loaded", "failed"):
            if s in states:
                return s, last_error
        return "available", last_error

    def model_counts(self, model_id: str) -> dict[str, int]:
        """Loads and evictions of ``model_id`` summed over live workers (reference §4.5)."""
        reports = self._model_reports(model_id)
        return {
            "loads": sum(int(m.get("loads", 0)) for m in reports),
            "evictions": sum(int(m.get("evictions", 0)) for m in reports),
        }

    def _model_reports(self, model_id: str) -> list[dict[str, Any]]:
        return [m for hb in self.live_workers() for m in hb.models if m.get("name") == model_id]

    async def _admit(self, lane: Lane, pool: str, n_items: int, *, record: bool = True) -> None:
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
        s = self.settings
        in_flight = self.lanes.in_flight.get(lane, 0) + n_items
        over = in_flight > s.max_lane_in_flight_items
        shed = over and s.lane_backpressure_enforce
        if record:
            self.lanes.decision(lane, "shed" if shed else "would_shed" if over else "admit")
        pending = (
            await self._stream_pending(pool)
            + self._unread_published.get(pool, 0)
            + self._unpublished.get(pool, 0)
        )
        if pending + max(n_items, 1) > s.max_stream_pending:
            self.lanes.record_demand(lane, "queue_full")
            raise Backpressure(
                f"work queue for pool {pool!r} holds {pending} items (limit "
                f"{s.max_stream_pending}, this request {n_items}); retry later",
                pool=pool,
            )
        if shed:
            self.lanes.record_demand(lane, "lane_full")
            raise Backpressure(
                f"lane {pool}/{lane[1]}/{lane[2]} has {in_flight} items in flight on this "
                f"gateway (limit {s.max_lane_in_flight_items}); retry later",
                pool=pool,
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
            pool_, profile = self.lane_of(entry, pool, machine_profile)
        except SieError:
            return
        await self._admit(self.lanes.lane(pool_, profile, bundle), pool_, 0, record=False)

    async def _stream_pending(self, pool: str) -> int:
        now = time.monotonic()
        cached = self._stream_pending_cache.get(pool)
        if cached is not None and now - cached[1] < 0.25:
            return cached[0]
        published = self._unread_published.get(pool, 0)
        try:
            count = (await self.bus.stream_info(stream_name(pool))).messages
        except NoStreamError:
            count = 0
        except SieError as exc:  # the bus is away: the publish will say so (503)
            log.debug("stream pending check failed: %s", exc.message)
            return 0
        # what was published before the reading began is in its count
        self._unread_published[pool] = self._unread_published.get(pool, 0) - published
        self._stream_pending_cache[pool] = (count, now)
        return count

    async def _ensure_stream(self, pool: str) -> None:
        if pool not in self._streams:
            s = self.settings
            await self.bus.add_stream(
                work_stream_config(
                    pool,
                    max_msgs=s.stream_max_msgs,
                    max_age_s=s.stream_max_age_s,
                    storage=s.stream_storage,
                    replicas=s.stream_replicas,
                )
            )
            self._streams.add(pool)

    def _prepare(
        self,
        model_id: str,
        items: Sequence[Mapping[str, Any]],
        task: str | None,
        texts: list[tuple[str, Any]],
    ) -> tuple[ModelEntry, str]:
        """Resolve ``model_id`` and check the request before anything is published:
        the item count, the model's ``task`` (``score`` / ``extract``), and every text
        (``texts`` plus each item's) against ``max_text_chars``.

        Raises:
            ModelNotFound: unknown model (404).
            InvalidInput: too many items, a missing task, or a text too long (400).
        """
        limit = self.settings.max_items_per_request
        if len(items) > limit:
            raise InvalidInput(
                f"items: at most {limit} items per request, got {len(items)}", field="items"
            )
        entry, bundle = self.registry.resolve(model_id)
        if task is not None and getattr(entry.config.tasks, task) is None:
            verb = {"score": "scoring", "extract": "extraction"}.get(task, task)
            raise InvalidInput(
                f"model {entry.model_id!r} does not support {verb} (no tasks.{task})",
                field="model",
            )
        chars = self.settings.max_text_chars
        all_texts = texts + [(f"items[{i}].text", it.get("text")) for i, it in enumerate(items)]
        for name, text in all_texts:
            if isinstance(text, str) and len(text) > chars:
                window = entry.config.max_sequence_length
                why = (
                    f" (the model reads at most {window} tokens)"
                    if window and task != "extract"  # extract reads long texts in windows
                    else ""
                )
                raise InvalidInput(
                    f"{name}: {len(text)} characters exceeds the limit of {chars}{why}",
                    field=name,
                )
        return entry, bundle

    async def encode(
        self,
        model_id: str,
        items: Sequence[Mapping[str, Any]],
        *,
        output_types: list[str] | None = None,
        instruction: str | None = None,
        is_query: bool | None = None,
        options: Mapping[str, Any] | None = None,
        pool: str | None = None,
        machine_profile: str | None = None,
        timeout_s: float | None = None,
        request_id: str | None = None,
    ) -> Collected:
        """Fan ``items`` out as encode work items (one each) and wait for every result.

        Returns:
            ``Collected`` with one successful ``WorkResult`` per item, in input order.

        Raises:
            ModelNotFound: unknown model (404).
            InvalidInput: too many items, or a text over ``max_text_chars`` (400).
            Provisioning: no live worker serves the lane (503, Retry-After 60).
            Backpressure: the pool's stream is full (503, Retry-After 5).
            GatewayTimeout: not every result arrived within ``timeout_s`` (504).
            SieError: the workers' error, when every item failed with one code
                (e.g. 503 MODEL_LOADING, 502 MODEL_LOAD_FAILED); otherwise
                InferenceError listing each failed item.
        """
        entry, bundle = self._prepare(model_id, items, None, [("params.instruction", instruction)])
        common = {
            "output_types": output_types,
            "instruction": instruction,
            "is_query": is_query,
            "options": dict(options) if options else None,
        }
        return await self._run(
            entry,
            bundle,
            "encode",
            [{"item": dict(it), **common} for it in items],
            pool=pool,
            machine_profile=machine_profile,
            timeout_s=timeout_s,
            request_id=request_id,
        )

    async def score(
        self,
        model_id: str,
        query: Mapping[str, Any],
        items: Sequence[Mapping[str, Any]],
        *,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        pool: str | None = None,
        machine_profile: str | None = None,
        timeout_s: float | None = None,
        request_id: str | None = None,
    ) -> Collected:
        """Score ``items`` against ``query``: ONE work item carrying the query and every
        candidate (reference §2.10). Its result is ``{"scores": [float]}`` in item order.

        Raises:
            as ``encode``; InvalidInput also when the model has no ``tasks.score``.
        """
        entry, bundle = self._prepare(
            model_id,
            items,
            "score",
            [("instruction", instruction), ("query.text", query.get("text"))],
        )
        work = {
            "query_item": dict(query),
            "score_items": [dict(it) for it in items],
            "instruction": instruction,
            "options": dict(options) if options else None,
        }
        return await self._run(
            entry,
            bundle,
            "score",
            [work],
            pool=pool,
            machine_profile=machine_profile,
            timeout_s=timeout_s,
            request_id=request_id,
        )

    async def extract(
        self,
        model_id: str,
        items: Sequence[Mapping[str, Any]],
        *,
        labels: list[str] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        pool: str | None = None,
        machine_profile: str | None = None,
        timeout_s: float | None = None,
        request_id: str | None = None,
    ) -> Collected:
        """Fan ``items`` out as extract work items (one each); each result is
        ``{"entities": [...], "relations", "classifications", "objects", "data"}``.

        Raises:
            as ``encode``; InvalidInput also when the model has no ``tasks.extract``.
        """
        entry, bundle = self._prepare(
            model_id, items, "extract", [("params.instruction", instruction)]
        )
        common = {
            "labels": labels,
            "output_schema": dict(output_schema) if output_schema else None,
            "instruction": instruction,
            "options": dict(options) if options else None,
        }
        return await self._run(
            entry,
            bundle,
            "extract",
            [{"item": dict(it), **common} for it in items],
            pool=pool,
            machine_profile=machine_profile,
            timeout_s=timeout_s,
            request_id=request_id,
        )

    def lane_of(
        self, entry: ModelEntry, pool: str | None, machine_profile: str | None
    ) -> tuple[str, str]:
        """``(pool, machine_profile)`` of a request: the ``X-SIE-Pool`` /
        ``X-SIE-Machine-Profile`` headers, else the model's pool and this gateway's
        default profile; lowercase (architecture §8.2).

        Raises:
            InvalidInput: a header value that is not a valid pool/profile name.
        """
        for header, value in (("X-SIE-Pool", pool), ("X-SIE-Machine-Profile", machine_profile)):
            if value is not None and not POOL_RE.fullmatch(value):
                raise InvalidInput(
                    f"{header}: {value!r} must match {POOL_RE.pattern}", field=header
                )
        return (
            (pool or entry.config.effective_pool).lower(),
            (machine_profile or self.settings.machine_profile).lower(),
        )

    async def _run(
        self,
        entry: ModelEntry,
        bundle: str,
        operation: str,
        works: list[dict[str, Any]],
        *,
        pool: str | None,
        machine_profile: str | None,
        timeout_s: float | None,
        request_id: str | None,
    ) -> Collected:
        """Route to the lane, admit, publish one work item per ``works`` entry (its
        fields go into the ``WorkItem``; entries differ only in ``item``) and collect
        every result (§2, §16.2)."""
        t0 = time.monotonic()
        model_id = entry.model_id  # canonical: "m:default" is "m"
        pool, profile = self.lane_of(entry, pool, machine_profile)
        lane = self.lanes.lane(pool, profile, bundle)
        if not self.lane_served(pool, profile, bundle):
            self.lanes.record_demand(lane, "provisioning")  # for the autoscaler (§2)
            raise Provisioning(
                f"no worker serves pool {pool!r}, machine profile {profile!r}, bundle {bundle!r}; retry later",
                pool=pool,
                machine_profile=profile,
                bundle=bundle,
            )
        n = len(works)
        await self._admit(lane, pool, n)
        self._unpublished[pool] = self._unpublished.get(pool, 0) + n
        unsent = [n]  # this request's share of _unpublished, returned in finally
        subject = work_subject(pool, profile, bundle, model_id)
        request_id = request_id or uuid7()
        reply = inbox_subject(self.router_id, request_id)
        col = _Collector(n, [None] * n, n)
        self.lanes.add_in_flight(lane, n)
        self._pending[request_id] = col
        published = False
        try:
            await self._ensure_stream(pool)
            first = WorkItem(
                work_item_id=f"{request_id}.0",
                request_id=request_id,
                item_index=0,
                total_items=n,
                operation=operation,
                model_id=model_id,
                profile_id=entry.profile.name,
                pool_name=pool,
                admission_pool=pool,
                machine_profile=profile,
                router_id=self.router_id,
                reply_subject=reply,
                timestamp=time.time(),
                **works[0],
            )
            work = [(first.work_item_id, self._encode_item(first))]
            base = first.to_map()
            for i in range(1, n):
                # the items of a request differ only in id, index and item: copy the
                # first one's map (a WorkItem per item costs several times more)
                m = dict(base)
                m["work_item_id"] = wid = f"{request_id}.{i}"
                m["item_index"] = i
                if (item := works[i].get("item")) is not None:
                    m["item"] = item
                work.append((wid, self._encode_map(m, i)))
                if i % YIELD_EVERY == YIELD_EVERY - 1:
                    await anyio.lowlevel.checkpoint()  # probes and heartbeats go first
            published = True
            await self._publish_all(subject, lane, pool, work, unsent)
            self.lanes.clear_demand(lane)  # the lane is being served (§8)
            publish_ms = (time.monotonic() - t0) * 1000.0
            wait_s = timeout_s or self.settings.request_timeout_s
            try:
                with anyio.fail_after(wait_s):
                    if not self._given_up:
                        await col.done.wait()
            except TimeoutError:
                got = sum(r is not None for r in col.results)
                raise GatewayTimeout(
                    f"no worker result within {wait_s:g}s ({got}/{n} items arrived)",
                    request_id=request_id,
                ) from None
            if col.remaining:
                raise ShuttingDown(
                    f"the gateway is shutting down ({n - col.remaining}/{n} items arrived); "
                    "retry on another replica",
                    request_id=request_id,
                )
        finally:
            self._unpublished[pool] -= unsent[0]
            self._pending.pop(request_id, None)
            self.lanes.add_in_flight(lane, -n)
            if published and col.remaining:
                await self._abandon(request_id)
        results = [r for r in col.results if r is not None]
        self._raise_failures(results)
        return Collected(request_id, entry, results, publish_ms, (time.monotonic() - t0) * 1000.0)

    def give_up_waiting(self) -> None:
        """End of the shutdown drain: every request still waiting for worker results
        answers 503 ``SHUTTING_DOWN`` (Retry-After 5) now, while the listener can still
        send it, and later ones at once. Workers get ``work_cancel`` for their items."""
        self._given_up = True
        for col in self._pending.values():
            col.done.set()

    async def _abandon(self, request_id: str) -> None:
        """Best-effort ``work_cancel`` so workers drop this request's remaining items (§8)."""
        with anyio.CancelScope(shield=True):
            try:
                await self.bus.publish(cancel_subject(self.router_id, request_id), b"")
            except SieError as exc:
                log.warning("cannot publish work_cancel for %s: %s", request_id, exc.message)

    @staticmethod
    def _encode_map(m: dict[str, Any], index: int) -> bytes:
        """A further work item's map (``_run``) as msgpack.

        Raises:
            InvalidInput: the item holds a value msgpack cannot carry (``items[i]``).
        """
        try:
            return packb(m)
        except WireError as exc:
            where = f"items[{index}]"
            raise InvalidInput(f"{where}: cannot be forwarded: {exc.message}", field=where) from exc

    @staticmethod
    def _encode_item(wi: WorkItem) -> bytes:
        """The work item as msgpack.

        Raises:
            InvalidInput: a request value msgpack cannot carry (e.g. a 65-bit integer or
                a lone surrogate), naming the request field it came from.
        """
        try:
            return wi.to_bytes()
        except WireError as exc:
            field = "options"
            for name in ("options", "output_schema", "labels", "instruction"):
                try:
                    packb(getattr(wi, name))
                except WireError:
                    field = name
                    break
            # score requests have no params wrapper (reference §1.6)
            where = field if wi.operation == "score" else f"params.{field}"
            raise InvalidInput(f"{where}: cannot be forwarded: {exc.message}", field=where) from exc

    async def _publish_all(
        self,
        subject: str,
        lane: Lane,
        pool: str,
        work: list[tuple[str, bytes]],
        unsent: list[int],
    ) -> None:
        """Publish a request's work items with overlapping JetStream acks (at most
        ``PUBLISH_CONCURRENCY`` in flight, architecture §8.2); the first failure
        cancels the rest and is raised."""
        if len(work) == 1:
            await self._publish(subject, lane, pool, *work[0], unsent)
            return
        items = iter(work)
        failures: list[SieError] = []

        async def publisher() -> None:
            # a few long-lived publishers instead of a task per item: thousands of
            # tasks per request would crowd the event loop's ready queue
            for sent, (work_item_id, data) in enumerate(items, 1):
                try:
                    await self._publish(subject, lane, pool, work_item_id, data, unsent)
                except SieError as exc:
                    failures.append(exc)
                    tg.cancel_scope.cancel()
                    return
                if sent % YIELD_EVERY == 0:
                    await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for _ in range(min(PUBLISH_CONCURRENCY, len(work))):
                tg.start_soon(publisher)
        if failures:
            raise failures[0]

    async def _publish(
        self,
        subject: str,
        lane: Lane,
        pool: str,
        work_item_id: str,
        data: bytes,
        unsent: list[int],
    ) -> None:
        """One JetStream publish; ``work_item_id`` is the ``Nats-Msg-Id`` (dedupe). On
        success the item moves from the request's ``unsent`` to the pool's published
        count."""
        try:
            await self.bus.js_publish(subject, data, msg_id=work_item_id)
        except StreamFullError as exc:
            self.lanes.record_demand(lane, "queue_full")
            raise Backpressure(f"work queue for pool {pool!r} is full; retry later") from exc
        except NoStreamError:
            self._streams.discard(pool)  # stream deleted under us (e.g. broker restart)
            await self._ensure_stream(pool)
            await self.bus.js_publish(subject, data, msg_id=work_item_id)
        unsent[0] -= 1
        self._unpublished[pool] -= 1
        self._unread_published[pool] = self._unread_published.get(pool, 0) + 1

    @staticmethod
    def _raise_failures(results: list[WorkResult]) -> None:
        failed = [r for r in results if not r.success]
        if not failed:
            return
        codes = {r.error_code for r in failed}
        if len(failed) == len(results) and len(codes) == 1:
            field = failed[0].error_field
            raise error_for_code(
                failed[0].error_code,
                failed[0].error or "worker error",
                **({"field": field} if field else {}),
            )
        raise InferenceError(
            f"{len(failed)} of {len(results)} items failed",
            details=[
                {"item_index": r.item_index, "code": r.error_code, "error": r.error} for r in failed
            ],
        )
