"""What a worker admits, and the models its pools pin (docs/pools.md "Capped pools",
"Warm floors and pinned models"; architecture §16.3).

A work item names its logical pool (``admission_pool``). Work of the worker's own
queue pool, or of ``default``, is always admitted. Work of an API pool is admitted
only when that pool assigns this worker (``sie.core.pools.admits``): otherwise the
worker NAKs it before any work, so an assigned worker of the lane takes it. The
worker reads the pool store every ``SIE_WORKER_POOL_POLL_S`` (and at once, at most
once a second, when an item names a pool that does not admit it by the last reading:
the pool may be new or reassigned), keeping its last reading while the store is away.

The models pinned by the pools assigning this worker (and of its bundle) are kept
loaded: loaded when first pinned and never evicted while pinned; the rest of the
memory budget stays an LRU cache as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

import anyio
import anyio.abc

from sie.core.errors import SieError
from sie.core.pools import DEFAULT_POOL, Pool, WorkerRef, admits
from sie.core.registry import ModelRegistry
from sie.engines.runtime.cache import ModelCache
from sie.settings_views import WorkerSettings
from sie.transport.pools import PoolStore

__all__ = ["ADMISSION_RETRY_S", "PoolAdmission"]

log = logging.getLogger(__name__)

#: Seconds before an item this worker may not run is offered again (NAK delay).
ADMISSION_RETRY_S = 0.5
#: Least seconds between two readings the store triggered by an unknown pool.
_MIN_REREAD_S = 1.0


class PoolAdmission:
    """One worker's reading of the pools. Start ``run`` in a task group."""

    def __init__(
        self,
        store: PoolStore,
        settings: WorkerSettings,
        registry: ModelRegistry,
        models: ModelCache,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.registry = registry
        self.models = models
        self.clock = clock
        self.me = WorkerRef(
            settings.worker_id, settings.pool, settings.machine_profile, settings.bundle
        )
        self._pools: dict[str, Pool] = {}
        self._read_at = 0.0
        self._preloaded = frozenset(models.pinned)
        self._pinned_by_pools: frozenset[str] = frozenset()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Read the store every ``pool_poll_s`` and keep pinned models loaded."""
        task_status.started()
        while True:
            await self.refresh()
            await self.keep_pinned()
            await anyio.sleep(self.settings.pool_poll_s)

    async def refresh(self) -> None:
        """Read every pool (an unreadable one is skipped; a store that is away keeps
        the last reading)."""
        self._read_at = time.monotonic()
        try:
            docs = await self.store.list_pools()
        except SieError as exc:
            log.warning("pool store: %s (keeping the last reading)", exc.message)
            return
        pools: dict[str, Pool] = {}
        for name, (doc, _) in docs.items():
            try:
                pools[name] = Pool.model_validate_json(doc)
            except ValueError as exc:
                log.warning("skipping unreadable pool %r: %s", name, exc)
        self._pools = pools

    async def verdict(self, admission_pool: str | None) -> Literal["run", "elsewhere", "gone"]:
        """What this worker does with an item of ``admission_pool``: ``run`` it;
        leave it to ``elsewhere`` (NAK: the pool assigns other workers of the lane);
        or answer that the pool is ``gone`` (unknown or expired even after a fresh
        reading: its requests fail closed at once instead of cycling until
        ``max_deliver``)."""
        name = (admission_pool or "").lower()
        if name in ("", DEFAULT_POOL, self.settings.pool.lower()):
            return "run"
        if admits(self._pools.get(name), self.me, self.clock()):
            return "run"
        fresh = time.monotonic() - self._read_at >= _MIN_REREAD_S
        if fresh:
            await self.refresh()  # a pool created, renewed or reassigned since then
            if admits(self._pools.get(name), self.me, self.clock()):
                return "run"
        pool = self._pools.get(name)
        if pool is None or pool.expired(self.clock()):
            # only a fresh reading may say a pool is gone; until then, retry (NAK)
            return "gone" if fresh else "elsewhere"
        return "elsewhere"

    async def admits(self, admission_pool: str | None) -> bool:
        """Whether this worker may run an item of ``admission_pool``."""
        return await self.verdict(admission_pool) == "run"

    def pinned(self) -> frozenset[str]:
        """Model ids of this worker's bundle pinned by the pools assigning it."""
        now = self.clock()
        snap = self.registry.snapshot
        out: set[str] = set()
        for pool in self._pools.values():
            if not admits(pool, self.me, now):
                continue
            for model in pool.spec.pinned_models:
                entry = snap.entries.get(model)
                if entry is not None and self.settings.bundle in entry.bundles:
                    out.add(entry.model_id)
        return frozenset(out)

    async def keep_pinned(self) -> None:
        """Pin what the pools pin now (unpinning what they no longer do, except the
        worker's own ``--preload`` list) and load what is not loaded yet."""
        want = self.pinned()
        if want != self._pinned_by_pools:
            log.info("models pinned by pools: %s", ", ".join(sorted(want)) or "none")
        for gone in self._pinned_by_pools - want - self._preloaded:
            self.models.pinned.discard(gone)
        self.models.pinned |= want
        self._pinned_by_pools = want
        snap = self.registry.snapshot
        for model in sorted(want):
            entry = snap.entries.get(model)
            if entry is None:
                continue
            try:
                await self.models.get(entry)  # loaded already: returns at once
            except SieError as exc:
                log.error("pinned model %s did not load: %s", model, exc.message)
