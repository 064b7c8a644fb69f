"""Server logging (docs/observability.md "Logs"): text lines, or with ``SIE_LOG_JSON``
one JSON object per line (``timestamp``, ``level``, ``logger``, ``message`` and any
fields the line carries, e.g. the access line's ``request_id`` and ``trace_id``),
through ``python-json-logger``. Libraries that log every request (httpx) are kept at
WARNING. asyncio's "socket.send() raised exception." (one line per write to a
connection its client has left) is written at most once a minute, with the count of
the lines dropped since (``Throttle``): a client that pipelines requests and leaves
would otherwise write a line per answer (docs/security.md "Requests"). Python 3.11's
traceback per connection a shutdown cancels is dropped
(``DropCancelledConnectionCallbacks``)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time

from pythonjsonlogger.json import JsonFormatter

__all__ = [
    "CONNECTION_LOST_WRITE",
    "DropCancelledConnectionCallbacks",
    "Throttle",
    "configure_logging",
]

#: What asyncio logs (WARNING) for each write to a connection already lost.
CONNECTION_LOST_WRITE = "socket.send() raised exception."


class Throttle(logging.Filter):
    """Lets ``message`` through at most once per ``every_s`` seconds; the line that
    passes says how many were dropped since the last one. Other lines pass."""

    def __init__(self, message: str, every_s: float = 60.0) -> None:
        super().__init__()
        self.message = message
        self.every_s = every_s
        self.dropped = 0
        self._last: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.message:
            return True
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every_s:
            self.dropped += 1
            return False
        if self.dropped:
            record.msg = f"{self.message} ({self.dropped} more since the last one)"
            record.args = ()
        self._last = now
        self.dropped = 0
        return True


class DropCancelledConnectionCallbacks(logging.Filter):
    """Drops asyncio's ERROR "Exception in callback StreamReaderProtocol.connection_made
    .<locals>.callback" when the exception is a ``CancelledError``: Python 3.11's stream
    server asks a connection task cancelled by a shutdown for its exception, which
    raises, and asyncio logs a traceback per open connection (fixed in 3.12). Other
    lines pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0] if record.exc_info else None
        return not (
            exc is not None
            and issubclass(exc, asyncio.CancelledError)
            and "StreamReaderProtocol.connection_made" in record.getMessage()
        )


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str, json_lines: bool = False) -> None:
    """Configure the root logger on stderr (replacing handlers set before)."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "timestamp", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    lost = logging.getLogger("asyncio")
    lost.filters[:] = [
        f for f in lost.filters if not isinstance(f, (Throttle, DropCancelledConnectionCallbacks))
    ]
    lost.addFilter(Throttle(CONNECTION_LOST_WRITE))
    lost.addFilter(DropCancelledConnectionCallbacks())
    # httpx logs every request at INFO: the config poller would write a line per poll
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
