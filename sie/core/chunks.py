"""``result_chunk_v1``: a work result too large for one bus message, sent in pieces
(docs/api.md §12, architecture §8.4 and §16.2 step 4).

A worker whose encoded ``WorkResult`` does not fit the bus's ``max_payload`` splits the
bytes into at most ``MAX_CHUNKS`` envelopes, when the work item said
``accepts_result_chunks``. Each envelope is a msgpack map::

    {"kind": "result_chunk_v1", "request_id": str, "work_item_id": str,
     "item_index": int, "digest": "<64 lowercase hex: SHA-256 of the whole>",
     "total_bytes": int, "chunk_index": int, "chunk_count": int, "data": bytes}

The gateway puts them back together with ``Reassembly`` (one per request), in any order,
tolerating byte-identical duplicates; anything else that does not fit fails the
request closed (``ChunkError`` → 503 ``TRANSPORT_FAILURE``). Memory is reserved before
a transfer keeps any bytes: three times the item's ``total_bytes`` plus 4 KiB, against
a per-request and a process-wide ``ChunkBudget``.

Pure logic: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CHUNK_KIND",
    "ITEM_OVERHEAD_BYTES",
    "MAX_CHUNKS",
    "MAX_ITEM_BYTES",
    "PROCESS_BUDGET_BYTES",
    "REQUEST_BUDGET_BYTES",
    "ChunkBudget",
    "ChunkError",
    "Reassembly",
    "is_chunk",
    "split_result",
]

CHUNK_KIND = "result_chunk_v1"
#: Most envelopes one item's result may take.
MAX_CHUNKS = 64
#: Largest encoded ``WorkResult`` one item may send in chunks (16 MiB).
MAX_ITEM_BYTES = 16 * 1024 * 1024
#: Reservations of one request, and of the whole gateway process.
REQUEST_BUDGET_BYTES = 64 * 1024 * 1024
PROCESS_BUDGET_BYTES = 256 * 1024 * 1024
#: Bookkeeping headroom reserved per chunked item besides three times its bytes.
ITEM_OVERHEAD_BYTES = 4096
#: Abandoned (digest, chunk_count) layouts remembered per item, so late fragments of
#: an earlier attempt are ignored rather than mixed into the current one.
_TOMBSTONES = 8
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ChunkError(Exception):
    """An invalid transfer. ``reason`` is a short stable tag (for metrics and logs);
    the message never reaches the client (the request fails with a static text)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def is_chunk(message: Any) -> bool:
    """Whether a decoded inbox message claims to be a ``result_chunk_v1`` envelope
    (exactly that ``kind``; other maps are ordinary ``WorkResult``s)."""
    return isinstance(message, dict) and message.get("kind") == CHUNK_KIND


def split_result(
    data: bytes, *, request_id: str, work_item_id: str, item_index: int, max_chunk_bytes: int
) -> list[dict[str, Any]]:
    """Envelopes carrying ``data`` (an encoded ``WorkResult``) in pieces of at most
    ``max_chunk_bytes`` bytes each.

    Raises:
        ChunkError: ``data`` is over ``MAX_ITEM_BYTES`` or needs more than
            ``MAX_CHUNKS`` pieces (reason ``too_large``).
    """
    if max_chunk_bytes <= 0:
        raise ValueError("max_chunk_bytes must be positive")
    total = len(data)
    count = max(1, -(-total // max_chunk_bytes))
    if total > MAX_ITEM_BYTES or count > MAX_CHUNKS:
        raise ChunkError(
            "too_large",
            f"result of {total} bytes needs {count} chunks of {max_chunk_bytes} bytes "
            f"(at most {MAX_CHUNKS} chunks and {MAX_ITEM_BYTES} bytes per item)",
        )
    digest = hashlib.sha256(data).hexdigest()
    view = memoryview(data)
    return [
        {
            "kind": CHUNK_KIND,
            "request_id": request_id,
            "work_item_id": work_item_id,
            "item_index": item_index,
            "digest": digest,
            "total_bytes": total,
            "chunk_index": i,
            "chunk_count": count,
            "data": bytes(view[i * max_chunk_bytes : (i + 1) * max_chunk_bytes]),
        }
        for i in range(count)
    ]


class ChunkBudget:
    """Bytes reserved by chunk transfers in this process (``PROCESS_BUDGET_BYTES``)."""

    def __init__(self, limit_bytes: int = PROCESS_BUDGET_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self.reserved_bytes = 0

    def try_reserve(self, n: int) -> bool:
        if self.reserved_bytes + n > self.limit_bytes:
            return False
        self.reserved_bytes += n
        return True

    def release(self, n: int) -> None:
        self.reserved_bytes = max(0, self.reserved_bytes - n)


@dataclass(slots=True)
class _Transfer:
    work_item_id: str
    digest: str
    total_bytes: int
    chunk_count: int
    parts: dict[int, bytes] = field(default_factory=dict)
    size: int = 0


@dataclass(slots=True)
class _Item:
    reserved: int = 0
    transfer: _Transfer | None = None
    done: bool = False
    tombstones: OrderedDict[tuple[str, int], None] = field(default_factory=OrderedDict)


def _int(m: dict[str, Any], key: str) -> int:
    v = m.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ChunkError("malformed", f"chunk envelope field {key!r} is not an integer")
    return v


def _str(m: dict[str, Any], key: str) -> str:
    v = m.get(key)
    if not isinstance(v, str):
        raise ChunkError("malformed", f"chunk envelope field {key!r} is not a string")
    return v


@dataclass(frozen=True, slots=True)
class _Envelope:
    work_item_id: str
    item_index: int
    digest: str
    total_bytes: int
    chunk_index: int
    chunk_count: int
    data: bytes


def _envelope(m: dict[str, Any], request_id: str, total_items: int) -> _Envelope:
    """The typed fields of an envelope, checked.

    Raises:
        ChunkError: a field missing or of the wrong type, or an identity or layout
            out of range (reason ``malformed``, ``identity`` or ``too_large``).
    """
    rid, digest = _str(m, "request_id"), _str(m, "digest")
    e = _Envelope(
        _str(m, "work_item_id"),
        _int(m, "item_index"),
        digest,
        _int(m, "total_bytes"),
        _int(m, "chunk_index"),
        _int(m, "chunk_count"),
        m.get("data"),  # type: ignore[arg-type]  # checked below
    )
    if not isinstance(e.data, bytes):
        raise ChunkError("malformed", "chunk envelope field 'data' is not bytes")
    if rid != request_id or not 0 <= e.item_index < total_items:
        raise ChunkError("identity", "chunk names another request or an item out of range")
    if not _HEX64.fullmatch(digest):
        raise ChunkError("malformed", "chunk digest is not 64 lowercase hex digits")
    if not 1 <= e.chunk_count <= MAX_CHUNKS or not 1 <= e.total_bytes <= MAX_ITEM_BYTES:
        raise ChunkError(
            "too_large", f"chunk layout {e.chunk_count} / {e.total_bytes} bytes over the limits"
        )
    n = len(e.data)
    if not 0 <= e.chunk_index < e.chunk_count or n > e.total_bytes or n == 0:
        raise ChunkError("malformed", "chunk index or length out of range")
    return e


class Reassembly:
    """The chunked results of one request of ``total_items`` items.

    ``add`` takes one decoded envelope and returns the whole encoded ``WorkResult``
    once its item is complete (None until then, and for an ignored fragment).
    ``close`` releases every reservation; call it when the request ends, however.
    ``reserved_bytes`` is this request's share of ``budget``.
    """

    def __init__(
        self,
        request_id: str,
        total_items: int,
        budget: ChunkBudget,
        request_limit_bytes: int = REQUEST_BUDGET_BYTES,
    ) -> None:
        self.request_id = request_id
        self.total_items = total_items
        self.budget = budget
        self.request_limit_bytes = request_limit_bytes
        self.reserved_bytes = 0
        self._items: dict[int, _Item] = {}

    def add(self, envelope: dict[str, Any]) -> bytes | None:
        """Raises:
        ChunkError: an invalid or conflicting envelope, a bad length or digest, or
            no memory left in the request's or the process's budget (reason
            ``request_budget`` / ``global_budget``).
        """
        e = _envelope(envelope, self.request_id, self.total_items)
        wid, idx, digest, total = e.work_item_id, e.item_index, e.digest, e.total_bytes
        ci, cc, data = e.chunk_index, e.chunk_count, e.data
        item = self._items.setdefault(idx, _Item())
        if item.done:
            return None  # a redelivered item's chunks after it completed
        t = item.transfer
        if t is None or (digest, cc) != (t.digest, t.chunk_count):
            if (digest, cc) in item.tombstones:
                return None  # a late fragment of an abandoned attempt
            if ci != 0 and t is not None:
                return None  # an unknown retry's fragment: only chunk zero restarts
            if t is not None:  # chunk zero of a new attempt replaces the old one
                item.tombstones[(t.digest, t.chunk_count)] = None
                while len(item.tombstones) > _TOMBSTONES:
                    item.tombstones.popitem(last=False)
            t = item.transfer = _Transfer(wid, digest, total, cc)
            self._reserve(item, 3 * total + ITEM_OVERHEAD_BYTES)
        elif t.total_bytes != total or t.work_item_id != wid:
            raise ChunkError("conflict", "chunks of one digest disagree on size or identity")
        have = t.parts.get(ci)
        if have is not None:
            if have != data:
                raise ChunkError("conflict", "a duplicate chunk differs from the first copy")
            return None
        if t.size + len(data) > t.total_bytes:
            raise ChunkError("length", "chunks hold more bytes than total_bytes")
        t.parts[ci] = data
        t.size += len(data)
        if len(t.parts) < t.chunk_count:
            return None
        whole = b"".join(t.parts[i] for i in range(t.chunk_count))
        if len(whole) != t.total_bytes:
            raise ChunkError("length", "reassembled length differs from total_bytes")
        if hashlib.sha256(whole).hexdigest() != t.digest:
            raise ChunkError("digest", "reassembled bytes do not match the digest")
        item.done = True
        item.transfer = None  # the parts go; the reservation stays until close()
        return whole

    def _reserve(self, item: _Item, n: int) -> None:
        """Reserve ``n`` bytes for ``item``'s new transfer (its earlier reservation,
        if any, is given back first)."""
        self._release(item)
        if self.reserved_bytes + n > self.request_limit_bytes:
            raise ChunkError(
                "request_budget",
                f"chunked results of the request would hold {self.reserved_bytes + n} bytes "
                f"(limit {self.request_limit_bytes})",
            )
        if not self.budget.try_reserve(n):
            raise ChunkError("global_budget", "the gateway's chunk memory budget is spent")
        item.reserved = n
        self.reserved_bytes += n

    def _release(self, item: _Item) -> None:
        if item.reserved:
            self.budget.release(item.reserved)
            self.reserved_bytes -= item.reserved
            item.reserved = 0

    def close(self) -> None:
        """Release every reservation of the request (idempotent)."""
        for item in self._items.values():
            self._release(item)
            item.transfer = None
