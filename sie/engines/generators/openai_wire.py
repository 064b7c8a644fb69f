"""The OpenAI-compatible wire as an upstream speaks it (``openai_upstream``): server-sent
event lines, error bodies and events, finish reasons and usage, each mapped to SIE's
errors (docs/api.md "Errors"; the mapping is listed in ``openai_upstream``'s docstring).
Pure functions, no I/O."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from sie.core.errors import (
    GatewayTimeout,
    InvalidInput,
    SieError,
    UpstreamError,
    UpstreamUnavailable,
)
from sie.core.trust import parse_upstream_url
from sie.engines.generation import FinishReason

__all__ = [
    "DONE",
    "error_message",
    "event_error",
    "finish_reason",
    "next_line",
    "parse_event",
    "same_origin",
    "status_error",
    "usage_tokens",
]

#: What ``parse_event`` returns for the ``[DONE]`` event.
DONE = object()


def finish_reason(api_root: str, finish: str) -> FinishReason:
    """An upstream ``finish_reason`` as SIE's (``length``, else ``stop``).

    Raises:
        UpstreamError: the upstream ended the request with ``abort`` or ``error``.
    """
    if finish == "length":
        return "length"
    if finish in ("abort", "error"):
        raise UpstreamError(f"upstream {api_root} ended the request with {finish!r}")
    return "stop"  # "stop", and anything else that ends a plain completion


def status_error(api_root: str, status: int, message: str, upstream_model: str) -> SieError:
    """The SIE error for an upstream HTTP ``status`` with ``message``: 400/413/422
    ``InvalidInput``; 408/504 ``GatewayTimeout``; 429/503 ``UpstreamUnavailable``;
    anything else ``UpstreamError`` (401/403 and 404 with a hint)."""
    where = f"upstream {api_root}"
    if status in (400, 413, 422):
        return InvalidInput(f"{where} rejected the request: {message}", upstream_status=status)
    if status in (408, 504):
        return GatewayTimeout(f"{where} timed out ({status}): {message}")
    if status in (429, 503):
        return UpstreamUnavailable(f"{where} is unavailable ({status}): {message}")
    if status in (401, 403):
        message = f"credentials rejected (check api_key): {message}"
    elif status == 404:
        message = f"{message} (upstream_model {upstream_model!r})"
    return UpstreamError(f"{where} answered {status}: {message}", upstream_status=status)


def event_error(api_root: str, event: dict[str, Any], upstream_model: str) -> SieError | None:
    """The SIE error for an error event in the stream (``{"error": {...}}`` or the older
    ``{"object": "error", ...}``), its ``code`` read as an HTTP status; None otherwise."""
    err = event.get("error")
    if isinstance(err, dict):
        message, code = err.get("message"), err.get("code")
    elif event.get("object") == "error":
        message, code = event.get("message"), event.get("code")
    else:
        return None
    try:
        status = int(str(code))
    except ValueError:
        status = 500
    return status_error(api_root, status, str(message or "error event"), upstream_model)


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs have the same scheme, host and port (parsed, not string prefixes)."""
    try:
        pa, pb = parse_upstream_url(a), parse_upstream_url(b)
    except ValueError:
        return False
    return (pa.scheme, pa.host, pa.port) == (pb.scheme, pb.host, pb.port)


async def next_line(lines: AsyncIterator[str]) -> str | None:
    try:
        return await lines.__anext__()
    except StopAsyncIteration:
        return None


def parse_event(line: str) -> Any:
    """A ``data:`` line's JSON, ``DONE``, or None for anything else (comments, other
    fields, blank lines).

    Raises:
        UpstreamError: a data line that is not JSON.
    """
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return DONE
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError as exc:
        raise UpstreamError(f"upstream sent an unreadable event: {data[:200]!r}") from exc


def error_message(raw: bytes) -> str:
    """The message of an OpenAI / vLLM error body (``{"error": {"message"}}``, the older
    ``{"object": "error", "message"}``, FastAPI's ``detail``), else its text."""
    text = raw.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:500] or "no details"
    if isinstance(obj, dict):
        err = obj.get("error")
        for candidate in (
            err.get("message") if isinstance(err, dict) else err,
            obj.get("message"),
            obj.get("detail"),
        ):
            if candidate:
                return str(candidate)[:500]
    return text.strip()[:500]


def usage_tokens(usage: dict[str, Any] | None, counted: int) -> tuple[int | None, int]:
    """``(prompt_tokens, completion_tokens)`` from the upstream's usage; without one the
    prompt is unknown and the completion is the chunks counted."""
    if usage is None:
        return None, counted
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    prompt = p if isinstance(p, int) and not isinstance(p, bool) and p >= 0 else None
    completion = c if isinstance(c, int) and not isinstance(c, bool) and c >= 0 else counted
    return prompt, completion
