"""Process-wide request limits for every HTTP listener (docs/security.md "Limits").

``BodyBudget`` is the number of request-body bytes the whole process holds at once
(``SIE_MAX_INFLIGHT_BODY_BYTES``), shared by the gateway and the config listener.
``RequestLimits`` (ASGI middleware) charges each request's body to it for the whole
life of the request — the decoded payload and the work built from it live that long —
and gives the body a deadline (``SIE_HTTP_BODY_TIMEOUT_S``):

- a declared ``Content-Length`` that does not fit now answers 503
  ``RESOURCE_EXHAUSTED`` (Retry-After 5) before a byte is read;
- bytes are charged as they arrive (a slow sender holds only what it sent); the
  chunk that does not fit fails the read with the same 503;
- a body still incomplete at the deadline fails the read with 408 ``REQUEST_TIMEOUT``;
- once a body passes ``LARGE_BODY_BYTES``, the rest of it is read only while it holds
  one of ``large_body_reads`` slots (``SIE_MAX_LARGE_BODY_READS``): the event loop
  copies and parses every byte that arrives, and a burst of large uploads read all
  at once would keep probes, heartbeats and small requests waiting for seconds.
  Waiting bodies are not read: the server stops reading their sockets and TCP holds
  the senders back. Small bodies never wait. A body keeps its slot only while it
  arrives at ``LARGE_BODY_MIN_BYTES_PER_WINDOW`` a window or more: a slower sender
  (which costs the loop little) gives the slot up at the window's end and queues for
  one again, so four trickling senders cannot hold every large upload back until
  their deadline.

A request that carries both ``Transfer-Encoding`` and ``Content-Length`` (its body's
end is ambiguous: the shape of request smuggling behind a proxy that reads the other
header) is answered 400 ``INVALID_INPUT`` (field ``content-length``) with
``Connection: close``; its connection ends after the answer, once the body has been
drained as for any early answer (below), and nothing after it is read.

A request answered before its body was read (413, 415, this 503) gets its answer at
once, but the answer's end is held while the rest of the body is read and dropped (up
to ``DRAIN_BYTES``, within the deadline, under a large-body slot when large): the server closes a connection once an
answer ends, and closing a socket with unread data resets it, which would cost a
client that is still sending the answer. The request-line/header deadline is the HTTP
server's (``sie.http.server``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import time
from collections.abc import Callable

import anyio
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sie.core.errors import (
    InvalidInput,
    PayloadTooLarge,
    RequestTimeout,
    ResourceExhausted,
    SieError,
)

__all__ = [
    "DRAIN_BYTES",
    "LARGE_BODY_BYTES",
    "LARGE_BODY_MIN_BYTES_PER_WINDOW",
    "LARGE_BODY_WINDOW_S",
    "BodyBudget",
    "RequestLimits",
]

#: Most bytes of an unread body read and dropped after an early answer (beyond it the
#: connection is closed).
DRAIN_BYTES = 4 * 1024 * 1024
#: A body past this many bytes reads the rest under a large-body slot.
LARGE_BODY_BYTES = 1024 * 1024
#: A large body keeps its slot only while at least ``LARGE_BODY_MIN_BYTES_PER_WINDOW``
#: bytes arrive in each ``LARGE_BODY_WINDOW_S`` (1 MiB/s: holding all four slots costs
#: a sender 32 Mbit/s); a slower sender gives the slot up at the window's end and
#: queues for one again (it is still read, between faster bodies).
LARGE_BODY_WINDOW_S = 1.0
LARGE_BODY_MIN_BYTES_PER_WINDOW = 1024 * 1024
#: After a request whose body held this many bytes, free heap pages go back to the OS.
TRIM_AFTER_BYTES = 64 * 1024 * 1024


class BodyBudget:
    """Bytes of request bodies held by the process, against ``limit_bytes``.

    Used from one event loop only (no lock). ``in_flight_bytes`` never exceeds
    ``limit_bytes`` (so a body larger than the whole budget is always refused).
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.in_flight_bytes = 0
        self.refused = 0

    def fits(self, n: int) -> bool:
        """Whether ``n`` more bytes fit now."""
        return self.in_flight_bytes + n <= self.limit_bytes

    def try_take(self, n: int) -> bool:
        """Take ``n`` bytes if they fit; False (and nothing taken) otherwise."""
        if not self.fits(n):
            self.refused += 1
            return False
        self.in_flight_bytes += n
        return True

    def give_back(self, n: int) -> None:
        self.in_flight_bytes -= n

    def exhausted(self) -> ResourceExhausted:
        return ResourceExhausted(
            f"the server holds {self.in_flight_bytes} bytes of request bodies (limit "
            f"{self.limit_bytes}); retry later",
            field="body",
        )


class RequestLimits:
    """Charges bodies to ``budget`` and bounds how long a body may take to arrive.

    Args:
        budget: the process-wide budget (one per process, shared by listeners).
        body_timeout_s: seconds from the first read of the body to its last byte.
        respond: renders a refusal before the app runs (the listener's envelope).
        large_body_reads: large bodies read at once by this listener.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        budget: BodyBudget,
        body_timeout_s: float,
        respond: Callable[[Scope, SieError], Response],
        large_body_reads: int = 4,
    ) -> None:
        self.app = app
        self.budget = budget
        self.body_timeout_s = body_timeout_s
        self.respond = respond
        self.large_body_reads = large_body_reads
        self._large: anyio.CapacityLimiter | None = None  # made on first use, in the loop

    def _large_slots(self) -> anyio.CapacityLimiter:
        if self._large is None:
            self._large = anyio.CapacityLimiter(self.large_body_reads)
        return self._large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, chunked, conflict = _framing(scope)
        budget = self.budget
        held = 0
        body_done = timed_out = end_held = large = gone = False
        deadline: float | None = None
        has_body = bool(declared) or chunked
        slot = object()  # this request's token in the large-body slots

        window_end = 0.0  # while ``large``: the end of the slot's current window
        window_start_bytes = 0  # ``held`` when that window began

        async def limited_receive() -> Message:
            nonlocal held, body_done, deadline, timed_out, large, gone
            nonlocal window_end, window_start_bytes
            if body_done:
                return await receive()  # after the body: only http.disconnect is left
            if deadline is None:
                deadline = time.monotonic() + self.body_timeout_s
            while True:
                now = time.monotonic()
                if large and now >= window_end:
                    if held - window_start_bytes < LARGE_BODY_MIN_BYTES_PER_WINDOW:
                        # a slow sender costs the loop little: it gives its slot to the
                        # next large body and waits for one again (FIFO) before reading on
                        large = False
                        self._large_slots().release_on_behalf_of(slot)
                    else:
                        window_end, window_start_bytes = now + LARGE_BODY_WINDOW_S, held
                with anyio.move_on_after(max(deadline - now, 0.0)) as scope_:
                    if not large and held >= LARGE_BODY_BYTES:
                        await self._large_slots().acquire_on_behalf_of(slot)
                        large = True
                        window_end = time.monotonic() + LARGE_BODY_WINDOW_S
                        window_start_bytes = held
                    window_ended = False
                    if large:
                        with anyio.move_on_after(max(window_end - time.monotonic(), 0.0)) as w:
                            message = await receive()
                        window_ended = w.cancelled_caught
                    else:  # the common case: no second cancel scope per message
                        message = await receive()
                if scope_.cancelled_caught:
                    timed_out = True
                    raise RequestTimeout(
                        f"the request body did not arrive within {self.body_timeout_s:g}s",
                        field="body",
                    )
                if not window_ended:
                    break  # else the window ended first: look at the sender's rate
            if message["type"] == "http.request":
                n = len(message.get("body", b""))
                if not budget.try_take(n):
                    raise budget.exhausted()
                held += n
                body_done = not message.get("more_body", False)
            else:
                gone = message["type"] == "http.disconnect"
            if large and (body_done or message["type"] != "http.request"):
                large = False
                self._large_slots().release_on_behalf_of(slot)
            return message

        async def holding_send(message: Message) -> None:
            nonlocal end_held
            early = has_body and not body_done
            if early and message["type"] == "http.response.body" and not message.get("more_body"):
                end_held = True
                message = {**message, "more_body": True}
            await send(message)

        try:
            if conflict:
                refusal = self.respond(scope, _conflicting_framing())
                refusal.headers["connection"] = "close"  # what follows cannot be trusted
                await refusal(scope, receive, holding_send)  # the body is drained as below
            elif declared and declared > budget.limit_bytes:  # could never fit: no retry
                await self.respond(scope, _too_large(declared, budget.limit_bytes))(
                    scope, receive, holding_send
                )
            elif declared and not budget.fits(declared):
                budget.refused += 1
                await self.respond(scope, budget.exhausted())(scope, receive, holding_send)
            else:
                await self.app(scope, limited_receive, holding_send)
        finally:
            budget.give_back(held)
            if large:
                self._large_slots().release_on_behalf_of(slot)
            if held >= TRIM_AFTER_BYTES:
                await _give_memory_back()
        if end_held:
            # a sender that slow is not waited for again, nor one that has left (no
            # more messages come: the drain would wait its whole bound)
            if not timed_out and not gone:
                await self._drain(receive, declared, received=held)
            await _end_response(receive, send)

    async def _drain(self, receive: Receive, declared: int | None, received: int) -> None:
        """Read and drop what is left of a body answered early (bounded in bytes and
        time; nothing is kept)."""
        if declared is not None and declared - received > DRAIN_BYTES:
            return  # too much to read for nothing: the server closes the connection
        dropped = 0
        large = declared is None or declared - received > LARGE_BODY_BYTES
        with anyio.move_on_after(min(self.body_timeout_s, 5.0)):
            async with self._large_slots() if large else _NO_SLOT:
                while dropped <= DRAIN_BYTES:
                    message = await receive()
                    if message["type"] != "http.request":
                        return
                    dropped += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return


def _conflicting_framing() -> InvalidInput:
    return InvalidInput(
        "a request may carry Transfer-Encoding or Content-Length, not both",
        field="content-length",
    )


def _too_large(declared: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body of {declared} bytes exceeds the {limit} bytes this server "
        "holds for all request bodies at once",
        field="body",
    )


async def _end_response(receive: Receive, send: Send) -> None:
    """Send the held end of a response while dropping whatever the server still
    queues for the request. Hypercorn closes the request's stream inside that send and
    queues ``http.disconnect`` behind the unread body chunks on a queue of
    ``max_app_queue_size`` events: with the queue full and nobody reading, the send
    (and with it the connection) would wait forever."""

    async def discard() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(discard)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        tg.cancel_scope.cancel()


_NO_SLOT = contextlib.nullcontext()
_trimming = False


async def _give_memory_back() -> None:
    """``malloc_trim(0)`` on a thread (glibc only; one at a time): the heap pages a
    large body and its decoded payload used are returned to the OS instead of staying
    with the process (docs/security.md "Limits")."""
    global _trimming
    trim = _malloc_trim()
    if trim is None or _trimming:
        return
    _trimming = True
    try:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(trim, 0)
    finally:
        _trimming = False


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def _framing(scope: Scope) -> tuple[int | None, bool, bool]:
    """One walk over the headers: the declared ``Content-Length`` (None when absent or
    not a plain number), whether a ``Transfer-Encoding`` is present, and whether both
    are (the body's end is ambiguous, the classic request-smuggling shape: refused and
    the connection closed, RFC 9112 §6.3)."""
    declared: int | None = None
    has_length = chunked = False
    for k, v in scope.get("headers", ()):
        if k == b"content-length":
            if not has_length:
                declared = int(v) if v.isdigit() and len(v) < 19 else None
            has_length = True
        elif k == b"transfer-encoding":
            chunked = True
    return declared, chunked, has_length and chunked
