"""The gateway's pools (docs/pools.md; architecture §14, §16.3): the pool API's logic,
the assignment of live workers, lease expiry, and the resolution of ``X-SIE-Pool``.

Pools live in a ``PoolStore`` shared by every gateway on it; this manager keeps a copy
refreshed every ``REFRESH_S`` and after each of its own writes, and removes pools whose
lease ran out (any gateway may; a lost compare-and-set just means another one did).
Assignments are computed, not stored: every gateway derives the same one from the
same heartbeats (``sie.core.pools.assign``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from sie.core.errors import (
    Forbidden,
    InvalidInput,
    PoolConflict,
    PoolLimitExceeded,
    PoolNotFound,
    Provisioning,
    SieError,
)
from sie.core.lane_catalog import LaneCatalog
from sie.core.pools import (
    DEFAULT_POOL,
    Pool,
    PoolSpec,
    WorkerRef,
    assign,
    canonical_name,
    capped,
    hrw_pick,
    pool_state,
)
from sie.core.registry import ModelRegistry
from sie.roles.gateway.directory import WorkerDirectory
from sie.roles.gateway.requests import lane_of, split_routing
from sie.transport.pools import PoolStore, Revision

__all__ = ["REFRESH_S", "PoolManager", "PoolRoute"]

log = logging.getLogger(__name__)

#: Seconds between two readings of the shared store.
REFRESH_S = 1.0
#: Compare-and-set attempts of one write before it gives up with 409.
_CAS_ATTEMPTS = 5


class PoolRoute:
    """Where ``X-SIE-Pool`` sends a request: the logical pool (``admission_pool``), the
    queue pool whose stream it is published on, whether the caller pinned it, and an
    API pool's machine profiles (its ``gpus``; empty for other pools)."""

    __slots__ = ("logical", "pinned", "profiles", "queue_pool")

    def __init__(
        self, logical: str, queue_pool: str, pinned: bool, profiles: tuple[str, ...] = ()
    ) -> None:
        self.logical, self.queue_pool, self.pinned = logical, queue_pool, pinned
        self.profiles = profiles


class PoolManager:
    """Pools for one gateway. Start ``run`` in a task group."""

    def __init__(
        self,
        store: PoolStore,
        directory: WorkerDirectory,
        registry: ModelRegistry,
        *,
        static_queue_pools: tuple[str, ...] = (),
        catalog: LaneCatalog | None = None,
        default_profile: str = "default",
        max_pools: int = 256,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``catalog``: the lanes requests may resolve to (``sie.core.lane_catalog``);
        ``default_profile``: the machine profile of a request that names none;
        ``max_pools``: most pools the store may hold (``SIE_MAX_POOLS``)."""
        self.max_pools = max_pools
        self.catalog = catalog if catalog is not None else LaneCatalog()
        self.default_profile = default_profile
        self.store = store
        self.directory = directory
        self.registry = registry
        self.static_queue_pools = frozenset(static_queue_pools)
        self.clock = clock
        self._pools: dict[str, tuple[Pool, Revision]] = {}

    # -- the shared store ---------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Refresh from the store and expire leases until cancelled."""
        task_status.started()
        while True:
            try:
                await self.refresh()
                await self._expire()
                await self._record_assignments()
            except SieError as exc:  # the store is away: keep the last copy
                log.warning("pool store: %s", exc.message)
            await anyio.sleep(REFRESH_S)

    async def refresh(self) -> None:
        """Read every pool from the store (an unreadable document is skipped)."""
        pools: dict[str, tuple[Pool, Revision]] = {}
        for name, (doc, revision) in (await self.store.list_pools()).items():
            try:
                pools[name] = (Pool.model_validate_json(doc), revision)
            except ValueError as exc:
                log.warning("skipping unreadable pool %r in the store: %s", name, exc)
        self._pools = pools

    async def _expire(self) -> None:
        now = self.clock()
        for name, (pool, revision) in list(self._pools.items()):
            if pool.expired(now):
                try:
                    await self.store.delete(name, revision)
                    log.info("pool %s expired (not renewed) and was removed", name)
                except PoolConflict:
                    pass  # renewed or removed meanwhile: the next refresh tells
                self._pools.pop(name, None)

    async def _record_assignments(self) -> None:
        """Write each live pool's assigned workers to the store when they changed, for
        the workers deciding what to admit (``sie.core.pools.admits``). Gateways
        compute the same assignment; a lost compare-and-set means another one wrote."""
        workers = self.workers()
        now = self.clock()
        for name, (pool, revision) in list(self._pools.items()):
            if pool.expired(now):
                continue
            ids = tuple(w.worker_id for w in assign(pool.spec, workers))
            if ids == pool.assigned_workers:
                continue
            updated = pool.model_copy(update={"assigned_workers": ids})
            try:
                new = await self.store.put(name, updated.model_dump_json().encode(), revision)
            except PoolConflict:
                continue  # changed meanwhile: the next refresh reads it
            self._pools[name] = (updated, new)

    def capped_ring(self, route: PoolRoute, profile: str, bundle: str) -> list[str] | None:
        """The worker ids a capped pool's request on the lane may run on: its assigned
        live workers of the lane (possibly none); None for any other pool (then every
        worker of the lane may)."""
        pool = self._live(route.logical) if route.profiles else None
        if pool is None or not capped(pool.spec, profile):
            return None
        return [
            w.worker_id
            for w in assign(pool.spec, self.workers())
            if w.machine_profile.lower() == profile and w.bundle == bundle
        ]

    def direct_worker(self, route: PoolRoute, profile: str, bundle: str, key: str) -> str | None:
        """The worker a request of a capped pool goes to directly (architecture §8): the
        rendezvous choice for ``key`` among ``capped_ring``; None for other pools, or
        when none of them is live (then the request goes to the lane's pool stream,
        where only assigned workers admit it)."""
        ring = self.capped_ring(route, profile, bundle)
        return None if ring is None else hrw_pick(ring, key)

    def live_pools(self) -> list[Pool]:
        """The pools whose lease is live, by name."""
        now = self.clock()
        return [p for _, (p, _) in sorted(self._pools.items()) if not p.expired(now)]

    # -- the API ------------------------------------------------------------------------

    def _live(self, name: str) -> Pool | None:
        got = self._pools.get(name)
        if got is None or got[0].expired(self.clock()):
            return None
        return got[0]

    def workers(self) -> list[WorkerRef]:
        return [
            WorkerRef(hb.worker_id, hb.pool, hb.machine_profile, hb.bundle, hb.ready)
            for hb in self.directory.live()
        ]

    def info(self, pool: Pool) -> dict[str, Any]:
        """The API's ``{"spec", "status"}`` document of ``pool``."""
        assigned = assign(pool.spec, self.workers())
        return {
            "spec": pool.spec.model_dump(mode="json"),
            "status": {
                "state": pool_state(pool, assigned, self.clock()),
                "assigned_workers": [
                    {"name": w.worker_id, "gpu": w.machine_profile, "bundle": w.bundle}
                    for w in assigned
                ],
                "created_at": pool.created_at,
                "last_renewed": pool.last_renewed,
                "expires_at": pool.expires_at(),
            },
        }

    def default_info(self) -> dict[str, Any]:
        """The ``default`` pool: every live worker of the ``default`` queue pool."""
        workers = [w for w in self.workers() if w.pool.lower() == DEFAULT_POOL and w.ready]
        return {
            "spec": {"name": DEFAULT_POOL, "gpus": {}, "queue_pool": DEFAULT_POOL},
            "status": {
                "state": "active",
                "assigned_workers": [
                    {"name": w.worker_id, "gpu": w.machine_profile, "bundle": w.bundle}
                    for w in sorted(workers, key=lambda w: w.worker_id)
                ],
                "created_at": None,
                "last_renewed": None,
                "expires_at": None,
            },
        }

    def list(self) -> list[dict[str, Any]]:
        """Every pool, ``default`` first, then by name (expired leases left out)."""
        now = self.clock()
        named = [self.info(p) for n, (p, _) in sorted(self._pools.items()) if not p.expired(now)]
        return [self.default_info(), *named]

    def get(self, name: str) -> dict[str, Any]:
        """Raises: PoolNotFound (404); InvalidInput for a bad name (400)."""
        name = canonical_name(name, "name")
        if name == DEFAULT_POOL:
            return self.default_info()
        pool = self._live(name)
        if pool is None:
            raise PoolNotFound(f"pool {name!r} does not exist", pool=name)
        return self.info(pool)

    def _check(self, spec: PoolSpec) -> PoolSpec:
        """Pinned model ids canonical and known; the queue pool one that exists.

        Raises:
            InvalidInput: an unknown pinned model or queue pool (400, naming it).
        """
        pinned = []
        for i, model in enumerate(spec.pinned_models):
            try:
                entry, _ = self.registry.resolve(model)
            except SieError:
                raise InvalidInput(
                    f"pinned_models[{i}]: unknown model {model[:200]!r}",
                    field=f"pinned_models[{i}]",
                ) from None
            pinned.append(entry.model_id)
        if spec.bundle is not None and spec.bundle not in self.registry.snapshot.bundles:
            raise InvalidInput(
                f"bundle: {spec.bundle!r} is not a bundle of this deployment", field="bundle"
            )
        if spec.queue_pool != DEFAULT_POOL and spec.queue_pool not in self.static_queue_pools:
            raise InvalidInput(
                f"queue_pool: {spec.queue_pool!r} is not a deploy-owned queue pool "
                "(SIE_GATEWAY_STATIC_QUEUE_POOLS); omit it to use the default pool's capacity",
                field="queue_pool",
            )
        return spec.model_copy(update={"pinned_models": tuple(dict.fromkeys(pinned))})

    async def create(self, spec: PoolSpec) -> tuple[dict[str, Any], bool]:
        """Create ``spec``; returns (its document, whether it was created). Creating
        what exists with the same spec renews it instead (idempotent).

        Raises:
            InvalidInput (400), PoolConflict (409: exists with another spec).
        """
        spec = self._check(spec)
        for _ in range(_CAS_ATTEMPTS):
            now = self.clock()
            got = await self.store.get(spec.name)
            if got is not None:
                old = Pool.model_validate_json(got[0])
                if not old.expired(now) and old.spec != spec:
                    raise PoolConflict(
                        f"pool {spec.name!r} exists with another spec; delete it first",
                        pool=spec.name,
                    )
                created = old.expired(now)
                pool = Pool(
                    spec=spec, created_at=now if created else old.created_at, last_renewed=now
                )
            else:
                if len(await self.store.list_pools()) >= self.max_pools:
                    raise PoolLimitExceeded(
                        f"this deployment holds at most {self.max_pools} pools "
                        "(SIE_MAX_POOLS); delete one first",
                        limit=self.max_pools,
                    )
                created, pool = True, Pool(spec=spec, created_at=now, last_renewed=now)
            try:
                revision = await self.store.put(
                    spec.name, pool.model_dump_json().encode(), got[1] if got else None
                )
            except PoolConflict:
                continue  # another gateway wrote it meanwhile: read again
            self._pools[spec.name] = (pool, revision)
            return self.info(pool), created
        raise PoolConflict(f"pool {spec.name!r} keeps changing; retry", pool=spec.name)

    async def renew(self, name: str) -> dict[str, Any]:
        """Extend the lease from now.

        Raises:
            PoolNotFound (404), PoolConflict (409 after repeated races).
        """
        name = canonical_name(name, "name")
        if name == DEFAULT_POOL:
            return self.default_info()
        for _ in range(_CAS_ATTEMPTS):
            got = await self.store.get(name)
            pool = Pool.model_validate_json(got[0]) if got else None
            if got is None or pool is None or pool.expired(self.clock()):
                raise PoolNotFound(f"pool {name!r} does not exist", pool=name)
            renewed = pool.model_copy(update={"last_renewed": self.clock()})
            try:
                revision = await self.store.put(name, renewed.model_dump_json().encode(), got[1])
            except PoolConflict:
                continue
            self._pools[name] = (renewed, revision)
            return self.info(renewed)
        raise PoolConflict(f"pool {name!r} keeps changing; retry", pool=name)

    async def delete(self, name: str) -> None:
        """Raises: Forbidden for ``default`` (403); PoolNotFound (404)."""
        name = canonical_name(name, "name")
        if name == DEFAULT_POOL:
            raise Forbidden("the default pool cannot be deleted", pool=name)
        got = await self.store.get(name)
        if got is None:
            raise PoolNotFound(f"pool {name!r} does not exist", pool=name)
        await self.store.delete(name)
        self._pools.pop(name, None)

    # -- routing ------------------------------------------------------------------------

    def route(self, header: str | None, model_pool: str) -> PoolRoute:
        """Where a request with ``X-SIE-Pool: header`` goes (None: the model's pool).

        A named pool must exist: an API pool (its lease live) goes to its queue pool;
        a deploy-owned static queue pool, or a queue pool a live worker serves, is
        itself. Anything else fails closed.

        Raises:
            InvalidInput: not a valid name (400, ``X-SIE-Pool``).
            PoolNotFound: no such pool (404).
        """
        if header is None:
            return PoolRoute(model_pool, model_pool, False)
        name = canonical_name(header, "X-SIE-Pool")
        if name == DEFAULT_POOL:
            return PoolRoute(name, name, True)
        pool = self._live(name)
        if pool is not None:
            return PoolRoute(name, pool.spec.queue_pool, True, tuple(sorted(pool.spec.gpus)))
        if name in self.static_queue_pools or any(
            hb.pool.lower() == name for hb in self.directory.live()
        ):
            return PoolRoute(name, name, True)
        raise PoolNotFound(
            f"pool {name!r} does not exist (create it with POST /v1/pools)", pool=name
        )

    def lane(
        self, model_pool: str, bundle: str, pool: str | None, machine_profile: str | None
    ) -> tuple[PoolRoute, str]:
        """Where a request for a model of ``model_pool`` and ``bundle`` goes, from its
        ``X-SIE-Pool`` / ``X-SIE-Machine-Profile`` headers (the SDK's ``pool/profile``
        form included): the pool route and the canonical machine profile, checked
        against the lane catalog (caller input never invents a lane).

        Raises:
            InvalidInput: a bad header, or a profile a declared catalog lacks (400).
            PoolNotFound: a named pool that does not exist (404).
            Provisioning: a profile nothing knows of (503; no telemetry recorded).
        """
        pool, machine_profile = split_routing(pool, machine_profile)
        route = self.route(pool, model_pool)
        live = self.directory.live()
        if route.profiles and machine_profile is None:  # the pool's own capacity
            profile = self._pool_profile(route, bundle)
        else:
            _, profile = lane_of(route.queue_pool, machine_profile, self.default_profile)
            profile = self.catalog.profile(profile)
        if route.profiles and profile not in route.profiles:
            raise InvalidInput(
                f"X-SIE-Machine-Profile: pool {route.logical!r} has no machine profile "
                f"{profile!r} (it has {', '.join(route.profiles)})",
                field="X-SIE-Machine-Profile",
            )
        lane = (route.queue_pool, profile, bundle)
        lanes = {(hb.pool.lower(), hb.machine_profile.lower(), hb.bundle) for hb in live}
        known = self.catalog.knows(
            lane,
            default_profile=self.default_profile,
            worker_profiles={hb.machine_profile.lower() for hb in live},
            served=lambda x: x in lanes,
        )
        if not known:
            if self.catalog.declared:
                raise self.catalog.unknown(machine_profile or profile)
            raise Provisioning(
                f"no worker serves machine profile {profile!r}; retry later",
                pool=route.queue_pool,
                machine_profile=profile,
                bundle=bundle,
            )
        return route, profile

    def _pool_profile(self, route: PoolRoute, bundle: str) -> str:
        """The machine profile an API pool's request without one goes to: that of its
        first assigned live worker of the bundle (worker-id order), else its first."""
        pool = self._live(route.logical)
        if pool is not None:
            for w in assign(pool.spec, self.workers()):
                if w.bundle == bundle:
                    return w.machine_profile.lower()
        return route.profiles[0]
