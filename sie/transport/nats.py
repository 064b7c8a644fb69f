"""The NATS Core + JetStream adapter of the bus port (architecture §8, §8.2, §10).

The only module that imports ``nats`` (the ``nats`` extra). Semantics match
``sie.transport.memory`` (the same contract suite runs on both):

- core pub/sub for inbox results, config deltas, health and ``work_cancel``;
- work streams with WorkQueue retention, ``discard: new``, ``max_msgs``,
  ``max_age``, ``Nats-Msg-Id`` dedupe; an existing stream's subjects, limits,
  discard and replicas are reconciled, its storage type never (a warning instead);
- durable pull consumers with explicit ack, ``ack_wait``, ``max_deliver`` and the
  ``MAX_DELIVERIES`` advisory (emitted by the server).

Connection: retries the initial connect, then reconnects forever with backoff
(nats-py keeps subscriptions across reconnects). nats-py errors become our
``BusError`` / ``NoStreamError`` / ``StreamFullError`` with ``raise ... from exc``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc

from sie.transport._buffered import BufferedSubscription
from sie.transport._nats_pull import NatsPullConsumer
from sie.transport.base import (
    DEFAULT_MAX_PAYLOAD,
    BusError,
    ConsumerConfig,
    ConsumerInfo,
    ConsumerNotFoundError,
    Msg,
    NoStreamError,
    PayloadTooLargeError,
    PubAck,
    StreamConfig,
    StreamFullError,
    StreamInfo,
)

try:
    import nats
    import nats.errors
    import nats.js.errors
    from nats.aio.client import Client
    from nats.aio.msg import Msg as NatsMsg
    from nats.js import api
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the NATS bus needs the 'nats' extra: pip install 'sie[nats]'") from exc

__all__ = ["NatsBus"]

log = logging.getLogger(__name__)

#: JetStream API error codes we translate (nats-server ``server/errors.json``).
ERR_STREAM_NOT_FOUND = 10059
ERR_MAX_MSGS = 10077
ERR_MAX_BYTES = 10078
ERR_STREAM_NAME_IN_USE = 10058


def _headers(h: Mapping[str, str] | None) -> dict[str, str] | None:
    return dict(h) if h else None


def _msg(m: NatsMsg) -> Msg:
    return Msg(m.subject, m.data, dict(m.headers) if m.headers else None)


class _NatsSubscription(BufferedSubscription):
    """A core subscription, buffered in process.

    It can be created before the connection exists: the bus binds it to the broker
    once connected, and nats-py keeps it across reconnects.
    """

    def __init__(self, subject: str, max_pending: int) -> None:
        super().__init__(subject, max_pending)
        self._sub: Any = None
        self._closed = False

    async def _on_msg(self, m: NatsMsg) -> None:
        self.deliver(_msg(m))

    async def bind(self, nc: Client) -> None:
        if self._sub is None and not self._closed:
            self._sub = await nc.subscribe(self.subject, cb=self._on_msg)

    async def unsubscribe(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.close()
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass  # connection closed: the subscription is gone anyway


class NatsBus:
    """The NATS ``Bus``. Use as ``async with NatsBus(url) as bus``.

    Args:
        url: one or more comma-separated ``nats://`` URLs (``SIE_NATS_URL``).
        name: connection name shown in NATS monitoring.
        connect_timeout_s: per-attempt connect timeout, seconds.
        reconnect_wait_s: wait between reconnect attempts, seconds.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "sie",
        connect_timeout_s: float = 2.0,
        reconnect_wait_s: float = 0.5,
        initial_connect_attempts: int = 0,
    ) -> None:
        """Args: ``url`` comma-separated ``nats://`` URLs; times in seconds;
        ``initial_connect_attempts`` > 0 makes ``__aenter__`` fail if the broker is
        not reachable within that many connect timeouts (0: never block start-up)."""
        self.url = url
        self.name = name
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_wait_s = reconnect_wait_s
        self.initial_connect_attempts = initial_connect_attempts
        self._nc: Client | None = None
        self._js: Any = None
        self._subs: set[_NatsSubscription] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        self._connected: anyio.Event | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> NatsBus:
        """Connect in the background (nats-py retries the initial connect forever, then
        reconnects forever) and wait briefly for it. Start-up is never blocked on the
        broker: until it is reachable ``is_connected`` is False, publishes raise
        ``BusError`` (a 503), and subscriptions made meanwhile are bound once connected
        (architecture §2, §10).

        Raises:
            BusError: with ``initial_connect_attempts`` > 0, not connected within that
                many connect timeouts (tests and tools that need the broker now).
        """
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        connected = self._connected = anyio.Event()
        self._tg.start_soon(self._connect_in_background)
        wait_s = self.connect_timeout_s * max(1, self.initial_connect_attempts)
        with anyio.move_on_after(wait_s):
            await connected.wait()
        if not connected.is_set():
            if self.initial_connect_attempts:
                await self.__aexit__(None, None, None)
                raise BusError(f"cannot connect to NATS at {self.url} within {wait_s:g}s")
            log.warning("NATS at %s is not reachable yet; still trying", self.url)
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
        await self.close()

    async def _connect_in_background(self) -> None:
        try:
            nc = await nats.connect(
                servers=[u.strip() for u in self.url.split(",") if u.strip()],
                name=self.name,
                connect_timeout=self.connect_timeout_s,
                reconnect_time_wait=self.reconnect_wait_s,
                max_reconnect_attempts=-1,
                allow_reconnect=True,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
        except nats.errors.Error as exc:  # only on a permanent error (e.g. bad URL)
            log.error("NATS connect to %s failed for good: %s", self.url, exc)
            return
        self._nc = nc
        self._js = nc.jetstream()
        for sub in list(self._subs):
            await sub.bind(nc)
        log.info("NATS connected to %s", self.url)
        if self._connected is not None:
            self._connected.set()

    async def close(self) -> None:
        for sub in list(self._subs):
            await sub.unsubscribe()
        self._subs.clear()
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            try:
                await nc.close()
            except nats.errors.Error:
                pass

    async def _on_error(self, exc: Exception) -> None:
        log.debug("NATS: %s", exc)

    async def _on_disconnected(self) -> None:
        if self._nc is not None:  # not a close() of ours
            log.warning("NATS disconnected from %s; reconnecting", self.url)

    async def _on_reconnected(self) -> None:
        log.info("NATS reconnected to %s", self._nc.connected_url if self._nc else self.url)

    @property
    def is_connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    @property
    def max_payload(self) -> int:
        """The connected broker's ``max_payload`` (from its INFO)."""
        if self._nc is None:
            return DEFAULT_MAX_PAYLOAD
        return int(self._nc.max_payload or DEFAULT_MAX_PAYLOAD)

    def _check_size(self, subject: str, data: bytes) -> None:
        if len(data) > self.max_payload:
            raise PayloadTooLargeError(
                f"message of {len(data)} bytes on {subject!r} is over the broker's "
                f"max_payload ({self.max_payload})"
            )

    def _client(self) -> Client:
        if self._nc is None or self._nc.is_closed:
            raise BusError(f"NATS at {self.url} is not connected")
        return self._nc

    def _jsx(self) -> Any:
        self._client()
        return self._js

    # -- core pub/sub --------------------------------------------------------------------

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        nc = self._client()
        if not nc.is_connected:
            raise BusError(f"NATS is disconnected; cannot publish on {subject!r}")
        self._check_size(subject, data)
        try:
            await nc.publish(subject, data, headers=_headers(headers))
        except nats.errors.MaxPayloadError as exc:
            raise PayloadTooLargeError(f"message on {subject!r} is over max_payload") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"publish on {subject!r} failed: {exc}") from exc

    async def subscribe(self, subject: str, *, max_pending: int = 65536) -> _NatsSubscription:
        """Subscribe now, or as soon as the bus connects."""
        sub = _NatsSubscription(subject, max_pending)
        self._subs.add(sub)
        if self._nc is not None and not self._nc.is_closed:
            try:
                await sub.bind(self._nc)
            except nats.errors.Error as exc:
                self._subs.discard(sub)
                raise BusError(f"subscribe to {subject!r} failed: {exc}") from exc
        return sub

    # -- streams -------------------------------------------------------------------------

    @staticmethod
    def _native(config: StreamConfig) -> Any:
        return api.StreamConfig(
            name=config.name,
            subjects=list(config.subjects),
            retention=(
                api.RetentionPolicy.LIMITS
                if config.retention == "limits"
                else api.RetentionPolicy.WORK_QUEUE
            ),
            storage=api.StorageType.FILE if config.storage == "file" else api.StorageType.MEMORY,
            max_msgs=config.max_msgs,
            max_age=config.max_age_s,
            discard=api.DiscardPolicy.OLD if config.discard == "old" else api.DiscardPolicy.NEW,
            num_replicas=config.replicas,
            # JetStream requires duplicate_window <= max_age
            duplicate_window=(
                min(config.duplicate_window_s, config.max_age_s)
                if config.max_age_s > 0
                else config.duplicate_window_s
            ),
        )

    @staticmethod
    def _info(si: Any) -> StreamInfo:
        c = si.config
        return StreamInfo(
            name=c.name,
            messages=int(si.state.messages),
            consumers=int(si.state.consumer_count or 0),
            config=StreamConfig(
                name=c.name,
                subjects=list(c.subjects or []),
                max_msgs=int(c.max_msgs if c.max_msgs is not None else -1),
                max_age_s=float(c.max_age or 0.0),
                storage="file" if c.storage == api.StorageType.FILE else "memory",
                replicas=int(c.num_replicas or 1),
                duplicate_window_s=float(c.duplicate_window or 0.0),
                retention="limits" if c.retention == api.RetentionPolicy.LIMITS else "workqueue",
                discard="old" if c.discard == api.DiscardPolicy.OLD else "new",
            ),
        )

    async def add_stream(self, config: StreamConfig) -> StreamInfo:
        """Create the stream, or reconcile an existing one (architecture §8.2).

        Raises:
            BusError: the broker refused.
        """
        js = self._jsx()
        want = self._native(config)
        try:
            return self._info(await js.add_stream(config=want))
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != ERR_STREAM_NAME_IN_USE:
                raise BusError(f"add_stream {config.name}: {exc.description}") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"add_stream {config.name} failed: {exc}") from exc
        try:
            have = (await js.stream_info(config.name)).config
            if have.storage != want.storage:
                log.warning(
                    "stream %s has storage %s, configured %s: storage is never changed in "
                    "place (drain and recreate the stream to change it)",
                    config.name,
                    have.storage,
                    want.storage,
                )
                want.storage = have.storage
            return self._info(await js.update_stream(config=want))
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"reconciling stream {config.name} failed: {exc}") from exc

    async def stream_info(self, name: str) -> StreamInfo:
        try:
            return self._info(await self._jsx().stream_info(name))
        except nats.js.errors.NotFoundError as exc:
            raise NoStreamError(f"stream {name!r} does not exist") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"stream_info {name} failed: {exc}") from exc

    async def js_publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> PubAck:
        hdrs = dict(headers or {})
        if msg_id is not None:
            hdrs["Nats-Msg-Id"] = msg_id
        self._check_size(subject, data)
        try:
            ack = await self._jsx().publish(subject, data, headers=hdrs or None)
        except (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError) as exc:
            raise NoStreamError(f"no stream captures {subject!r}") from exc
        except nats.js.errors.APIError as exc:
            if exc.err_code in (ERR_MAX_MSGS, ERR_MAX_BYTES):
                raise StreamFullError(f"stream for {subject!r} is full") from exc
            if exc.err_code == ERR_STREAM_NOT_FOUND:
                raise NoStreamError(f"no stream captures {subject!r}") from exc
            raise BusError(f"publish on {subject!r} failed: {exc.description}") from exc
        except nats.errors.MaxPayloadError as exc:
            raise PayloadTooLargeError(f"message on {subject!r} is over max_payload") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"publish on {subject!r} failed: {exc}") from exc
        return PubAck(stream=ack.stream, seq=int(ack.seq), duplicate=bool(ack.duplicate))

    async def get_message(self, stream: str, seq: int) -> Msg:
        try:
            raw = await self._jsx().get_msg(stream, seq)
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code == ERR_STREAM_NOT_FOUND:
                raise NoStreamError(f"stream {stream!r} does not exist") from exc
            raise BusError(f"message {seq} of stream {stream!r} is gone") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"get_message {stream}/{seq} failed: {exc}") from exc
        return Msg(raw.subject or "", raw.data or b"", dict(raw.headers) if raw.headers else None)

    async def consumer_info(self, stream: str, durable: str) -> ConsumerInfo:
        try:
            ci = await self._jsx().consumer_info(stream, durable)
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code == ERR_STREAM_NOT_FOUND:
                raise NoStreamError(f"stream {stream!r} does not exist") from exc
            raise ConsumerNotFoundError(f"consumer {durable!r} not found on {stream!r}") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"consumer info {stream}/{durable} failed: {exc}") from exc
        return ConsumerInfo(
            stream=stream,
            durable=durable,
            num_pending=int(ci.num_pending or 0),
            num_ack_pending=int(ci.num_ack_pending or 0),
            num_redelivered=int(ci.num_redelivered or 0),
            filter_subject=ci.config.filter_subject if ci.config else None,
        )

    async def subject_count(self, stream: str, filter_subject: str) -> int:
        try:
            info = await self._jsx().stream_info(stream, subjects_filter=filter_subject)
        except nats.js.errors.NotFoundError as exc:
            raise NoStreamError(f"stream {stream!r} does not exist") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"stream_info {stream} failed: {exc}") from exc
        return sum(int(n) for n in (info.state.subjects or {}).values())

    async def pull_consumer(self, stream: str, config: ConsumerConfig) -> NatsPullConsumer:
        """Create or bind a durable pull consumer.

        Raises:
            NoStreamError: no such stream.
            BusError: e.g. an overlapping filter on a work-queue stream.
        """
        js = self._jsx()
        native = api.ConsumerConfig(
            durable_name=config.durable,
            filter_subject=config.filter_subject,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            ack_wait=config.ack_wait_s,
            max_deliver=config.max_deliver,
            max_ack_pending=config.max_ack_pending,
        )
        try:
            await js.add_consumer(stream, config=native)
            psub = await js.pull_subscribe_bind(config.durable, stream)
        except nats.js.errors.NotFoundError as exc:
            raise NoStreamError(f"stream {stream!r} does not exist") from exc
        except nats.js.errors.APIError as exc:
            if exc.err_code == ERR_STREAM_NOT_FOUND:
                raise NoStreamError(f"stream {stream!r} does not exist") from exc
            raise BusError(f"consumer {config.durable!r} on {stream}: {exc.description}") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"consumer {config.durable!r} on {stream} failed: {exc}") from exc
        return NatsPullConsumer(self._jsx, stream, config.durable, psub)

    async def key_value(self, bucket: str, *, storage: str = "file", replicas: int = 1) -> Any:
        """The JetStream key-value bucket ``bucket`` (nats-py ``KeyValue``), created
        when missing (one revision kept per key).

        Raises:
            BusError: not connected, or the bucket cannot be created or bound.
        """
        js = self._jsx()
        try:
            return await js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            pass
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"key-value bucket {bucket!r}: {exc}") from exc
        try:
            return await js.create_key_value(
                bucket=bucket,
                history=1,
                storage=api.StorageType.FILE if storage == "file" else api.StorageType.MEMORY,
                replicas=replicas,
            )
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"cannot create key-value bucket {bucket!r}: {exc}") from exc

    async def delete_stream(self, name: str) -> None:
        """Remove a stream (tests and operators). Raises: NoStreamError, BusError."""
        try:
            await self._jsx().delete_stream(name)
        except nats.js.errors.NotFoundError as exc:
            raise NoStreamError(f"stream {name!r} does not exist") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"delete_stream {name} failed: {exc}") from exc
