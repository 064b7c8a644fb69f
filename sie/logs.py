"""Server logging (docs/observability.md "Logs"): text lines, or with ``SIE_LOG_JSON``
one JSON object per line (``timestamp``, ``level``, ``logger``, ``message`` and any
fields the line carries, e.g. the access line's ``request_id`` and ``trace_id``),
through ``python-json-logger``. Libraries that log every request (httpx) are kept at
WARNING."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

__all__ = ["configure_logging"]

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
    # httpx logs every request at INFO: the config poller would write a line per poll
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
