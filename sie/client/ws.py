"""A small websocket client for ``watch()`` (the gateway's ``/ws/cluster-status``,
docs/api.md §13), on ``wsproto`` (already a dependency of the server's HTTP stack):
a blocking socket for ``SIEClient``, anyio streams for ``SIEAsyncClient``.

Each text message is one JSON document. A refused handshake raises the SDK error of
its HTTP answer (401 ``UNAUTHORIZED``...). No message for ``idle_s`` seconds (the
gateway sends one at least every 15 s) raises ``SIEConnectionError``.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from sie.client.errors import SIEConnectionError, error_from_response

__all__ = ["aiter_messages", "iter_messages"]

RECV_BYTES = 65536


class _Session:
    """The protocol state of one connection: bytes in, (bytes out, messages) back."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "wss"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.conn = WSConnection(ConnectionType.CLIENT)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        extra = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self.hello = self.conn.send(Request(host=parts.netloc, target=target, extra_headers=extra))
        self.text: list[str] = []
        self.closed = False
        self.reject: tuple[int, dict[str, str], bytearray] | None = None

    def receive(self, data: bytes) -> tuple[bytes, list[Any]]:
        """Feed what the socket read (``b""`` at its end)."""
        self.conn.receive_data(data or None)
        out = bytearray()
        messages: list[Any] = []
        for event in self.conn.events():
            if isinstance(event, AcceptConnection):
                continue
            if isinstance(event, RejectConnection):
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
                self.reject = (event.status_code, headers, bytearray())
                if not event.has_body:
                    self._raise_reject()
            elif isinstance(event, RejectData):
                assert self.reject is not None
                self.reject[2].extend(event.data)
                if event.body_finished:
                    self._raise_reject()
            elif isinstance(event, TextMessage):
                self.text.append(event.data)
                if event.message_finished:
                    messages.append(json.loads("".join(self.text)))
                    self.text = []
            elif isinstance(event, Ping):
                out += self.conn.send(event.response())
            elif isinstance(event, CloseConnection):
                if self.conn.state is not ConnectionState.CLOSED:
                    out += self.conn.send(event.response())
                self.closed = True
        if not data and not self.closed:
            if self.reject is not None:
                self._raise_reject()
            raise SIEConnectionError("the websocket closed without a close frame")
        return bytes(out), messages

    def _raise_reject(self) -> None:
        assert self.reject is not None
        status, headers, body = self.reject
        raise error_from_response(status, headers, bytes(body))

    def goodbye(self) -> bytes:
        if self.conn.state is ConnectionState.OPEN:
            return self.conn.send(CloseConnection(code=1000))
        return b""


def iter_messages(url: str, headers: Mapping[str, str], idle_s: float) -> Iterator[Any]:
    """Messages of the websocket at ``url`` (``ws://`` or ``wss://``), blocking.

    Raises:
        SIEConnectionError: cannot connect, idle past ``idle_s``, or an abrupt close.
        StatusError: the handshake was refused (e.g. 401).
    """
    session = _Session(url, headers)
    try:
        sock = socket.create_connection((session.host, session.port), timeout=idle_s)
    except OSError as exc:
        raise SIEConnectionError(f"watch: cannot connect to {url}: {exc}") from exc
    try:
        if session.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=session.host)
        sock.sendall(session.hello)
        while not session.closed:
            try:
                data = sock.recv(RECV_BYTES)
            except TimeoutError as exc:
                raise SIEConnectionError(f"watch: no message in {idle_s:g} s") from exc
            except OSError as exc:
                raise SIEConnectionError(f"watch: connection failed: {exc}") from exc
            out, messages = session.receive(data)
            if out:
                sock.sendall(out)
            yield from messages
    finally:
        try:
            bye = session.goodbye()
            if bye:
                sock.sendall(bye)
        except OSError:
            pass
        sock.close()


async def aiter_messages(url: str, headers: Mapping[str, str], idle_s: float) -> AsyncIterator[Any]:
    """``iter_messages`` on anyio streams (asyncio or trio)."""
    session = _Session(url, headers)
    try:
        if session.tls:
            stream: Any = await anyio.connect_tcp(
                session.host, session.port, tls=True, tls_hostname=session.host
            )
        else:
            stream = await anyio.connect_tcp(session.host, session.port)
    except OSError as exc:
        raise SIEConnectionError(f"watch: cannot connect to {url}: {exc}") from exc
    try:
        await stream.send(session.hello)
        while not session.closed:
            try:
                with anyio.fail_after(idle_s):
                    data = await stream.receive(RECV_BYTES)
            except TimeoutError as exc:
                raise SIEConnectionError(f"watch: no message in {idle_s:g} s") from exc
            except anyio.EndOfStream:
                data = b""
            except (OSError, anyio.BrokenResourceError) as exc:
                raise SIEConnectionError(f"watch: connection failed: {exc}") from exc
            out, messages = session.receive(data)
            if out:
                await stream.send(out)
            for message in messages:
                yield message
    finally:
        with anyio.CancelScope(shield=True):
            try:
                bye = session.goodbye()
                if bye:
                    await stream.send(bye)
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            await stream.aclose()
