"""Pool calls of both clients (docs/sdk.md "Pools"; docs/pools.md): create, get, list,
renew and delete, over the gateway's ``/v1/pools`` API.

A pool created with ``ttl_seconds`` is a lease: the client renews it every
``min(60, ttl/3)`` seconds (a thread for ``SIEClient``, an asyncio task for
``SIEAsyncClient``), retrying a failed renewal up to 5 times with a backoff of
``min(2**n, 10)`` s, until ``delete_pool`` or ``close``. Writes need the admin token
when auth is on (``admin_key``; ``SIE_ADMIN_TOKEN``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from sie.client.calls import Call, CallBuilder, renew_interval
from sie.client.errors import SIEError
from sie.client.exchange import forward
from sie.client.types import PoolInfo

__all__ = ["RENEW_ATTEMPTS", "AsyncPoolsMixin", "PoolsMixin"]

log = logging.getLogger("sie.client")

RENEW_ATTEMPTS = 5

_R = TypeVar("_R")


def _backoff(attempt: int) -> float:
    return float(min(2**attempt, 10))


def _create_call(b: CallBuilder, args: Mapping[str, Any]) -> Call:
    """``create_pool``'s call from its arguments (the method's ``locals()``)."""
    return b.create_pool_call(b.pool_spec(**{k: v for k, v in args.items() if k != "renew"}))


def _to_renew(
    b: CallBuilder, info: PoolInfo, args: Mapping[str, Any], renewing: Mapping[str, Any]
) -> tuple[str, float] | None:
    """After ``create_pool``: remember the pool; the name and renewal interval of a
    lease to start renewing (None: no lease, ``renew=False``, or renewed already)."""
    canonical = str(info.get("spec", {}).get("name", args["name"]))
    b.last_pool = canonical
    interval = renew_interval(args["ttl_seconds"])
    if args["renew"] and interval is not None and canonical not in renewing:
        return canonical, interval
    return None


def _pop_renewers(renewing: dict[str, _R], name: str | None) -> list[_R]:
    """Remove ``name``'s renewer (every one when None) and return what was removed."""
    keys = [name] if name is not None else list(renewing)
    return [r for r in (renewing.pop(k, None) for k in keys) if r is not None]


class PoolsMixin:
    """``SIEClient``'s pool methods (it provides ``_b`` and ``_run``)."""

    _b: CallBuilder
    _run: Callable[[Call], Any]
    _pool_renewers: dict[str, threading.Event]  # set by the client

    def create_pool(
        self,
        name: str,
        gpus: Mapping[str, int],
        bundle: str | None = None,
        minimum_worker_count: int | None = None,
        *,
        ttl_seconds: int | None = None,
        gpu_caps: Mapping[str, int] | None = None,
        queue_pool: str | None = None,
        pinned_models: Sequence[str] | None = None,
        renew: bool = True,
    ) -> PoolInfo:
        """Create a pool, or renew it when the same spec exists (``PoolInfo``:
        ``{"spec", "status"}``). ``gpus``: machine profile → workers needed.

        Raises:
            PoolError: 400 naming the bad field, 409 ``POOL_CONFLICT`` (another spec
                under the name), 403 (``default``, or no admin token).
        """
        args = forward(locals())
        info: PoolInfo = self._run(_create_call(self._b, args))
        lease = _to_renew(self._b, info, args, self._pool_renewers)
        if lease is not None:
            self._start_renewer(*lease)
        return info

    def _start_renewer(self, name: str, interval: float) -> None:
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval):
                for attempt in range(RENEW_ATTEMPTS):
                    try:
                        self.renew_pool(name)
                        break
                    except SIEError as exc:
                        log.warning("pool %s: lease renewal failed: %s", name, exc)
                        if stop.wait(_backoff(attempt)):
                            return

        self._pool_renewers[name] = stop
        threading.Thread(target=loop, name=f"sie-pool-renew-{name}", daemon=True).start()

    def _stop_renewers(self, name: str | None = None) -> None:
        for stop in _pop_renewers(self._pool_renewers, name):
            stop.set()

    def get_pool(self, name: str | None = None) -> PoolInfo | None:
        """A pool (default: the one this client created last); None when absent."""
        return self._run(self._b.get_pool_call(self._b.pool_name(name)))  # type: ignore[no-any-return]

    def list_pools(self) -> list[PoolInfo]:
        """Every pool, ``default`` first."""
        return self._run(self._b.list_pools_call())  # type: ignore[no-any-return]

    def renew_pool(self, name: str | None = None) -> PoolInfo:
        """Extend a pool's lease from now. Raises ``PoolError`` (404 when it is gone)."""
        return self._run(self._b.renew_pool_call(self._b.pool_name(name)))  # type: ignore[no-any-return]

    def delete_pool(self, name: str | None = None) -> bool:
        """Delete a pool (and stop renewing it); False when it did not exist.
        Raises ``PoolError`` (403 for ``default``)."""
        pool = self._b.pool_name(name)
        self._stop_renewers(pool.strip().lower())
        return self._run(self._b.delete_pool_call(pool))  # type: ignore[no-any-return]


class AsyncPoolsMixin:
    """``SIEAsyncClient``'s pool methods: as ``PoolsMixin``, awaited."""

    _b: CallBuilder
    _run: Callable[[Call], Awaitable[Any]]
    _pool_renewers: dict[str, asyncio.Task[None]]  # set by the client

    async def create_pool(
        self,
        name: str,
        gpus: Mapping[str, int],
        bundle: str | None = None,
        minimum_worker_count: int | None = None,
        *,
        ttl_seconds: int | None = None,
        gpu_caps: Mapping[str, int] | None = None,
        queue_pool: str | None = None,
        pinned_models: Sequence[str] | None = None,
        renew: bool = True,
    ) -> PoolInfo:
        """As ``SIEClient.create_pool``; the lease is renewed by an asyncio task."""
        args = forward(locals())
        info: PoolInfo = await self._run(_create_call(self._b, args))
        lease = _to_renew(self._b, info, args, self._pool_renewers)
        if lease is not None:
            canonical, interval = lease
            self._pool_renewers[canonical] = asyncio.create_task(
                self._renew_loop(canonical, interval)
            )
        return info

    async def _renew_loop(self, name: str, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            for attempt in range(RENEW_ATTEMPTS):
                try:
                    await self.renew_pool(name)
                    break
                except SIEError as exc:
                    log.warning("pool %s: lease renewal failed: %s", name, exc)
                    await asyncio.sleep(_backoff(attempt))

    def _stop_renewers(self, name: str | None = None) -> None:
        for task in _pop_renewers(self._pool_renewers, name):
            task.cancel()

    async def get_pool(self, name: str | None = None) -> PoolInfo | None:
        """As ``SIEClient.get_pool``."""
        return await self._run(self._b.get_pool_call(self._b.pool_name(name)))  # type: ignore[no-any-return]

    async def list_pools(self) -> list[PoolInfo]:
        """As ``SIEClient.list_pools``."""
        return await self._run(self._b.list_pools_call())  # type: ignore[no-any-return]

    async def renew_pool(self, name: str | None = None) -> PoolInfo:
        """As ``SIEClient.renew_pool``."""
        return await self._run(self._b.renew_pool_call(self._b.pool_name(name)))  # type: ignore[no-any-return]

    async def delete_pool(self, name: str | None = None) -> bool:
        """As ``SIEClient.delete_pool``."""
        pool = self._b.pool_name(name)
        self._stop_renewers(pool.strip().lower())
        return await self._run(self._b.delete_pool_call(pool))  # type: ignore[no-any-return]
