"""A worker's durable direct dispatch (architecture §8; docs/topologies.md,
docs/pools.md "Capped pools"): its own JetStream stream ``WORK_DIRECT_{worker}`` and
durable pull consumer, from which it takes what gateways send it alone: generations,
and the encode, score and extract items of capped pools that assign it.

A generation published while the worker restarts waits in the stream; one it took is
acknowledged at once (a gateway that sees the worker die before the first chunk offers
the generation to another worker). Other items are handed to the worker's usual
handling, acknowledged once their result is published, like pool work.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from sie.core.errors import SieError
from sie.core.wire import WorkItem
from sie.roles.worker.streams import attach_direct
from sie.settings_views import BusSettings, WorkerSettings
from sie.transport.base import Bus, JsMsg

__all__ = ["run_direct"]

log = logging.getLogger(__name__)


async def run_direct(
    bus: Bus,
    settings: WorkerSettings,
    streams: BusSettings,
    start: Callable[[WorkItem], None],
    take: Callable[[JsMsg, WorkItem], Awaitable[None]],
) -> None:
    """Take direct work until cancelled: a generation is acknowledged, decoded and
    handed to ``start`` (which runs it in the worker's task group); any other item to
    ``take`` (which settles the message)."""
    consumer = await attach_direct(bus, settings, streams)
    while True:
        try:
            msgs = await consumer.fetch(16, timeout_s=1.0)
        except Exception as exc:  # nothing may stop this loop: re-attach, as the pool's
            log.warning("direct fetch failed (%s); re-attaching", exc)
            await anyio.sleep(0.5)
            consumer = await attach_direct(bus, settings, streams)
            continue
        for msg in msgs:
            try:
                item = WorkItem.from_bytes(msg.data)
                if item.operation != "generate":
                    await take(msg, item)
                    continue
                await msg.ack()
            except SieError as exc:
                log.error("dropping a direct work item on %s: %s", msg.subject, exc.message)
                await _term(msg)
                continue
            except Exception as exc:  # settled meanwhile: the broker redelivers it
                log.warning("cannot take direct work item on %s: %s", msg.subject, exc)
                continue
            start(item)


async def _term(msg: JsMsg) -> None:
    try:
        await msg.term()
    except Exception as exc:  # settled already, or the bus is away
        log.debug("term on %s: %s", msg.subject, exc)
