"""JetStream pull consumption for the NATS bus (``sie.transport.nats``): delivered
messages and their settlement, and durable pull consumers (architecture §8.2)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg as NatsMsg

from sie.transport.base import BusError, ConsumerInfo

__all__ = ["NatsJsMsg", "NatsPullConsumer"]


class NatsJsMsg:
    """A delivered JetStream message (``JsMsg``)."""

    def __init__(self, m: NatsMsg) -> None:
        self._m = m
        self.subject = m.subject
        self.data = m.data
        self.headers = dict(m.headers) if m.headers else None

    @property
    def num_delivered(self) -> int:
        return int(self._m.metadata.num_delivered)

    async def _settle(self, what: str, coro: Any) -> None:
        try:
            await coro
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"{what} failed: {exc}") from exc

    async def ack(self) -> None:
        # ack_sync: once this returns the server has removed the message (work queue)
        await self._settle("ack", self._m.ack_sync(timeout=5.0))

    async def nak(self, delay_s: float | None = None) -> None:
        await self._settle("nak", self._m.nak(delay=delay_s))

    async def term(self) -> None:
        await self._settle("term", self._m.term())

    async def in_progress(self) -> None:
        await self._settle("in_progress", self._m.in_progress())


class NatsPullConsumer:
    """A durable pull consumer (``PullConsumer``); ``jsx`` returns the JetStream
    context, raising ``BusError`` while disconnected."""

    def __init__(self, jsx: Callable[[], Any], stream: str, durable: str, psub: Any) -> None:
        self._jsx = jsx
        self._stream = stream
        self._durable = durable
        self._psub = psub

    async def fetch(self, batch: int, timeout_s: float) -> list[Any]:
        try:
            msgs = await self._psub.fetch(batch, timeout=max(timeout_s, 0.001))
        except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises both kinds
            return []
        except nats.js.errors.NotFoundError as exc:
            raise BusError(f"consumer {self._durable!r} or its stream is gone") from exc
        except nats.errors.Error as exc:
            raise BusError(f"fetch from {self._stream}/{self._durable} failed: {exc}") from exc
        return [NatsJsMsg(m) for m in msgs]

    async def info(self) -> ConsumerInfo:
        try:
            ci = await self._jsx().consumer_info(self._stream, self._durable)
        except nats.js.errors.NotFoundError as exc:
            raise BusError(f"consumer {self._durable!r} not found") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"consumer info failed: {exc}") from exc
        return ConsumerInfo(
            stream=self._stream,
            durable=self._durable,
            num_pending=int(ci.num_pending or 0),
            num_ack_pending=int(ci.num_ack_pending or 0),
            num_redelivered=int(ci.num_redelivered or 0),
        )
