"""Abandon a request when its client goes away (docs/architecture.md §2).

A non-streaming route waits for every worker result; if the client closes its
connection meanwhile, nobody will read the answer. ``until_disconnect`` runs the
route's work and cancels it the moment the server reports ``http.disconnect``; the
gateway's cleanup then publishes ``work_cancel`` so workers drop the request's
remaining items wherever they are (not yet pulled, waiting in the batcher, queued for
the engine). Call it only after the body has been read: the next ASGI message is
then the disconnect. The server reports the end of the client's stream, so a client
that half-closes its socket counts as gone, as with nginx.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.requests import Request

__all__ = ["CLIENT_CLOSED_REQUEST", "until_disconnect"]

T = TypeVar("T")

#: The status recorded for a request its client abandoned (nginx's 499 "client closed
#: request"); only a client that half-closed its socket still reads it (docs/api.md §1).
CLIENT_CLOSED_REQUEST = 499


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """``await work()``, or None once the client has disconnected (``work`` cancelled).

    Raises:
        whatever ``work`` raises (unwrapped: not an exception group).
    """
    result: list[T] = []
    error: Exception | None = None

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        try:
            result.append(await work())
        except Exception as exc:  # re-raised below, outside the task group
            error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return result[0] if result else None
