"""Serve an ASGI app with hypercorn on a socket we bind ourselves.

Binding first lets callers learn the real port (``port=0`` in tests) before the
first request, and ``task_status.started(port)`` signals that the listener is
about to serve. Shutdown: set ``shutdown`` → hypercorn stops accepting and waits
up to ``graceful_timeout_s`` seconds for in-flight requests.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import anyio
import anyio.abc
from hypercorn.asyncio import serve
from hypercorn.config import Config
from hypercorn.protocol import ws_stream
from starlette.types import ASGIApp

__all__ = ["bind_socket", "serve_app"]

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


async def serve_app(
    app: ASGIApp,
    host: str,
    port: int,
    shutdown: anyio.Event,
    *,
    name: str = "http",
    graceful_timeout_s: float = 25.0,
    header_timeout_s: float = 15.0,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run until ``shutdown`` is set and in-flight requests drained; reports the port.

    ``header_timeout_s``: a connection that has not sent a whole request line and
    headers this long after it opened or finished its last response is closed
    (hypercorn's idle timer runs until the headers are in; docs/security.md "Limits").
    Request lines and header blocks over 16 KiB are refused by hypercorn (h11).
    """
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the fd from here
    config.graceful_timeout = graceful_timeout_s
    config.accesslog = None
    config.errorlog = logging.getLogger(f"sie.{name}")
    config.keep_alive_timeout = header_timeout_s
    # events a connection may queue for the app (hypercorn's default 10): past it the
    # server stops reading that socket, so a burst of large uploads waiting for their
    # turn (sie.http.limits) buffers 2 chunks each on the loop, not 10
    config.max_app_queue_size = 2
    # no route reads large websocket messages (the status stream ignores them)
    config.websocket_max_message_size = MAX_WEBSOCKET_MESSAGE_BYTES
    log.info("%s listening on http://%s:%d", name, host, bound)
    task_status.started(bound)
    await serve(app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]
