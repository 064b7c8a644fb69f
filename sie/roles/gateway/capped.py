"""Worker-direct dispatch of a capped pool's encode, score and extract requests, with
pool fallback (architecture §8; docs/pools.md "Capped pools").

A pool with ``gpu_caps`` is assigned only some of the workers of a lane. Its requests
are not published on the lane's pool subject, where every worker of the lane would
take them in turn and the unassigned ones NAK them, burning delivery attempts: the
gateway publishes them to one assigned worker's direct stream
(``sie.work.{pool}.{profile}.{bundle}.{model}.{worker}``), chosen by rendezvous
hashing of the request id over the assigned live workers (``PoolManager.direct_worker``).

Fallback, so a worker that disappears never strands a request until its timeout:

- the worker has no direct stream: the request goes to the pool subject at once;
- the worker stops being live, or results are still missing ``fallback_s`` after the
  publish: the missing items are published once to the pool subject (where only
  workers the pool assigns admit them), then ``batch_cancel.{router}.{worker}.{request}``
  tells the worker to drop what it still has queued. From then on a late result from
  the direct stream for one of those items is ignored (``Collector.fallback``).
"""

from __future__ import annotations

import logging

import anyio

from sie.core.errors import SieError
from sie.core.subjects import batch_cancel_subject, normalize_model_id
from sie.roles.gateway.collect import Collector
from sie.roles.gateway.directory import WorkerDirectory
from sie.roles.gateway.lanes import Lane
from sie.roles.gateway.publish import WorkPublisher
from sie.transport.base import Bus, NoStreamError

__all__ = ["TICK_S", "CappedDispatch"]

log = logging.getLogger(__name__)

#: Seconds between two checks of the direct worker while waiting for results.
TICK_S = 0.25


class CappedDispatch:
    """Publish and collect a request on one worker's direct stream."""

    def __init__(
        self,
        bus: Bus,
        publisher: WorkPublisher,
        directory: WorkerDirectory,
        router_id: str,
        fallback_s: float,
    ) -> None:
        """``fallback_s``: seconds a request may miss results from its direct worker
        before its missing items go to the pool (``SIE_GATEWAY_DIRECT_FALLBACK_S``)."""
        self.bus = bus
        self.publisher = publisher
        self.directory = directory
        self.router_id = router_id
        self.fallback_s = fallback_s

    async def run(
        self,
        worker_id: str,
        subject: str,
        lane: Lane,
        pool: str,
        work: list[tuple[str, bytes]],
        unsent: list[int],
        col: Collector,
        request_id: str,
    ) -> None:
        """Publish ``work`` to ``worker_id`` (``subject`` is the lane's pool subject)
        and return when every item has a result (or ``col`` ended), falling back to
        the pool as the module docstring says.

        Raises:
            Backpressure, QueueUnavailable, BusError: the pool publish failed.
        """
        direct = f"{subject}.{normalize_model_id(worker_id)}"
        fell_back = False
        failures: list[SieError] = []
        publishing = anyio.CancelScope()

        async def fall_back() -> None:
            nonlocal fell_back
            fell_back = True
            try:
                await self._fall_back(worker_id, subject, work, col, request_id)
            except SieError as exc:
                failures.append(exc)
                col.done.set()

        async def publish() -> None:
            with publishing:
                try:
                    await self.publisher.publish_all(direct, lane, pool, work, unsent, col.credits)
                except NoStreamError:  # no direct stream: the worker is gone
                    if not fell_back:
                        await fall_back()
                except SieError as exc:
                    failures.append(exc)
                    col.done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(publish)
            deadline = anyio.current_time() + self.fallback_s
            while not col.done.is_set():
                with anyio.move_on_after(TICK_S):
                    await col.done.wait()
                late = anyio.current_time() >= deadline
                if not (col.done.is_set() or fell_back) and (
                    late or not self.directory.is_live(worker_id)
                ):
                    publishing.cancel()  # a windowed publisher may wait for credits
                    await fall_back()
            tg.cancel_scope.cancel()
        if failures:
            raise failures[0]

    async def _fall_back(
        self,
        worker_id: str,
        subject: str,
        work: list[tuple[str, bytes]],
        col: Collector,
        request_id: str,
    ) -> None:
        """Publish every item without a result to the pool subject (acked), then tell
        the worker to drop its queued copies."""
        missing = [i for i, r in enumerate(col.results) if r is None]
        if not missing:
            return
        log.info(
            "request %s: %d items of direct worker %s go to the pool instead",
            request_id,
            len(missing),
            worker_id,
        )
        for i in missing:
            work_item_id, data = work[i]
            await self.bus.js_publish(subject, data, msg_id=work_item_id)
        col.fallback = frozenset(missing)
        try:
            await self.bus.publish(batch_cancel_subject(self.router_id, worker_id, request_id), b"")
        except SieError as exc:  # best effort: the late results are ignored anyway
            log.debug("batch_cancel for %s: %s", request_id, exc.message)
