"""Gateway side of generation: pick a worker, admit, dispatch worker-direct, stream
the chunks back in order (architecture §2, §8.2, §15.1; admission-gate.md).

``GenerationDispatch.open`` is an async context manager: it chooses a live worker of
the model's lane (one that has the model loaded first, then the least loaded by its
engine's own running + waiting), waits for the admission gate, publishes the
``WorkItem`` (operation ``generate``, the raw body in ``item``) durably on
``sie.work.{pool}.{profile}.{bundle}.{model}.{worker_id}`` (the worker's direct
stream; the lane's pool stream when it has none), and waits for the worker's first
chunk (``seq`` 0: accepted, or the request's error, raised here as the ``SieError``
it names). A worker lost before accepting is replaced by another; one lost after
ends the stream with ``WORKER_LOST`` (``sie.roles.gateway.direct``). It yields an async iterator of the following chunks in
``seq`` order; a gap raises ``QueueUnavailable`` instead of emitting text out of
order. Leaving the block before the last chunk (client gone, timeout) publishes
``work_cancel``, which aborts the request in the engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from opentelemetry import propagate, trace

from sie.core.admission import EngineState
from sie.core.errors import (
    GatewayTimeout,
    InvalidInput,
    Provisioning,
    QueueUnavailable,
    SieError,
    WorkerLost,
    error_for_code,
)
from sie.core.registry import ModelEntry, ModelRegistry
from sie.core.subjects import cancel_subject, inbox_subject
from sie.core.wire import GenerationChunk, Heartbeat, WorkItem
from sie.roles.gateway.admission import AdmissionGate
from sie.roles.gateway.collect import load_failure_fields
from sie.roles.gateway.direct import MAX_ATTEMPTS, next_chunk, send_generation, wait_accept
from sie.roles.gateway.directory import WorkerDirectory
from sie.roles.gateway.lanes import LaneTelemetry
from sie.roles.gateway.offload import Offloader
from sie.roles.gateway.pools import PoolRoute
from sie.telemetry import tracer
from sie.transport.base import Bus

__all__ = ["GenerationDispatch", "GenerationStream", "chunk_error"]

log = logging.getLogger(__name__)

#: Seconds a worker has to accept (or refuse) a dispatched generation.
ACCEPT_TIMEOUT_S = 10.0
#: Chunks buffered per stream before the inbox reader waits for the consumer.
STREAM_BUFFER = 1024


@dataclass(slots=True)
class GenerationStream:
    """One open generation: the worker that runs it and its chunks after ``seq`` 0."""

    request_id: str
    worker_id: str
    chunks: AsyncIterator[GenerationChunk]


class GenerationDispatch:
    """Owned by the gateway role; ``deliver`` is fed by its inbox reader."""

    def __init__(
        self,
        *,
        bus: Bus,
        registry: ModelRegistry,
        directory: WorkerDirectory,
        lanes: LaneTelemetry,
        admission: AdmissionGate,
        router_id: str,
        lane_of: Callable[[ModelEntry, str, str | None, str | None], tuple[PoolRoute, str]],
        capped_ring: Callable[[PoolRoute, str, str], list[str] | None] = lambda *_: None,
        offloader: Offloader,
    ) -> None:
        """``offloader``: sends a generation item over the bus's ``max_payload`` by
        reference (docs/api.md §12)."""
        self.bus = bus
        self.offloader = offloader
        self.registry = registry
        self.directory = directory
        self.lanes = lanes
        self.admission = admission
        self.router_id = router_id
        self.lane_of = lane_of  # the gateway's pool and profile resolution
        self.capped_ring = capped_ring  # a capped pool's workers of a lane
        self._streams: dict[str, MemoryObjectSendStream[GenerationChunk]] = {}
        #: generations this gateway has open per worker: added to the worker's reported
        #: load, so requests between two heartbeats spread instead of piling onto one
        self.open_by_worker: dict[str, int] = {}

    # -- inbox side ---------------------------------------------------------------------

    def owns(self, request_id: str) -> bool:
        return request_id in self._streams

    def deliver(self, request_id: str, data: bytes) -> None:
        """Route one inbox message of an open generation (drop it if undecodable)."""
        send = self._streams.get(request_id)
        if send is None:
            return
        try:
            chunk = GenerationChunk.from_bytes(data)
        except SieError as exc:
            log.warning("dropping undecodable generation chunk for %s: %s", request_id, exc)
            return
        try:
            send.send_nowait(chunk)
        except anyio.WouldBlock:  # the client reads too slowly: fail rather than grow
            log.warning("generation %s: client too slow, stream buffer full", request_id)
            send.close()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    # -- engine state (heartbeats) ------------------------------------------------------

    def observe_heartbeat(self, hb: Heartbeat) -> None:
        """Feed the admission gate the engine state of every generation model, summed
        over the live workers that report it."""
        for m in hb.models:
            if m.engine_state is not None:
                state = self.model_state(m.name)
                if state is not None:
                    self.admission.update(m.name, state)

    def model_state(self, model: str) -> EngineState | None:
        """The model's engine state over all live workers (sums; KV usage: the max)."""
        states = self._reports(model)
        if not states:
            return None
        return EngineState(
            running=sum(s.running for s in states),
            waiting=sum(s.waiting for s in states),
            kv_usage=max(s.kv_usage or 0.0 for s in states),
            kv_capacity_tokens=sum(s.kv_capacity_tokens or 0 for s in states) or None,
            max_num_seqs=sum(s.max_num_seqs or 0 for s in states) or None,
        )

    def _reports(self, model: str) -> list[EngineState]:
        return [
            m.engine_state
            for hb in self.directory.live()
            for m in hb.models
            if m.name == model and m.engine_state is not None
        ]

    # -- dispatch -----------------------------------------------------------------------

    def choose_worker(
        self,
        model: str,
        pool: str,
        profile: str,
        bundle: str,
        exclude: set[str] | None = None,
        only: list[str] | None = None,
    ) -> str:
        """A live, ready worker of the lane (not in ``exclude``; one of ``only`` when
        given: a capped pool's assigned workers, docs/pools.md): one with ``model``
        loaded first, then the least loaded (its engine's running + waiting, plus what
        this gateway has sent it since).

        Raises:
            Provisioning: no live worker serves the lane (503, Retry-After 60).
        """
        candidates: list[tuple[int, int, str]] = []
        for hb in self.directory.live():
            if (exclude and hb.worker_id in exclude) or (
                only is not None and hb.worker_id not in only
            ):
                continue
            if not hb.ready or (hb.pool.lower(), hb.machine_profile.lower(), hb.bundle) != (
                pool,
                profile,
                bundle,
            ):
                continue
            loaded, load = 1, 0
            for m in hb.models:
                if m.name == model:
                    loaded = 0 if m.state == "loaded" else 1
                    st = m.engine_state
                    load = st.running + st.waiting if st is not None else 0
            load += self.open_by_worker.get(hb.worker_id, 0)
            candidates.append((loaded, load, hb.worker_id))
        if not candidates:
            raise Provisioning(
                f"no worker serves pool {pool!r}, machine profile {profile!r}, bundle "
                f"{bundle!r} for generation; retry later",
                pool=pool,
                machine_profile=profile,
                bundle=bundle,
            )
        return min(candidates)[2]

    @asynccontextmanager
    async def open(
        self,
        model_id: str,
        route: str,
        body: bytes,
        *,
        pool: str | None = None,
        machine_profile: str | None = None,
        request_id: str,
        on_keepalive: Callable[[], Awaitable[None]] | None = None,
        on_park: Callable[[], None] | None = None,
        trace_headers: dict[str, str] | None = None,
    ) -> AsyncIterator[GenerationStream]:
        """See the module docstring.

        Raises:
            ModelNotFound (404), Provisioning (503), AdmissionRejected (503,
            Retry-After 5), the worker's refusal (e.g. 400 naming the field),
            GatewayTimeout (504) when no worker accepts in time.
        """
        # §15.1: the caller's traceparent (if any) parents gateway.proxy_chat /
        # gateway.proxy_generate, whose context travels on the work item to the worker
        if route == "native":
            span_name = "gateway.proxy_generate"
            attributes = {"sie.endpoint": "/v1/generate"}
        else:
            span_name = "gateway.proxy_chat"
            path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
            attributes = {"http.route": path, "sie.routing_key_kind": "model"}
        attributes |= {"sie.model": model_id, "sie.request_id": request_id}
        current = trace.get_current_span().get_span_context().is_valid  # the request span
        with tracer.start_as_current_span(
            span_name,
            context=None if current else propagate.extract(trace_headers or {}),
            attributes=attributes,
        ):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            async with self._open(
                model_id,
                route,
                body,
                pool=pool,
                machine_profile=machine_profile,
                request_id=request_id,
                on_keepalive=on_keepalive,
                on_park=on_park,
                carrier=carrier,
            ) as stream:
                yield stream

    @asynccontextmanager
    async def _open(
        self,
        model_id: str,
        route: str,
        body: bytes,
        *,
        pool: str | None,
        machine_profile: str | None,
        request_id: str,
        on_keepalive: Callable[[], Awaitable[None]] | None,
        on_park: Callable[[], None] | None,
        carrier: dict[str, str],
    ) -> AsyncIterator[GenerationStream]:
        gw = self
        entry, bundle = gw.registry.resolve(model_id)
        if entry.config.tasks.generate is None:  # decided from the config: nothing queued
            offers = ", ".join(entry.config.outputs) or "nothing"
            raise InvalidInput(
                f"model {entry.model_id!r} does not generate text (no tasks.generate); "
                f"it offers {offers}",
                field="model",
            )
        target, profile = self.lane_of(entry, bundle, pool, machine_profile)
        pool_ = target.queue_pool
        lane = gw.lanes.lane(pool_, profile, bundle)
        worker_id: str | None = None
        only = self.capped_ring(target, profile, bundle)
        try:
            worker_id = self.choose_worker(entry.model_id, pool_, profile, bundle, only=only)
        except Provisioning:
            gw.lanes.record_demand(lane, "provisioning")
            raise
        await gw.admission.admit(entry.model_id, on_keepalive=on_keepalive, on_park=on_park)
        send, receive = anyio.create_memory_object_stream[GenerationChunk](STREAM_BUFFER)
        self._streams[request_id] = send
        item = WorkItem(
            work_item_id=f"{request_id}.0",
            request_id=request_id,
            item_index=0,
            total_items=1,
            operation="generate",
            model_id=entry.model_id,
            profile_id=entry.profile.name,
            pool_name=pool_,
            admission_pool=target.logical,
            machine_profile=profile,
            router_id=gw.router_id,
            reply_subject=inbox_subject(gw.router_id, request_id),
            timestamp=time.time(),
            item={"route": route, "body": body},
            traceparent=carrier.get("traceparent"),
            tracestate=carrier.get("tracestate"),
        )
        finished = False
        gw.lanes.add_in_flight(lane, 1)
        stored: list[str] = []
        attempts: list[str] = []  # the workers offered this generation, in order
        try:
            work = [(item.work_item_id, item.to_bytes())]
            await self.offloader.offload(work, stored, request_id)
            first: GenerationChunk | None = None
            failed: SieError | None = None  # why the last offer was not taken
            while first is None:  # offered to one live worker after another (direct.py)
                if worker_id is None:
                    try:
                        worker_id = self.choose_worker(
                            entry.model_id, pool_, profile, bundle, set(attempts), only
                        )
                    except Provisioning:
                        if failed is None:
                            raise
                        raise failed from None  # no other worker to offer it to
                attempts.append(worker_id)
                self._hold(worker_id, 1)
                via = await send_generation(
                    gw.bus,
                    work[0][1],
                    msg_id=f"{item.work_item_id}.a{len(attempts)}",
                    lane=(pool_, profile, bundle),
                    model_id=entry.model_id,
                    worker_id=worker_id,
                )
                gw.lanes.clear_demand(lane)
                try:
                    first = await wait_accept(
                        receive,
                        via,
                        self.directory.is_live,
                        anyio.current_time() + ACCEPT_TIMEOUT_S,
                    )
                except TimeoutError:  # live but not taking it: offer it to another
                    failed = GatewayTimeout(
                        f"worker {worker_id!r} did not accept the generation within "
                        f"{ACCEPT_TIMEOUT_S:g}s",
                        request_id=request_id,
                    )
                else:
                    failed = WorkerLost(
                        f"worker {worker_id!r} was lost before accepting the generation; "
                        "retry later",
                        request_id=request_id,
                    )
                if first is None:
                    log.warning("generation %s: %s", request_id, failed.message)
                    self._hold(worker_id, -1)
                    worker_id = None
                    if len(attempts) >= MAX_ATTEMPTS:
                        raise failed
            if first.error_code is not None:
                finished = True
                raise chunk_error(first)
            assert worker_id is not None  # set by the attempt that was accepted
            if first.worker_id and first.worker_id != worker_id:  # taken from the pool
                self._hold(worker_id, -1)
                worker_id = first.worker_id
                self._hold(worker_id, 1)
            accepted = worker_id

            async def rest() -> AsyncIterator[GenerationChunk]:
                nonlocal finished
                expected = 1
                while True:
                    try:
                        chunk = await next_chunk(
                            receive, accepted, self.directory.is_live, expected - 1
                        )
                    except anyio.EndOfStream:
                        break
                    if chunk.seq != expected:
                        raise QueueUnavailable(
                            f"generation stream lost chunks: expected {expected}, got {chunk.seq}"
                        )
                    expected += 1
                    if chunk.done:
                        finished = True
                    yield chunk
                    if chunk.done:
                        return
                raise QueueUnavailable("generation stream ended without its last chunk")

            yield GenerationStream(request_id, accepted, rest())
        finally:
            self._streams.pop(request_id, None)
            send.close()
            gw.lanes.add_in_flight(lane, -1)
            if worker_id is not None:
                self._hold(worker_id, -1)
            with anyio.CancelScope(shield=True):
                # a generation offered to several workers may still run on one that was
                # only slow: the cancel stops it (the request is over)
                if not finished or len(attempts) > 1:
                    try:
                        await gw.bus.publish(cancel_subject(gw.router_id, request_id), b"")
                    except SieError as exc:
                        log.warning("cannot cancel generation %s: %s", request_id, exc)
                await self.offloader.release(stored)

    def _hold(self, worker_id: str, n: int) -> None:
        """Count ``n`` more (or fewer) open generations on ``worker_id``."""
        left = self.open_by_worker.get(worker_id, 0) + n
        if left > 0:
            self.open_by_worker[worker_id] = left
        else:
            self.open_by_worker.pop(worker_id, None)


def chunk_error(chunk: GenerationChunk) -> SieError:
    """The ``SieError`` a worker's error chunk names."""
    fields: dict[str, Any] = {"field": chunk.error_field} if chunk.error_field else {}
    if chunk.error_code == "MODEL_LOAD_FAILED":  # the §2 body, conservative where unknown
        fields |= load_failure_fields(None)
    return error_for_code(chunk.error_code, chunk.error or "generation failed", **fields)
