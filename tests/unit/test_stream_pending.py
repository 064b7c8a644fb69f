"""The gateway's stream accounting (sie.roles.gateway.pending, docs/security.md "Work
streams") under a burst of concurrent requests on a stale reading: the count stays the
stream's contents, round after round (it once ran away to 100,000 in a fault test)."""

from __future__ import annotations

import anyio
import pytest

from sie.core.subjects import stream_name
from sie.roles.gateway.pending import StreamPending
from sie.settings import ServeSettings
from sie.settings_views import BusSettings
from sie.transport.base import StreamInfo
from sie.transport.memory import MemoryBus

pytestmark = pytest.mark.anyio

POOL = "default"


class SlowInfoBus(MemoryBus):
    """The real in-memory bus whose ``stream_info`` yields to the event loop first, as a
    broker round trip does, so that concurrent readers interleave."""

    calls = 0

    async def stream_info(self, name: str) -> StreamInfo:
        self.calls += 1
        await anyio.sleep(0.01)
        return await super().stream_info(name)


async def _burst(pending: StreamPending, n: int) -> set[int]:
    seen: set[int] = set()

    async def one() -> None:
        seen.add(await pending.count(POOL))

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return seen


async def test_a_burst_on_a_stale_reading_counts_what_the_stream_holds() -> None:
    async with SlowInfoBus() as bus:
        pending = StreamPending(bus, ServeSettings().view(BusSettings))
        await pending.ensure_stream(POOL)
        for i in range(10):  # ten items admitted and published, none consumed yet
            pending.reserve(POOL, 1)
            await bus.js_publish(f"sie.work.{POOL}.p.b.m", b"x", msg_id=f"r.{i}")
            pending.published(POOL)
        assert (await bus.stream_info(stream_name(POOL))).messages == 10
        bus.calls = 0
        for _ in range(3):  # rounds: each burst finds the reading stale
            pending.forget_readings()
            assert await _burst(pending, 50) == {10}
        assert bus.calls == 3  # one broker read per stale reading, not one per request
