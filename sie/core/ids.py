"""Identifiers: request ids (UUIDv7, RFC 9562) minted by the gateway."""

from __future__ import annotations

import os
import time

__all__ = ["uuid7"]


def uuid7() -> str:
    """A time-ordered UUIDv7 string (RFC 9562), the gateway's request id format."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (
        (ms & ((1 << 48) - 1)) << 80
        | 0x7 << 76
        | ((rand >> 62) & 0xFFF) << 64
        | 0b10 << 62
        | (rand & ((1 << 62) - 1))
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
