"""Serve an ASGI app with hypercorn on a socket we bind ourselves.

Binding first lets callers learn the real port (``port=0`` in tests) before the
first request, and ``task_status.started(port)`` signals that the listener is
about to serve. Shutdown: set ``shutdown`` → hypercorn stops accepting and waits
up to ``graceful_timeout_s`` seconds for in-flight requests.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, NamedTuple

import anyio
import anyio.abc
import h11
from hypercorn import protocol as protocol_wrapper
from hypercorn.asyncio import serve, tcp_server
from hypercorn.config import Config
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol import h2 as h2_protocol
from hypercorn.protocol import h11 as h11_protocol
from hypercorn.protocol import ws_stream
from hypercorn.protocol.events import Body, EndBody, StreamClosed
from starlette.types import ASGIApp

__all__ = ["ConnectionTimeouts", "bind_socket", "serve_app"]

log = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket (IPv4 or IPv6 by ``host``) with SO_REUSEADDR."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


#: Largest websocket message a client may send (1 MiB; past it: close 1009).
MAX_WEBSOCKET_MESSAGE_BYTES = 1024 * 1024


def _bound_websocket_messages() -> None:
    """Make hypercorn stop buffering a websocket message once it is over the limit.

    hypercorn 0.18 answers a message past ``websocket_max_message_size`` with a close
    (1009) but keeps appending what the client goes on sending to the same buffer, so
    one message that never ends grows the process without bound (found by the hostile
    suite: +1.8 GB in 12 s). Past the limit its buffer now drops the data and refuses
    every later frame of that connection, which is being closed anyway."""
    cls = ws_stream.WebsocketBuffer
    if getattr(cls, "sie_bounded", False):
        return
    extend = cls.extend

    def bounded_extend(self: Any, event: Any) -> None:
        if self.length + len(event.data) > self.max_length:
            self.value = None
            self.length = self.max_length + 1  # stays over: later frames refused too
            raise ws_stream.FrameTooLargeError()
        extend(self, event)

    cls.extend = bounded_extend  # type: ignore[method-assign]
    cls.sie_bounded = True  # type: ignore[attr-defined]


_bound_websocket_messages()


def _has_body_length(headers: Any) -> bool:
    """A ``content-length`` among h11 response headers (the whole body follows at once,
    not a stream whose first bytes may come much later)."""
    return any(name.lower() == b"content-length" for name, _ in headers)


def _coalesce_response_head() -> None:
    """Make hypercorn write a sized HTTP/1.1 response's head and body in one write.

    hypercorn 0.18 writes the status line and headers as soon as the app starts its
    response and the body in a second write: two ``send`` system calls and two TCP
    segments (the client wakes twice) per response. A response with a
    ``content-length`` now keeps its head until the body's first bytes (or the end of
    an empty body) and writes both at once; a streamed response (no length: server-sent
    events, chunked) still sends its head at once. Any other event flushes a held head
    first (docs/performance.md "One write per response")."""
    cls = h11_protocol.H11Protocol
    if getattr(cls, "sie_coalesced", False):
        return
    send_event = cls._send_h11_event
    stream_send = cls.stream_send

    async def coalescing_send_event(self: Any, event: Any) -> None:
        if isinstance(event, h11.Response) and _has_body_length(event.headers):
            try:
                self.sie_head = self.connection.send(event)
            except h11.LocalProtocolError:
                await send_event(self, event)  # hypercorn's own handling of the error
            return
        head = getattr(self, "sie_head", None)
        if head is None or not isinstance(event, h11.Data | h11.EndOfMessage):
            await send_event(self, event)
            return
        self.sie_head = None
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError:
            await self.send(RawData(data=head))
            await send_event(self, event)
            return
        await self.send(RawData(data=head + (data or b"")))

    async def flushing_stream_send(self: Any, event: Any) -> None:
        head = getattr(self, "sie_head", None)
        if head is not None and not isinstance(event, Body | EndBody):
            self.sie_head = None
            await self.send(RawData(data=head))
        await stream_send(self, event)

    cls._send_h11_event = coalescing_send_event  # type: ignore[method-assign]
    cls.stream_send = flushing_stream_send  # type: ignore[method-assign]
    cls.sie_coalesced = True  # type: ignore[attr-defined]


_coalesce_response_head()


class _PeerGone(Exception):
    """Raised to a connection's reader parked on a pipelined request once the
    connection has closed (``_release_paused_readers``)."""


class _ReadGate:
    """hypercorn's per-connection ``can_read`` event, with ``wait`` refusing (raising
    ``_PeerGone``) once ``close`` has been called."""

    def __init__(self, event: Any) -> None:
        self._event = event
        self.closed = False

    async def clear(self) -> None:
        await self._event.clear()

    async def set(self) -> None:
        await self._event.set()

    def is_set(self) -> bool:
        return bool(self._event.is_set())

    async def wait(self) -> None:
        if not self.closed:
            await self._event.wait()
        if self.closed:
            raise _PeerGone

    async def close(self) -> None:
        self.closed = True
        await self._event.set()  # wakes a parked reader: it raises _PeerGone


def _release_paused_readers() -> None:
    """Free a connection whose client left while a pipelined request waited.

    hypercorn 0.18 reads a request pipelined behind one still being answered and parks
    the connection's reader until that answer is sent. If the client has gone by then
    (the answer's write fails), the answer's stream is closed but the reader is never
    woken: it neither reads the end of the connection nor frees it, and the
    connection's buffers, tasks and socket stay for the life of the process (found by
    the hostile trial: 10 pipelined requests then a close, from 8 clients for 10 s,
    kept about 1 GB). The reader now stops at once when the connection closes; it then
    reads the end of the socket and hypercorn frees the connection as after any close.
    The pipelined requests nobody will read are not run (docs/security.md "Limits").

    Likewise hypercorn kept a connection whose client had sent its end (closed, or
    half-closed after its request) until the keep-alive timer fired, 15 s later: a
    client opening and closing connections in a loop held that many descriptors. Now
    the connection closes as soon as the client's end is read with no request in
    progress, or, with one in progress, as soon as its answer is out."""
    cls = h11_protocol.H11Protocol
    if getattr(cls, "sie_releases_readers", False):
        return
    init, handle, stream_send = cls.__init__, cls.handle, cls.stream_send

    def gated_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.can_read = _ReadGate(self.can_read)

    async def releasing_handle(self: Any, event: Any) -> None:
        if isinstance(event, Closed):
            self.sie_peer_closed = True
            idle = self.stream is None
            try:
                await handle(self, event)
            finally:
                await self.can_read.close()
                if idle:  # nothing left to answer: free it now
                    await self.send(Closed())
            return
        try:
            await handle(self, event)
        except _PeerGone:
            pass  # the client left; _read_data reads the socket's end and frees it

    async def closing_stream_send(self: Any, event: Any) -> None:
        await stream_send(self, event)
        if isinstance(event, StreamClosed) and getattr(self, "sie_peer_closed", False):
            await self.send(Closed())  # the answer is out and the client has left

    cls.__init__ = gated_init  # type: ignore[method-assign]
    cls.handle = releasing_handle  # type: ignore[method-assign]
    cls.stream_send = closing_stream_send  # type: ignore[method-assign]
    cls.sie_releases_readers = True  # type: ignore[attr-defined]


_release_paused_readers()


def _time_idle_http2() -> None:
    """Put an HTTP/2 connection that has no stream open under the keep-alive timer.

    hypercorn 0.18 stops a connection's idle timer when HTTP/1.1 parsing sees a request
    line, and the HTTP/2 preface (``PRI * HTTP/2.0``, prior knowledge in cleartext) is
    one: the connection then switches to HTTP/2 and the timer only restarts when a
    stream ends. A client that sent the preface, or a header block it never finished,
    and nothing more kept its connection forever (found by the hostile trial: 60 such
    connections still open after 150 s). The timer now restarts as soon as the switch
    leaves no stream open, so such a connection closes after ``SIE_HTTP_HEADER_TIMEOUT_S``
    like an HTTP/1.1 one (docs/security.md "Limits").

    When an HTTP/2 connection closes, the send buffers of its streams are closed too:
    hypercorn left them open with nobody sending them, so a request whose client left
    before its answer was out (a body never finished, then a close) waited forever
    (the hostile trial: 110 such requests pending until shutdown)."""
    cls = protocol_wrapper.ProtocolWrapper
    if getattr(cls, "sie_times_idle_http2", False):
        return
    handle = cls.handle

    async def timing_handle(self: Any, event: Any) -> None:
        was_h2 = isinstance(self.protocol, h2_protocol.H2Protocol)
        await handle(self, event)
        if not isinstance(self.protocol, h2_protocol.H2Protocol):
            return
        if not was_h2 and self.protocol.idle:
            await self.send(Updated(idle=True))
        if isinstance(event, Closed):
            # hypercorn closes the streams but not their send buffers, and its sender
            # has stopped: an answer still being written (or its end waiting for the
            # buffer to empty) would wait forever, holding the request, its body and
            # often the connection until shutdown. Closed buffers refuse further writes.
            for buffer in list(self.protocol.stream_buffers.values()):
                await buffer.close()

    cls.handle = timing_handle  # type: ignore[method-assign]
    cls.sie_times_idle_http2 = True  # type: ignore[attr-defined]


_time_idle_http2()


#: The slowest a client may take a large answer (bytes/s), beyond the send timeout.
MIN_SEND_BYTES_PER_S = 1 << 20


class ConnectionTimeouts(NamedTuple):
    """A listener's per-connection deadlines (s): ``header_s`` to send a request line and
    headers (and the keep-alive idle limit), ``send_s`` to read an answer once it fills
    the socket's send buffer, plus a second per MiB buffered (docs/security.md "Limits")."""

    header_s: float
    send_s: float


def _bounded_drain(writer: asyncio.StreamWriter, timeout_s: float) -> None:
    """Make ``writer.drain`` abort the connection when the client has not taken what is
    buffered for it within ``timeout_s`` plus a second per ``MIN_SEND_BYTES_PER_S``.

    hypercorn writes an answer and waits for the socket to take it, for as long as the
    client takes: a client that asked for a large answer and never read it held the
    answer's memory for the life of the connection (the hostile trial: 24 such clients of
    4,096-text ``/v1/embeddings`` answers held 2.2 GB for minutes). A drain that has not
    finished in time now aborts the transport, which drops the buffer; hypercorn sees a
    lost connection. A drain with nothing to wait for (the buffer under the transport's
    high-water mark) costs no timer. Closing the connection (which waits for the buffer
    to be taken) is bounded the same way, and a drain or close cancelled by a shutdown
    aborts at once: a shutdown waited its whole drain time for such clients, then
    failed inside hypercorn.
    """
    drain, wait_closed = writer.drain, writer.wait_closed
    transport = writer.transport

    async def taken(wait: Any, *, log_unread: bool) -> bool:
        """``await wait()`` within the time the buffer allows; on running out (False) or
        on being cancelled (a shutdown tearing the connection down), abort the
        connection."""
        allowed = timeout_s + transport.get_write_buffer_size() / MIN_SEND_BYTES_PER_S
        try:
            await asyncio.wait_for(wait(), allowed)
        except TimeoutError:
            if log_unread:
                log.info(
                    "aborted a connection whose client left %d bytes of its answer unread "
                    "for %.0fs",
                    transport.get_write_buffer_size(),
                    allowed,
                )
            transport.abort()
            return False
        except asyncio.CancelledError:
            transport.abort()  # nobody waits for this connection any more
            raise
        return True

    async def bounded_drain() -> None:
        if (
            transport.is_closing()
            or transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]
        ):
            return await drain()  # nothing to wait for: returns at once
        if not await taken(drain, log_unread=True):
            raise ConnectionResetError("the client did not read its answer")

    async def bounded_wait_closed() -> None:
        # closing waits until the client has taken the buffer: bounded the same way
        await taken(wait_closed, log_unread=False)

    writer.drain = bounded_drain  # type: ignore[method-assign]
    writer.wait_closed = bounded_wait_closed  # type: ignore[method-assign]


def _time_sends() -> None:
    """Give every connection's writes the listener's ``send_s`` (``_bounded_drain``)."""
    cls = tcp_server.TCPServer
    if getattr(cls, "sie_times_sends", False):
        return
    init = cls.__init__

    def timed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        timeout_s = getattr(self.config, "sie_send_timeout_s", None)
        if timeout_s is not None:
            _bounded_drain(self.writer, timeout_s)

    cls.__init__ = timed_init  # type: ignore[method-assign]
    cls.sie_times_sends = True  # type: ignore[attr-defined]


_time_sends()


async def serve_app(
    app: ASGIApp,
    host: str,
    port: int,
    shutdown: anyio.Event,
    *,
    name: str = "http",
    graceful_timeout_s: float = 25.0,
    header_timeout_s: float = 15.0,
    send_timeout_s: float = 60.0,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run until ``shutdown`` is set and in-flight requests drained; reports the port.

    ``header_timeout_s``: a connection that has not sent a whole request line and
    headers this long after it opened or finished its last response is closed
    (hypercorn's idle timer runs until the headers are in; docs/security.md "Limits").
    hypercorn (h11) answers 431 and closes when more than 16 KiB of a request line and
    headers is buffered incomplete, or when they do not fit one 64 KiB read
    (docs/security.md "Limits"). ``send_timeout_s``: a connection whose client has not
    taken an answer that filled the socket's send buffer this long after the write, plus
    a second per MiB buffered, is aborted (``_bounded_drain``).
    """
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the fd from here
    config.graceful_timeout = graceful_timeout_s
    config.accesslog = None
    config.errorlog = logging.getLogger(f"sie.{name}")
    config.keep_alive_timeout = header_timeout_s
    config.sie_send_timeout_s = send_timeout_s  # type: ignore[attr-defined]  # _time_sends
    # events a connection may queue for the app (hypercorn's default 10): past it the
    # server stops reading that socket, so a burst of large uploads waiting for their
    # turn (sie.http.limits) buffers 2 chunks each on the loop, not 10
    config.max_app_queue_size = 2
    # no route reads large websocket messages (the status stream ignores them)
    config.websocket_max_message_size = MAX_WEBSOCKET_MESSAGE_BYTES
    log.info("%s listening on http://%s:%d", name, host, bound)
    task_status.started(bound)
    await serve(app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]
