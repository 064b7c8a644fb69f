"""``Idempotency-Key`` handling for config writes (architecture §3 "Idempotency").

- same key + same body (SHA-256 of the raw bytes) → the cached response, never re-executed;
- same key + different body → 422 ``IDEMPOTENCY_MISMATCH``;
- concurrent duplicates wait for the in-flight owner and replay *its* outcome: a
  success replays the cached response, a failure re-raises the same error (no
  synthetic success); failures are not cached, so a later retry runs afresh;
- the owner cancelled before its commit phase → waiters get 503
  ``IDEMPOTENT_INFLIGHT_CANCELLED``; once committing, the owner is shielded so
  waiters always see the real outcome;
- a cached success evicted while a waiter slept → 200 ``idempotent_replay_evicted``
  (the write still ran exactly once).

State is in-memory and per process: the reason the config role runs as one
replica (§11 caveat 1).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from sie.core.errors import IdempotencyMismatch, IdempotentInflightCancelled, SieError

__all__ = ["IdempotencyCache", "Reply", "body_digest"]

#: ``(status, json_body)`` of one write response.
Reply = tuple[int, dict[str, Any]]


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


@dataclass(slots=True)
class _InFlight:
    digest: str
    done: anyio.Event = field(default_factory=anyio.Event)
    error: BaseException | None = None
    cancelled: bool = False
    holders: int = 1  # the owner plus the requests waiting on it


class IdempotencyCache:
    """LRU of completed replies plus in-flight records, keyed by ``Idempotency-Key``."""

    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = capacity
        self._done: OrderedDict[str, tuple[str, Reply]] = OrderedDict()
        self._inflight: dict[str, _InFlight] = {}

    def __len__(self) -> int:
        return len(self._done)

    def in_flight(self, key: str) -> int:
        """Requests holding ``key`` now: its owner plus those waiting on it (0: none)."""
        record = self._inflight.get(key)
        return record.holders if record is not None else 0

    def _cached(self, key: str, digest: str) -> Reply | None:
        hit = self._done.get(key)
        if hit is None:
            return None
        if hit[0] != digest:
            raise IdempotencyMismatch(
                f"Idempotency-Key {key!r} was used with a different body", field="Idempotency-Key"
            )
        self._done.move_to_end(key)
        return hit[1]

    async def run(self, key: str, body: bytes, execute: Callable[[], Awaitable[Reply]]) -> Reply:
        """Run ``execute`` at most once per (key, body) while its reply is cached.

        Raises:
            IdempotencyMismatch: the key was used with a different body (422).
            IdempotentInflightCancelled: the owner was cancelled before committing (503).
            SieError: the owner's own failure, for the owner and its waiters alike.
        """
        digest = body_digest(body)
        cached = self._cached(key, digest)
        if cached is not None:
            return cached
        owner = self._inflight.get(key)
        if owner is not None:
            if owner.digest != digest:
                raise IdempotencyMismatch(
                    f"Idempotency-Key {key!r} is in flight with a different body",
                    field="Idempotency-Key",
                )
            owner.holders += 1
            try:
                await owner.done.wait()
            finally:
                owner.holders -= 1
            if owner.cancelled:
                raise IdempotentInflightCancelled(
                    f"the request holding Idempotency-Key {key!r} was cancelled before it "
                    "committed; retry"
                )
            if owner.error is not None:
                raise owner.error
            cached = self._cached(key, digest)
            if cached is None:
                return 200, {
                    "error": "idempotent_replay_evicted",
                    "message": f"the write for Idempotency-Key {key!r} completed, but its "
                    "response was evicted from the replay cache; it was not executed again",
                }
            return cached
        record = _InFlight(digest)
        self._inflight[key] = record
        try:
            reply = await execute()
        except SieError as exc:
            record.error = exc
            raise
        except anyio.get_cancelled_exc_class():
            record.cancelled = True
            raise
        except BaseException as exc:
            record.error = exc
            raise
        else:
            self._done[key] = (digest, reply)
            self._done.move_to_end(key)
            while len(self._done) > self.capacity:
                self._done.popitem(last=False)
            return reply
        finally:
            self._inflight.pop(key, None)
            record.done.set()
