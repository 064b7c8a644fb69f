"""A request's work items as msgpack, built without blocking the event loop for long:
items after the first are copies of its map that differ in id, index and ``item``
(docs/security.md "Liveness")."""

from __future__ import annotations

from typing import Any

import anyio.lowlevel

from sie.core.errors import InvalidInput, WireError
from sie.core.wire import WorkItem, packb

__all__ = ["YIELD_EVERY", "encode_item", "encode_map", "encode_work"]

#: Work items a request builds or publishes between two yields to the event loop, so
#: a 4096-item request never holds it for long (docs/security.md "Liveness").
YIELD_EVERY = 128


async def encode_work(first: WorkItem, works: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """``(work_item_id, msgpack)`` for ``first`` and one per further ``works`` entry
    (its ``item`` replacing the first one's), yielding every ``YIELD_EVERY`` items.

    Raises:
        InvalidInput: a value msgpack cannot carry, naming its field.
    """
    request_id = first.request_id
    n = len(works)
    work = [(first.work_item_id, encode_item(first))]
    base = first.to_map()
    for i in range(1, n):
        # the items of a request differ only in id, index and item: copy the
        # first one's map (a WorkItem per item costs several times more)
        m = dict(base)
        m["work_item_id"] = wid = f"{request_id}.{i}"
        m["item_index"] = i
        if (item := works[i].get("item")) is not None:
            m["item"] = item
        work.append((wid, encode_map(m, i)))
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await anyio.lowlevel.checkpoint()  # probes and heartbeats go first
    return work


def encode_map(m: dict[str, Any], index: int) -> bytes:
    """A further work item's map (``encode_work``) as msgpack.

    Raises:
        InvalidInput: the item holds a value msgpack cannot carry (``items[i]``).
    """
    try:
        return packb(m)
    except WireError as exc:
        where = f"items[{index}]"
        raise InvalidInput(f"{where}: cannot be forwarded: {exc.message}", field=where) from exc


def encode_item(wi: WorkItem) -> bytes:
    """The work item as msgpack.

    Raises:
        InvalidInput: a request value msgpack cannot carry (e.g. a 65-bit integer or
            a lone surrogate), naming the request field it came from.
    """
    try:
        return wi.to_bytes()
    except WireError as exc:
        field = "options"
        for name in ("options", "output_schema", "labels", "instruction"):
            try:
                packb(getattr(wi, name))
            except WireError:
                field = name
                break
        # score requests have no params wrapper (docs/api.md §3)
        where = field if wi.operation == "score" else f"params.{field}"
        raise InvalidInput(f"{where}: cannot be forwarded: {exc.message}", field=where) from exc
