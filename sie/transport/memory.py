"""In-process bus with NATS Core + JetStream work-queue semantics.

A real backend (the embedded default and the test bus), not a mock: it passes the
same contract suite as the NATS adapter (tests/contract/test_bus.py) and carries
the same bytes, so serialisation is exercised exactly as over NATS. Timers
(ack_wait redelivery, nak delay, max_age) are evaluated lazily on each call, so
the bus owns no background tasks. Single event loop; not thread-safe.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio

from sie.core.subjects import ADVISORY_MAX_DELIVERIES, subject_matches
from sie.transport._buffered import BufferedSubscription
from sie.transport.base import (
    DEFAULT_MAX_PAYLOAD,
    BusError,
    ConsumerConfig,
    ConsumerInfo,
    ConsumerNotFoundError,
    JsMsg,
    Msg,
    NoStreamError,
    PayloadTooLargeError,
    PubAck,
    StreamConfig,
    StreamFullError,
    StreamInfo,
)

__all__ = ["MemoryBus"]


def _filters_overlap(a: str, b: str) -> bool:
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != y and "*" not in (x, y):
            return False
    return True


#: Subjects whose capturing stream the bus remembers (work subjects: one per lane and model).
_ROUTES_CACHED = 4096


class _MemSubscription(BufferedSubscription):
    def __init__(self, bus: MemoryBus, subject: str, max_pending: int) -> None:
        super().__init__(subject, max_pending)
        self._bus = bus

    def _deliver(self, msg: Msg) -> None:
        self.deliver(msg)

    async def unsubscribe(self) -> None:
        self._bus._subs.discard(self)
        self.close()


@dataclass(slots=True)
class _Stored:
    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str] | None
    stored_at: float
    delivered: int = 0
    in_flight: bool = False
    available_at: float = 0.0
    dead: bool = False


@dataclass(slots=True)
class _Consumer:
    config: ConsumerConfig
    redelivered: int = 0


@dataclass(slots=True)
class _Stream:
    config: StreamConfig
    msgs: dict[int, _Stored] = field(default_factory=dict)
    next_seq: int = 1
    consumers: dict[str, _Consumer] = field(default_factory=dict)
    dedupe: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: seq → message delivered and not settled; checked lazily (``in_flight_now``)
    flying: dict[int, _Stored] = field(default_factory=dict)
    _changed: anyio.Event | None = None

    def notify(self) -> None:
        """Wake the fetches waiting for a change (an event is made only for waiters:
        every publish and ack calls this)."""
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    def changed(self) -> anyio.Event:
        """The event the next ``notify`` sets."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def in_flight_now(self, now: float) -> int:
        """Delivered, unsettled messages still inside their ack wait: O(in flight),
        not O(stream)."""
        n = 0
        msgs = self.msgs
        for seq, m in list(self.flying.items()):
            if not m.in_flight or msgs.get(seq) is not m:
                del self.flying[seq]  # settled, expired or discarded since
            elif m.available_at > now:
                n += 1
        return n

    def expire(self, now: float) -> None:
        cutoff = now - self.config.max_age_s
        while self.msgs:
            first = next(iter(self.msgs.values()))
            if first.stored_at >= cutoff:
                break
            del self.msgs[first.seq]
        # ids are inserted in time order: drop expired ones from the front, O(expired)
        # per call (rebuilding the dict cost O(window) on every publish at steady state)
        window = now - self.config.duplicate_window_s
        while self.dedupe:
            oldest = next(iter(self.dedupe))
            if self.dedupe[oldest][1] >= window:
                break
            del self.dedupe[oldest]


class _MemJsMsg:
    __slots__ = ("_delivery", "_stored", "_stream", "data", "headers", "subject")

    def __init__(self, stream: _Stream, stored: _Stored) -> None:
        self._stream = stream
        self._stored = stored
        self._delivery = stored.delivered
        self.subject = stored.subject
        self.data = stored.data
        self.headers = stored.headers

    @property
    def num_delivered(self) -> int:
        return self._delivery

    def _live(self) -> _Stored | None:
        s = self._stream.msgs.get(self._stored.seq)
        return s if s is not None and s.delivered == self._delivery else None

    async def ack(self) -> None:
        if self._live() is not None:
            if self._stream.config.retention == "workqueue":
                del self._stream.msgs[self._stored.seq]
            else:  # limits: the message stays; this (single) consumer is done with it
                self._stored.in_flight, self._stored.dead = False, True
            self._stream.notify()

    async def term(self) -> None:
        await self.ack()

    async def nak(self, delay_s: float | None = None) -> None:
        s = self._live()
        if s is not None:
            s.in_flight = False
            s.available_at = time.monotonic() + (delay_s or 0.0)
            self._stream.notify()

    async def in_progress(self) -> None:
        s = self._live()
        if s is not None and s.in_flight:
            cons = [
                c
                for c in self._stream.consumers.values()
                if subject_matches(c.config.filter_subject, s.subject)
            ]
            wait = cons[0].config.ack_wait_s if cons else 30.0
            s.available_at = time.monotonic() + wait


class _MemPullConsumer:
    def __init__(self, bus: MemoryBus, stream: str, durable: str) -> None:
        self._bus = bus
        self._stream_name = stream
        self._durable = durable

    def _parts(self) -> tuple[_Stream, _Consumer]:
        stream = self._bus._streams.get(self._stream_name)
        if stream is None or self._durable not in stream.consumers:
            raise BusError(
                f"consumer {self._durable!r} on stream {self._stream_name!r} no longer exists"
            )
        return stream, stream.consumers[self._durable]

    async def fetch(self, batch: int, timeout_s: float) -> list[JsMsg]:
        deadline = time.monotonic() + timeout_s
        while True:
            stream, consumer = self._parts()
            now = time.monotonic()
            stream.expire(now)
            cfg = consumer.config
            out: list[JsMsg] = []
            dead: list[_Stored] = []
            next_wake = math.inf
            # ``flying`` over-counts (settled entries leave it lazily): count exactly only
            # when the bound could matter, not on every fetch
            in_flight = len(stream.flying)
            if in_flight + batch > cfg.max_ack_pending:
                in_flight = stream.in_flight_now(now)
            for m in stream.msgs.values():
                if m.dead:
                    continue
                if m.available_at > now:  # in flight, or delayed by a nak
                    if m.available_at < next_wake and subject_matches(
                        cfg.filter_subject, m.subject
                    ):
                        next_wake = m.available_at
                    continue
                if not subject_matches(cfg.filter_subject, m.subject):
                    continue
                if m.delivered >= cfg.max_deliver:
                    m.dead, m.in_flight = True, False
                    dead.append(m)
                    continue
                if in_flight >= cfg.max_ack_pending or len(out) >= batch:
                    break
                if m.delivered:
                    consumer.redelivered += 1
                m.delivered += 1
                m.in_flight = True
                stream.flying[m.seq] = m
                m.available_at = now + cfg.ack_wait_s
                in_flight += 1
                out.append(_MemJsMsg(stream, m))
            for m in dead:
                await self._bus.publish(
                    f"{ADVISORY_MAX_DELIVERIES}.{stream.config.name}.{cfg.durable}",
                    json.dumps(
                        {
                            "stream": stream.config.name,
                            "consumer": cfg.durable,
                            "stream_seq": m.seq,
                            "deliveries": m.delivered,
                        }
                    ).encode(),
                )
            if out:
                return out
            if now >= deadline:
                return []
            with anyio.move_on_after(min(deadline, next_wake) - now):
                await stream.changed().wait()

    async def info(self) -> ConsumerInfo:
        stream, consumer = self._parts()
        now = time.monotonic()
        stream.expire(now)
        f = consumer.config.filter_subject
        mine = [m for m in stream.msgs.values() if not m.dead and subject_matches(f, m.subject)]
        ack_pending = sum(1 for m in mine if m.in_flight and m.available_at > now)
        return ConsumerInfo(
            stream=stream.config.name,
            durable=consumer.config.durable,
            num_pending=len(mine) - ack_pending,
            num_ack_pending=ack_pending,
            num_redelivered=consumer.redelivered,
            filter_subject=f,
        )


class MemoryBus:
    """The in-memory ``Bus``. Use as ``async with MemoryBus() as bus``.

    ``max_payload``: bytes per message, NATS's default unless given, so that the
    embedded default takes the same paths as a broker would (large work items by
    reference, large results in chunks; docs/api.md §12).
    """

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self._max_payload = max_payload
        self._subs: set[_MemSubscription] = set()
        self._streams: dict[str, _Stream] = {}
        self._routes: dict[str, str | None] = {}  # subject -> capturing stream's name
        self._closed = False

    async def __aenter__(self) -> MemoryBus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        for sub in list(self._subs):
            await sub.unsubscribe()

    @property
    def is_connected(self) -> bool:
        return not self._closed

    @property
    def max_payload(self) -> int:
        return self._max_payload

    def _check(self, data: bytes = b"") -> None:
        if self._closed:
            raise BusError("bus is closed")
        if len(data) > self._max_payload:
            raise PayloadTooLargeError(
                f"message of {len(data)} bytes is over max_payload ({self._max_payload})"
            )

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        self._check(data)
        msg = Msg(subject, bytes(data), headers)
        for sub in list(self._subs):
            if subject_matches(sub.subject, subject):
                sub._deliver(msg)

    async def subscribe(self, subject: str, *, max_pending: int = 65536) -> _MemSubscription:
        self._check()
        sub = _MemSubscription(self, subject, max_pending)
        self._subs.add(sub)
        return sub

    def _info(self, stream: _Stream) -> StreamInfo:
        stream.expire(time.monotonic())
        return StreamInfo(
            stream.config.name, len(stream.msgs), len(stream.consumers), stream.config
        )

    def _stream_for(self, subject: str) -> _Stream | None:
        """The stream capturing ``subject``; lookups are remembered (at most
        ``_ROUTES_CACHED`` subjects; a stream change forgets them all)."""
        if subject in self._routes:
            name = self._routes[subject]
            return self._streams.get(name) if name is not None else None
        stream = next(
            (
                s
                for s in self._streams.values()
                if any(subject_matches(p, subject) for p in s.config.subjects)
            ),
            None,
        )
        if len(self._routes) >= _ROUTES_CACHED:
            self._routes.clear()
        self._routes[subject] = stream.config.name if stream is not None else None
        return stream

    async def add_stream(self, config: StreamConfig) -> StreamInfo:
        self._check()
        self._routes.clear()
        for other in self._streams.values():
            if other.config.name != config.name and any(
                _filters_overlap(a, b) for a in config.subjects for b in other.config.subjects
            ):
                raise BusError(f"subjects {config.subjects} overlap stream {other.config.name!r}")
        stream = self._streams.get(config.name)
        if stream is None:
            stream = self._streams[config.name] = _Stream(config)
        else:
            stream.config = config  # reconcile subjects, max_msgs, max_age (architecture §8.2)
        return self._info(stream)

    async def stream_info(self, name: str) -> StreamInfo:
        self._check()
        stream = self._streams.get(name)
        if stream is None:
            raise NoStreamError(f"stream {name!r} not found")
        return self._info(stream)

    async def js_publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> PubAck:
        self._check(data)
        stream = self._stream_for(subject)
        if stream is None:
            raise NoStreamError(f"no stream captures subject {subject!r}")
        now = time.monotonic()
        stream.expire(now)
        if msg_id is not None and msg_id in stream.dedupe:
            return PubAck(stream.config.name, stream.dedupe[msg_id][0], duplicate=True)
        if len(stream.msgs) >= stream.config.max_msgs and stream.config.discard == "old":
            del stream.msgs[next(iter(stream.msgs))]
        if len(stream.msgs) >= stream.config.max_msgs:
            raise StreamFullError(
                f"stream {stream.config.name!r} is full ({stream.config.max_msgs} messages)"
            )
        seq = stream.next_seq
        stream.next_seq += 1
        stream.msgs[seq] = _Stored(seq, subject, bytes(data), headers, now)
        if msg_id is not None:
            stream.dedupe[msg_id] = (seq, now)
        stream.notify()
        return PubAck(stream.config.name, seq)

    async def get_message(self, stream: str, seq: int) -> Msg:
        self._check()
        st = self._streams.get(stream)
        if st is None:
            raise NoStreamError(f"stream {stream!r} not found")
        st.expire(time.monotonic())
        m = st.msgs.get(seq)
        if m is None:
            raise BusError(f"message {seq} of stream {stream!r} is gone")
        return Msg(m.subject, m.data, m.headers)

    async def consumer_info(self, stream: str, durable: str) -> ConsumerInfo:
        self._check()
        s = self._streams.get(stream)
        if s is None:
            raise NoStreamError(f"stream {stream!r} not found")
        if durable not in s.consumers:
            raise ConsumerNotFoundError(f"consumer {durable!r} not found on {stream!r}")
        return await _MemPullConsumer(self, stream, durable).info()

    async def subject_count(self, stream: str, filter_subject: str) -> int:
        self._check()
        s = self._streams.get(stream)
        if s is None:
            raise NoStreamError(f"stream {stream!r} not found")
        s.expire(time.monotonic())
        return sum(
            1 for m in s.msgs.values() if not m.dead and subject_matches(filter_subject, m.subject)
        )

    async def pull_consumer(self, stream: str, config: ConsumerConfig) -> _MemPullConsumer:
        self._check()
        s = self._streams.get(stream)
        if s is None:
            raise NoStreamError(f"stream {stream!r} not found")
        if config.durable not in s.consumers and s.config.retention == "workqueue":
            for other in s.consumers.values():
                if _filters_overlap(other.config.filter_subject, config.filter_subject):
                    raise BusError(
                        f"filtered consumer not unique on work-queue stream {stream!r}: "
                        f"{config.filter_subject!r} overlaps {other.config.durable!r}"
                    )
        s.consumers.setdefault(config.durable, _Consumer(config))
        return _MemPullConsumer(self, stream, config.durable)
