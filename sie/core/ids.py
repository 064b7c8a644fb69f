"""Identifiers: request ids (UUIDv7, RFC 9562) minted by the gateway.

The random bits come from ``os.urandom`` read 4 KiB at a time: one system call per
409 ids instead of one per id (a system call releases the GIL, and on a busy gateway
getting it back can cost the event loop far more than the call itself). A forked
child starts with an empty buffer.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["uuid7"]

_RANDOM_BYTES = 10
_BUFFER = 4096 - 4096 % _RANDOM_BYTES
_lock = threading.Lock()
_pool = b""
_at = 0


def _random10() -> bytes:
    """10 bytes from the operating system's CSPRNG (buffered; thread-safe)."""
    global _pool, _at
    with _lock:
        if _at + _RANDOM_BYTES > len(_pool):
            _pool, _at = os.urandom(_BUFFER), 0
        out = _pool[_at : _at + _RANDOM_BYTES]
        _at += _RANDOM_BYTES
        return out


def _forget() -> None:
    """A forked child must not reuse its parent's unread random bytes."""
    global _pool, _at, _lock
    _lock, _pool, _at = threading.Lock(), b"", 0


os.register_at_fork(after_in_child=_forget)


def uuid7() -> str:
    """A time-ordered UUIDv7 string (RFC 9562), the gateway's request id format."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(_random10(), "big")
    value = (
        (ms & ((1 << 48) - 1)) << 80
        | 0x7 << 76
        | ((rand >> 62) & 0xFFF) << 64
        | 0b10 << 62
        | (rand & ((1 << 62) - 1))
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
