"""A subscription buffered in a bounded in-process stream, shared by the bus adapters.

Producers call ``deliver`` (never blocks: a full buffer drops the message and counts
it, as a NATS slow consumer would); readers iterate or call ``next_msg``; ``close``
ends iteration after the buffered messages.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import anyio

from sie.transport.base import BusError, Msg

__all__ = ["BufferedSubscription"]

log = logging.getLogger(__name__)


class BufferedSubscription:
    def __init__(self, subject: str, max_pending: int) -> None:
        self.subject = subject
        self.dropped = 0
        self._send, self._recv = anyio.create_memory_object_stream[Msg](max_pending)

    def deliver(self, msg: Msg) -> None:
        try:
            self._send.send_nowait(msg)
        except anyio.WouldBlock:
            self.dropped += 1
            if self.dropped in (1, 100, 10_000):
                log.warning("slow reader on %s: %d message(s) dropped", self.subject, self.dropped)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def close(self) -> None:
        self._send.close()

    async def __aiter__(self) -> AsyncIterator[Msg]:
        try:
            async for msg in self._recv:
                yield msg
        except anyio.ClosedResourceError:
            return

    async def next_msg(self, timeout_s: float) -> Msg:
        """Raises ``TimeoutError`` after ``timeout_s`` seconds, ``BusError`` once closed."""
        try:
            with anyio.fail_after(timeout_s):
                return await self._recv.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError) as exc:
            raise BusError(f"subscription {self.subject!r} is closed") from exc
