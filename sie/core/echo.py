"""Echo bounds (docs/security.md "Limits"): an error never echoes more than a bounded
part of what the client sent. ``echo`` shortens one client value (an id, a path);
``bound_message`` a whole message (head and tail kept, the middle elided).
``sie.core.errors`` applies both to every error, whoever built it."""

from __future__ import annotations

__all__ = ["MAX_ECHO_CHARS", "MAX_MESSAGE_CHARS", "bound_message", "echo"]

#: Most characters of one client-supplied value (an id, a path) an error echoes. Every
#: valid model id (128) and ``model:profile`` id (193) fits unshortened.
MAX_ECHO_CHARS = 200
#: Most characters of an error message; longer ones keep their head and tail.
MAX_MESSAGE_CHARS = 2000


def echo(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """``value`` as text of at most about ``limit`` characters, for error messages.

    A longer value keeps its first ``limit`` characters and says how long it was:
    ``echo("a" * 10_000)`` is ``"aaa…(10000 chars)"`` with 200 ``a``. Use it where a
    message interpolates something the client sent (``f"model {echo(m)!r} not found"``).
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…({len(text)} chars)"


def bound_message(message: str) -> str:
    """``message`` cut to about ``MAX_MESSAGE_CHARS`` characters (head and tail kept)."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    head, tail = MAX_MESSAGE_CHARS * 3 // 4, MAX_MESSAGE_CHARS // 4
    elided = len(message) - head - tail
    return f"{message[:head]}…({elided} chars elided)…{message[-tail:]}"
