"""How many items each pool's work stream holds, as one gateway accounts for them
(docs/security.md "Work streams").

The broker's count is read at most every ``READING_TTL_S``; to it the gateway adds the
items it published since that reading began and the items it admitted and has not yet
published, so concurrent requests on one gateway cannot push a stream past
``max_stream_pending`` between two readings.
"""

from __future__ import annotations

import logging
import time

import anyio

from sie.core.errors import SieError
from sie.core.subjects import stream_name
from sie.settings_views import BusSettings
from sie.transport.base import Bus, NoStreamError, work_stream_config

__all__ = ["READING_TTL_S", "StreamPending"]

log = logging.getLogger(__name__)

#: Seconds a broker reading of a stream's message count is reused.
READING_TTL_S = 0.25


class StreamPending:
    """Per pool: the last broker reading, items published since it began, items
    admitted and not yet published; and the work streams already ensured."""

    def __init__(self, bus: Bus, streams: BusSettings) -> None:
        self.bus = bus
        self.streams = streams
        self._readings: dict[str, tuple[int, float]] = {}
        self._unpublished: dict[str, int] = {}
        self._unread_published: dict[str, int] = {}
        self._streams: set[str] = set()
        self._locks: dict[str, anyio.Lock] = {}

    async def count(self, pool: str) -> int:
        """Items in ``pool``'s stream, plus those published since the reading and those
        admitted and not yet published. 0 for the reading while the bus is away (the
        publish itself then answers 503)."""
        reading = await self._reading(pool)
        return reading + self._unread_published.get(pool, 0) + self._unpublished.get(pool, 0)

    def reserve(self, pool: str, n: int) -> None:
        """``n`` items were admitted and are about to be published."""
        self._unpublished[pool] = self._unpublished.get(pool, 0) + n

    def release(self, pool: str, n: int) -> None:
        """``n`` admitted items will not be published (the request ended)."""
        self._unpublished[pool] -= n

    def published(self, pool: str) -> None:
        """One admitted item was published: it counts until the next reading has it."""
        self._unpublished[pool] -= 1
        self._unread_published[pool] = self._unread_published.get(pool, 0) + 1

    def forget_readings(self) -> None:
        """Read every stream from the broker at the next ``count``."""
        self._readings.clear()

    async def _reading(self, pool: str) -> int:
        """The broker's count, read by one coroutine at a time per pool: concurrent
        readers each subtracting the same snapshot of the published count would push
        it ever further off, round after round (a burst of requests on a stale reading
        once made a gateway see 100,000 stored items in a stream holding a few)."""
        cached = self._readings.get(pool)
        if cached is not None and time.monotonic() - cached[1] < READING_TTL_S:
            return cached[0]
        lock = self._locks.get(pool)
        if lock is None:
            lock = self._locks[pool] = anyio.Lock()
        async with lock:
            now = time.monotonic()
            cached = self._readings.get(pool)
            if cached is not None and now - cached[1] < READING_TTL_S:
                return cached[0]  # read while this one waited
            published = self._unread_published.get(pool, 0)
            try:
                count = (await self.bus.stream_info(stream_name(pool))).messages
            except NoStreamError:
                count = 0
            except SieError as exc:  # the bus is away: the publish will say so (503)
                log.debug("stream pending check failed: %s", exc.message)
                self._readings[pool] = (0, now)  # not retried by every waiter
                return 0
            # what was published before the reading began is in its count
            self._unread_published[pool] = self._unread_published.get(pool, 0) - published
            self._readings[pool] = (count, now)
            return count

    async def ensure_stream(self, pool: str) -> None:
        """Create or reconcile ``pool``'s work stream once per gateway (§8.2).

        Raises:
            SieError: the bus refused (e.g. away: 503).
        """
        if pool not in self._streams:
            s = self.streams
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

    async def stream_gone(self, pool: str) -> None:
        """The stream was deleted under us (e.g. a broker restart): ensure it again."""
        self._streams.discard(pool)
        await self.ensure_stream(pool)
