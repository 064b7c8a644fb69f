"""Work items too large for one bus message travel by reference (docs/api.md §12,
architecture §16.2 step 2): the whole encoded item goes to the payload store and the
bus carries a slim item with the routing fields and ``payload_ref``."""

from __future__ import annotations

import logging
from typing import Any

import anyio

from sie.core.errors import SieError
from sie.core.wire import packb, unpackb
from sie.telemetry import Metrics
from sie.transport.base import Bus, data_limit
from sie.transport.payloads import PayloadStore, payload_key

__all__ = ["ROUTING_FIELDS", "SWEEP_INTERVAL_S", "Offloader", "offload_large", "sweep_orphans"]

log = logging.getLogger(__name__)

#: Seconds between two sweeps of payloads left behind by gateways that died.
SWEEP_INTERVAL_S = 300.0

#: What a slim item keeps: everything a worker needs to route, settle and answer it
#: before it fetches the rest.
ROUTING_FIELDS = (
    "work_item_id",
    "request_id",
    "item_index",
    "total_items",
    "operation",
    "model_id",
    "profile_id",
    "pool_name",
    "router_id",
    "reply_subject",
    "timestamp",
    "admission_pool",
    "machine_profile",
    "bundle_config_hash",
    "accepts_result_chunks",
    "traceparent",
    "tracestate",
)


async def offload_large(
    work: list[tuple[str, bytes]],
    keys: list[str],
    *,
    limit: int,
    store: PayloadStore,
    router_id: str,
    request_id: str,
    metrics: Metrics,
) -> None:
    """Replace every entry of ``work`` (``(work_item_id, msgpack)`` in item order)
    over ``limit`` bytes with a slim item naming its stored copy. Each key is added
    to ``keys`` before it is written, so the caller, which deletes ``keys`` when the
    request ends however it ends, also removes a partly written payload.

    Raises:
        PayloadUnavailable: the store refused a payload (503, Retry-After 5).
    """
    for i, (wid, data) in enumerate(work):
        if len(data) <= limit:
            continue
        key = payload_key(router_id, request_id, i)
        keys.append(key)
        try:
            await store.put(key, data)
        except BaseException:
            metrics.payload_refs.labels("gateway", "put_failed").inc()
            raise
        metrics.payload_refs.labels("gateway", "stored").inc()
        full: dict[str, Any] = unpackb(data)
        slim = {k: full[k] for k in ROUTING_FIELDS if full.get(k) is not None}
        slim["payload_ref"] = key
        work[i] = (wid, packb(slim))


async def sweep_orphans(store: PayloadStore, older_than_s: float) -> None:
    """Every ``SWEEP_INTERVAL_S``, remove payloads stored more than ``older_than_s``
    seconds ago (the work stream's ``max_age``: their items can no longer run). A
    gateway deletes its own keys when each request ends; this catches those of a
    gateway that died first. Runs until cancelled."""
    while True:
        await anyio.sleep(SWEEP_INTERVAL_S)
        try:
            if removed := await store.sweep(older_than_s):
                log.info("removed %d orphaned payloads from the payload store", removed)
        except SieError as exc:
            log.warning("payload store sweep failed: %s", exc.message)


class Offloader:
    """One gateway's way of sending oversized work items by reference: what fits the
    bus goes inline, the rest through ``store`` (``offload``), removed when the request
    ends (``release``)."""

    def __init__(self, bus: Bus, store: PayloadStore, router_id: str, metrics: Metrics) -> None:
        self.bus, self.store, self.router_id, self.metrics = bus, store, router_id, metrics

    async def offload(
        self, work: list[tuple[str, bytes]], keys: list[str], request_id: str
    ) -> None:
        """``offload_large`` at the bus's current ``max_payload``."""
        await offload_large(
            work,
            keys,
            limit=data_limit(self.bus.max_payload),
            store=self.store,
            router_id=self.router_id,
            request_id=request_id,
            metrics=self.metrics,
        )

    async def release(self, keys: list[str]) -> None:
        """Best-effort removal of a finished request's offloaded items, even while it is
        being cancelled (the periodic sweep catches what this misses)."""
        if not keys:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self.store.delete(keys)
            except SieError as exc:
                log.warning("cannot delete %d offloaded payloads: %s", len(keys), exc.message)
