"""``PoolStore`` on a NATS JetStream key-value bucket (``SIE_POOLS``): every gateway
connected to the same broker sees the same pools, with no Kubernetes
(sie.transport.pools docstring; docs/pools.md). The key is the pool name, the value
its JSON document, the revision the bucket's sequence for that key."""

from __future__ import annotations

from typing import Any, Protocol

import nats.errors
import nats.js.errors

from sie.transport.base import BusError
from sie.transport.pools import PoolConflict, Revision

__all__ = ["POOLS_BUCKET", "KeyValueSource", "NatsKvPoolStore"]

POOLS_BUCKET = "SIE_POOLS"
#: JetStream's "wrong last sequence" error codes (a compare-and-set lost).
_WRONG_LAST = (10071, 10164)


class KeyValueSource(Protocol):
    """What gives the store its bucket: ``NatsBus.key_value``."""

    async def key_value(self, bucket: str, *, storage: str = ..., replicas: int = ...) -> Any:
        """The nats-py ``KeyValue`` bucket, created when missing. Raises ``BusError``."""
        ...


class NatsKvPoolStore:
    """Pools in the ``SIE_POOLS`` bucket of ``bus``'s broker (file storage)."""

    def __init__(
        self, bus: KeyValueSource, *, bucket: str = POOLS_BUCKET, replicas: int = 1
    ) -> None:
        self.bus = bus
        self.bucket = bucket
        self.replicas = replicas
        self._kv: Any = None

    async def _bucket(self) -> Any:
        if self._kv is None:
            self._kv = await self.bus.key_value(self.bucket, replicas=self.replicas)
        return self._kv

    async def _call(self, name: str, fn: Any, *args: Any, **kw: Any) -> Any:
        kv = await self._bucket()
        try:
            return await fn(kv, *args, **kw)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise PoolConflict(f"pool {name!r} changed since it was read") from exc
        except nats.js.errors.APIError as exc:
            if exc.err_code in _WRONG_LAST:
                raise PoolConflict(f"pool {name!r} changed since it was read") from exc
            self._kv = None
            raise BusError(f"pool store: {exc.description}") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            self._kv = None  # bind again next time (e.g. after a broker restart)
            raise BusError(f"pool store: {exc}") from exc

    async def list_pools(self) -> dict[str, tuple[bytes, Revision]]:
        async def run(kv: Any) -> dict[str, tuple[bytes, Revision]]:
            out: dict[str, tuple[bytes, Revision]] = {}
            watcher = await kv.watchall(ignore_deletes=True)
            try:
                async for entry in watcher:
                    if entry is None:  # the end of what is stored now
                        break
                    if entry.value:
                        out[entry.key] = (bytes(entry.value), int(entry.revision))
            finally:
                await watcher.stop()
            return out

        result: dict[str, tuple[bytes, Revision]] = await self._call("*", run)
        return result

    async def get(self, name: str) -> tuple[bytes, Revision] | None:
        async def run(kv: Any) -> tuple[bytes, Revision] | None:
            try:
                entry = await kv.get(name)
            except nats.js.errors.KeyNotFoundError:
                return None
            if not entry.value:
                return None
            return bytes(entry.value), int(entry.revision)

        result: tuple[bytes, Revision] | None = await self._call(name, run)
        return result

    async def put(self, name: str, document: bytes, revision: Revision | None) -> Revision:
        async def run(kv: Any) -> int:
            if revision is None:
                try:
                    return int(await kv.create(name, document))
                except nats.js.errors.KeyWrongLastSequenceError as exc:
                    raise PoolConflict(f"pool {name!r} already exists") from exc
            return int(await kv.update(name, document, last=int(revision)))

        result: int = await self._call(name, run)
        return result

    async def delete(self, name: str, revision: Revision | None = None) -> None:
        async def run(kv: Any) -> None:
            await kv.delete(name, last=None if revision is None else int(revision))

        await self._call(name, run)
