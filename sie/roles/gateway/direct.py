"""Durable worker-direct dispatch of a generation and its failover (architecture §8,
§8.2; docs/topologies.md "What survives a fault").

Each worker owns a JetStream stream ``WORK_DIRECT_{worker}`` capturing
``sie.work.{pool}.{profile}.{bundle}.*.{worker}``, so a generation published while
its worker restarts waits there instead of being lost. When the chosen worker has no
such stream (gone, or the broker lost it), the item goes to the lane's pool stream,
where any worker of the lane takes it.

While the gateway waits for a worker to accept (the first chunk, ``seq`` 0) it watches
that worker's heartbeats: a worker that stops being live before accepting, or does not
accept within the accept timeout, is replaced by another one (``MAX_ATTEMPTS`` in all). After acceptance, a worker that stops being
live ends the stream with 503 ``WORKER_LOST``, never a stream that just stops.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from sie.core.errors import QueueUnavailable, WorkerLost
from sie.core.subjects import direct_subject, work_subject
from sie.core.wire import GenerationChunk
from sie.transport.base import Bus, NoStreamError

__all__ = ["LIVENESS_TICK_S", "MAX_ATTEMPTS", "next_chunk", "send_generation", "wait_accept"]

#: Workers one generation is offered to before the gateway gives up.
MAX_ATTEMPTS = 3
#: Seconds between two liveness checks of the worker a generation waits on.
LIVENESS_TICK_S = 0.25


async def send_generation(
    bus: Bus,
    data: bytes,
    *,
    msg_id: str,
    lane: tuple[str, str, str],
    model_id: str,
    worker_id: str,
) -> str | None:
    """Publish a generation item durably to ``worker_id``'s direct stream; returns
    ``worker_id``, or None when it went to the lane's pool stream instead (that worker
    has no direct stream).

    Raises:
        QueueUnavailable: neither stream takes it (no worker ever attached the lane).
        BusError: the broker is unreachable.
    """
    pool, profile, bundle = lane
    try:
        await bus.js_publish(
            direct_subject(pool, profile, bundle, model_id, worker_id), data, msg_id=msg_id
        )
        return worker_id
    except NoStreamError:
        pass
    try:
        await bus.js_publish(work_subject(pool, profile, bundle, model_id), data, msg_id=msg_id)
    except NoStreamError as exc:
        raise QueueUnavailable(f"no work stream for pool {pool!r}; retry later") from exc
    return None


async def wait_accept(
    receive: MemoryObjectReceiveStream[GenerationChunk],
    worker_id: str | None,
    is_live: Callable[[str], bool],
    deadline: float,
) -> GenerationChunk | None:
    """The first chunk (``seq`` 0: accepted, or the request's error) of a dispatch to
    ``worker_id`` (None: to the pool, any worker); None once that worker is no longer
    live. Chunks of an earlier attempt (another worker, a later ``seq``) are skipped.

    Raises:
        TimeoutError: nothing accepted by ``deadline`` (monotonic seconds).
    """
    while True:
        left = deadline - anyio.current_time()
        if left <= 0:
            raise TimeoutError
        with anyio.move_on_after(min(LIVENESS_TICK_S, left)):
            chunk = await receive.receive()
            if chunk.seq == 0 and (worker_id is None or chunk.worker_id in (None, worker_id)):
                return chunk
            continue
        if worker_id is not None and not is_live(worker_id):
            return None


async def next_chunk(
    receive: MemoryObjectReceiveStream[GenerationChunk],
    worker_id: str,
    is_live: Callable[[str], bool],
    tokens: int,
) -> GenerationChunk:
    """The next chunk from ``worker_id`` (others' are skipped).

    Raises:
        WorkerLost: the worker stopped being live (503; ``tokens`` were sent).
        anyio.EndOfStream: the stream was closed (the client read too slowly).
    """
    while True:
        with anyio.move_on_after(LIVENESS_TICK_S):
            chunk = await receive.receive()
            if chunk.worker_id in (None, worker_id):
                return chunk
            continue
        if not is_live(worker_id):
            raise WorkerLost(
                f"worker {worker_id!r} stopped responding after {tokens} chunks of output; "
                "the generation is incomplete: retry the request"
            )
