"""Server-sent events of the streaming generation routes (docs/api.md §5), read
line by line: ``data: {json}`` per chunk, ``: keep-alive`` comments while a request
is parked, ``data: [DONE]`` at the end, and ``event: error`` when the generation
failed after the stream started.
"""

from __future__ import annotations

import json
from typing import Any

from sie.client.errors import ServerError, error_from_response

__all__ = ["DONE", "SSEReader"]

#: Returned by ``SSEReader.feed`` once ``data: [DONE]`` arrived.
DONE = object()


class SSEReader:
    """Feed it lines (without their newline); ``feed`` returns the chunk a completed
    event carries, ``DONE``, or None (no complete event yet).

    Raises (from ``feed``):
        SIEError: an ``error`` event (from its OpenAI error object).
    """

    def __init__(self) -> None:
        self.event: str | None = None
        self.data: list[str] = []
        #: True once ``data: [DONE]`` arrived (set by ``chunks``).
        self.done = False

    def chunks(self, line: str) -> list[Any]:
        """The chunk ``line`` completes, as a list (empty when none); sets ``done``
        at ``[DONE]``. Both clients' stream loops read through this."""
        got = self.feed(line)
        if got is DONE:
            self.done = True
            return []
        return [] if got is None else [got]

    def rest(self) -> list[Any]:
        """The end of the stream: the event still buffered (not ``[DONE]``), if any."""
        last = self.close()
        return [] if last is None or last is DONE else [last]

    def feed(self, line: str) -> Any:
        if line.startswith(":"):
            return None  # a comment: keep-alive
        if line == "":
            return self._dispatch()
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self.data.append(value)
        elif name == "event":
            self.event = value
        return None

    def _dispatch(self) -> Any:
        if not self.data:
            self.event = None
            return None
        data, event = "\n".join(self.data), self.event
        self.data, self.event = [], None
        if data == "[DONE]":
            return DONE
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise ServerError(f"malformed stream chunk: {data[:200]!r}") from exc
        if event == "error" or (isinstance(obj, dict) and "error" in obj and "choices" not in obj):
            err = obj.get("error") if isinstance(obj, dict) else None
            code = err.get("code") if isinstance(err, dict) else None
            status = 503 if code in ("worker_lost", "resource_exhausted") else 500
            raise error_from_response(status, {}, data.encode())
        return obj

    def close(self) -> Any:
        """The end of the stream: an event still buffered, else None."""
        return self._dispatch()
