"""The bus port: NATS Core pub/sub plus JetStream work-queue streams, over bytes.

Semantics every implementation must honour (tests/contract/test_bus.py runs the
same suite against each; architecture §8, §8.2):

Core pub/sub
    ``publish(subject, data)`` is fire-and-forget; ``subscribe(pattern)`` gets every
    later message whose subject matches (``*`` = one token, ``>`` = one or more
    trailing tokens). No replay, no acks.

Message size
    ``max_payload`` is the most bytes one message's data may hold (NATS: the broker's
    ``max_payload`` from its INFO, 1 MiB by default). ``publish`` and ``js_publish``
    raise ``PayloadTooLargeError`` for a larger one, before sending anything.

Work-queue streams
    ``add_stream`` creates or reconciles a stream (WorkQueue retention: a message
    is deleted once acked). ``js_publish`` stores a message and returns its
    ``PubAck``; it raises ``NoStreamError`` when no stream captures the subject and
    ``StreamFullError`` when the stream holds ``max_msgs`` (discard=new).
    ``pull_consumer`` binds (creating if needed) a durable pull consumer with a
    subject filter. ``fetch`` returns up to ``batch`` messages, waiting at most
    ``timeout_s`` seconds for the first; an empty list means none arrived.
    A delivered message must be settled: ``ack`` (gone), ``nak(delay_s)``
    (redelivered after the delay), ``term`` (never redelivered), or
    ``in_progress`` (resets the ack timer). An unsettled message is redelivered
    after ``ack_wait_s``. After ``max_deliver`` deliveries it is not delivered
    again and a max-deliveries advisory is published on
    ``$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sie.core.errors import QueueUnavailable
from sie.core.subjects import (
    DEAD_LETTERS_STREAM,
    DLQ_PREFIX,
    direct_filter,
    direct_stream_name,
    stream_name,
    stream_subjects,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "MESSAGE_HEADROOM_BYTES",
    "Bus",
    "BusError",
    "ConsumerConfig",
    "ConsumerInfo",
    "JsMsg",
    "Msg",
    "NoStreamError",
    "PayloadTooLargeError",
    "PubAck",
    "PullConsumer",
    "StreamConfig",
    "StreamFullError",
    "StreamInfo",
    "Subscription",
    "data_limit",
    "dead_letter_stream_config",
    "direct_stream_config",
    "work_stream_config",
]


class BusError(QueueUnavailable):
    """The bus could not carry out an operation (503 QUEUE_UNAVAILABLE)."""


class NoStreamError(BusError):
    """No stream captures the subject (NATS: no responders)."""


class ConsumerNotFoundError(BusError):
    """The stream has no durable consumer of that name."""


class PayloadTooLargeError(BusError):
    """A message over the bus's ``max_payload`` (nothing was sent)."""


#: ``max_payload`` until a broker says otherwise (NATS's default, 1 MiB).
DEFAULT_MAX_PAYLOAD = 1024 * 1024
#: Bytes of a message kept free for headers (``Nats-Msg-Id``, trace context) and the
#: protocol line: data up to ``max_payload - MESSAGE_HEADROOM_BYTES`` always fits.
MESSAGE_HEADROOM_BYTES = 8 * 1024


def data_limit(max_payload: int) -> int:
    """The most data bytes SIE puts in one message on a bus of ``max_payload`` bytes."""
    return max(1024, max_payload - MESSAGE_HEADROOM_BYTES)


class StreamFullError(BusError):
    """The stream is at ``max_msgs`` and discards new messages (architecture §8.2)."""

    code = "QUEUE_FULL"


@dataclass(frozen=True, slots=True)
class Msg:
    """A core pub/sub message."""

    subject: str
    data: bytes
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """A work-queue stream (architecture §8.2 defaults). ``max_age_s`` in seconds."""

    name: str
    subjects: list[str]
    max_msgs: int = 100_000
    max_age_s: float = 1800.0
    storage: str = "memory"
    replicas: int = 1
    duplicate_window_s: float = 120.0
    #: ``workqueue`` (an ack removes the message) or ``limits`` (kept until max_age /
    #: max_msgs, e.g. ``DEAD_LETTERS``)
    retention: str = "workqueue"
    #: when full: ``new`` rejects the publish (work, §8.2); ``old`` drops the oldest
    discard: str = "new"


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A durable pull consumer. ``ack_wait_s`` in seconds."""

    durable: str
    filter_subject: str
    ack_wait_s: float = 30.0
    max_deliver: int = 20
    max_ack_pending: int = 1000


@dataclass(frozen=True, slots=True)
class PubAck:
    stream: str
    seq: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    messages: int
    consumers: int
    config: StreamConfig


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """``num_pending``: undelivered; ``num_ack_pending``: delivered, not yet settled."""

    stream: str
    durable: str
    num_pending: int
    num_ack_pending: int
    num_redelivered: int = 0
    filter_subject: str | None = None


class Subscription(Protocol):
    """An async iterator of ``Msg``; ``unsubscribe`` ends it."""

    subject: str

    def __aiter__(self) -> AsyncIterator[Msg]: ...

    async def next_msg(self, timeout_s: float) -> Msg:
        """Next message; raises ``TimeoutError`` after ``timeout_s`` seconds."""
        ...

    async def unsubscribe(self) -> None: ...


class JsMsg(Protocol):
    """A delivered work-queue message awaiting settlement."""

    subject: str
    data: bytes
    headers: Mapping[str, str] | None

    @property
    def num_delivered(self) -> int:
        """1 on first delivery, 2 on the first redelivery, ..."""
        ...

    async def ack(self) -> None: ...

    async def nak(self, delay_s: float | None = None) -> None: ...

    async def term(self) -> None: ...

    async def in_progress(self) -> None: ...


class PullConsumer(Protocol):
    async def fetch(self, batch: int, timeout_s: float) -> list[JsMsg]:
        """Up to ``batch`` messages; ``[]`` if none within ``timeout_s`` seconds.

        Raises:
            BusError: the consumer or its stream no longer exists.
        """
        ...

    async def info(self) -> ConsumerInfo: ...


@runtime_checkable
class Bus(Protocol):
    """The message bus port. Implementations are async context managers."""

    async def __aenter__(self) -> Bus: ...

    async def __aexit__(self, *exc: object) -> None: ...

    @property
    def is_connected(self) -> bool:
        """Whether publishes can currently reach the broker (architecture §3 step 3.6)."""
        ...

    @property
    def max_payload(self) -> int:
        """Most bytes of data one message may carry (the broker's limit, read from the
        connection; ``DEFAULT_MAX_PAYLOAD`` while it is not known)."""
        ...

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Core publish (fire-and-forget).

        Raises:
            BusError: disconnected.
            PayloadTooLargeError: ``data`` is over ``max_payload``.
        """
        ...

    async def subscribe(self, subject: str, *, max_pending: int = 65536) -> Subscription:
        """Core subscription on a subject pattern. Raises ``BusError``."""
        ...

    async def add_stream(self, config: StreamConfig) -> StreamInfo:
        """Create the stream, or reconcile subjects/max_msgs/max_age of an existing one."""
        ...

    async def stream_info(self, name: str) -> StreamInfo:
        """Raises ``NoStreamError`` if the stream does not exist."""
        ...

    async def js_publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> PubAck:
        """Store a message.

        Raises:
            NoStreamError: no stream captures ``subject``.
            StreamFullError: the stream is at ``max_msgs``.
            PayloadTooLargeError: ``data`` is over ``max_payload``.
        """
        ...

    async def get_message(self, stream: str, seq: int) -> Msg:
        """The stored message ``seq`` of ``stream`` (e.g. the work a MAX_DELIVERIES
        advisory names). Raises ``NoStreamError``, or ``BusError`` if it is gone."""
        ...

    async def consumer_info(self, stream: str, durable: str) -> ConsumerInfo:
        """A durable consumer's counts and filter, without binding it.

        Raises:
            NoStreamError, ConsumerNotFoundError, BusError (unreachable).
        """
        ...

    async def subject_count(self, stream: str, filter_subject: str) -> int:
        """Messages the stream holds on subjects matching ``filter_subject``.

        Raises:
            NoStreamError, BusError (unreachable).
        """
        ...

    async def pull_consumer(self, stream: str, config: ConsumerConfig) -> PullConsumer:
        """Create or bind a durable pull consumer. Raises ``NoStreamError``."""
        ...


def dead_letter_stream_config(*, storage: str = "memory", replicas: int = 1) -> StreamConfig:
    """``DEAD_LETTERS`` capturing ``sie.dlq.>``: limits retention, 24 h (architecture §8)."""
    return StreamConfig(
        name=DEAD_LETTERS_STREAM,
        subjects=[f"{DLQ_PREFIX}.>"],
        max_age_s=24 * 3600.0,
        storage=storage,
        replicas=replicas,
        retention="limits",
        discard="old",
    )


def direct_stream_config(
    pool: str,
    machine_profile: str,
    bundle: str,
    worker_id: str,
    *,
    storage: str = "memory",
    replicas: int = 1,
) -> StreamConfig:
    """``WORK_DIRECT_{worker}`` capturing ``sie.work.{pool}.{profile}.{bundle}.*.{worker}``
    (architecture §8): generation items dispatched to one worker wait here while it
    restarts. Kept 5 minutes at most: a gateway gives up on an unaccepted item long before.
    """
    return StreamConfig(
        name=direct_stream_name(worker_id),
        subjects=[direct_filter(pool, machine_profile, bundle, worker_id)],
        max_msgs=10_000,
        max_age_s=300.0,
        storage=storage,
        replicas=replicas,
    )


def work_stream_config(
    pool: str,
    *,
    max_msgs: int = 100_000,
    max_age_s: float = 1800.0,
    storage: str = "memory",
    replicas: int = 1,
) -> StreamConfig:
    """``WORK_POOL_{pool}`` capturing ``sie.work.{pool}.*.*.*`` (architecture §8.2).

    Gateway and worker both ensure it with the same settings so neither wins a race.
    """
    return StreamConfig(
        name=stream_name(pool),
        subjects=stream_subjects(pool),
        max_msgs=max_msgs,
        max_age_s=max_age_s,
        storage=storage,
        replicas=replicas,
    )
