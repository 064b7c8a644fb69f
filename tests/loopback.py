"""A hypercorn config listening on a free loopback port, for test servers (fake
engines, fake metrics endpoints): the port is bound before the server starts, so
its URL is known at once and no other process can take it meanwhile."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

from hypercorn.config import Config

__all__ = ["loopback_config"]


@contextlib.contextmanager
def loopback_config(graceful_timeout_s: float = 0.2) -> Iterator[tuple[Config, str]]:
    """``(config, base_url)``: serve with ``config``; ``base_url`` is
    ``http://127.0.0.1:{port}``. The listening socket closes on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        config = Config()
        config.bind = [f"fd://{os.dup(sock.fileno())}"]  # hypercorn owns (and closes) the dup
        config.accesslog = None
        config.errorlog = None
        config.graceful_timeout = graceful_timeout_s
        yield config, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
