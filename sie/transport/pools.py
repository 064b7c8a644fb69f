"""The pool store port: where gateways keep pools, shared by every gateway that uses
the same store (docs/pools.md; architecture §16.3).

A store maps a pool name to its JSON document (``sie.core.pools.Pool``) with a
revision that changes on every write; ``put`` and ``delete`` take the revision the
caller read (None for "must not exist") and fail with ``PoolConflict`` if another
writer got there first, so concurrent gateways never overwrite each other's changes.

Adapters: ``MemoryPoolStore`` (one process, the embedded default; here) and
``NatsKvPoolStore`` (a JetStream key-value bucket: several gateways share pools with
no Kubernetes; ``sie.transport.nats_kv``). ``tests/contract/test_pool_store.py`` runs
the contract over both.
"""

from __future__ import annotations

from typing import Protocol

from sie.core.errors import PoolConflict

__all__ = ["MemoryPoolStore", "PoolConflict", "PoolStore", "Revision"]

#: A stored document's revision: opaque to callers, passed back as read (an int for
#: the memory and NATS stores, a Kubernetes ``resourceVersion`` string for that one).
Revision = int | str


class PoolStore(Protocol):
    """Pool documents by name, with compare-and-set revisions."""

    async def list_pools(self) -> dict[str, tuple[bytes, Revision]]:
        """Every pool: name → (document, revision).

        Raises:
            BusError: the store is unreachable.
        """
        ...

    async def get(self, name: str) -> tuple[bytes, Revision] | None:
        """One pool's (document, revision), or None."""
        ...

    async def put(self, name: str, document: bytes, revision: Revision | None) -> Revision:
        """Write ``document``; ``revision`` is the one read (None: create). Returns the
        new revision.

        Raises:
            PoolConflict: the stored revision is not ``revision`` (or the pool exists
                when creating).
        """
        ...

    async def delete(self, name: str, revision: Revision | None = None) -> None:
        """Remove the pool (at ``revision``, when given); absent is not an error.

        Raises:
            PoolConflict: the stored revision is not ``revision``.
        """
        ...


class MemoryPoolStore:
    """``PoolStore`` in this process's memory."""

    def __init__(self) -> None:
        self._docs: dict[str, tuple[bytes, int]] = {}
        self._revision = 0

    async def list_pools(self) -> dict[str, tuple[bytes, Revision]]:
        return dict(self._docs)

    async def get(self, name: str) -> tuple[bytes, Revision] | None:
        return self._docs.get(name)

    async def put(self, name: str, document: bytes, revision: Revision | None) -> Revision:
        have = self._docs.get(name)
        if (have[1] if have else None) != revision:
            raise PoolConflict(f"pool {name!r} changed since it was read")
        self._revision += 1
        self._docs[name] = (bytes(document), self._revision)
        return self._revision

    async def delete(self, name: str, revision: Revision | None = None) -> None:
        have = self._docs.get(name)
        if have is None:
            return
        if revision is not None and have[1] != revision:
            raise PoolConflict(f"pool {name!r} changed since it was read")
        del self._docs[name]
