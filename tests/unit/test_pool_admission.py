"""A worker's verdict on a pool's work (sie.roles.worker.admission; docs/pools.md "What a
worker admits"): a stale copy of a renewed lease never fails a request closed; only a
fresh reading may say a pool is gone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sie.core.pools import Pool, parse_spec
from sie.roles.worker.admission import PoolAdmission
from sie.transport.pools import MemoryPoolStore

pytestmark = pytest.mark.anyio


def _admission(store: MemoryPoolStore, now: list[float]) -> PoolAdmission:
    settings: Any = SimpleNamespace(
        worker_id="w1", pool="default", machine_profile="l4", bundle="default", pool_poll_s=10.0
    )
    models: Any = SimpleNamespace(pinned=set())
    return PoolAdmission(store, settings, registry=None, models=models, clock=lambda: now[0])  # type: ignore[arg-type]


async def test_a_stale_copy_of_a_renewed_lease_is_read_again_not_failed() -> None:
    store, now = MemoryPoolStore(), [100.0]
    spec = parse_spec({"name": "acme", "gpus": {"l4": 1}, "ttl_seconds": 3})
    rev = await store.put(
        "acme", Pool(spec=spec, created_at=100, last_renewed=100).model_dump_json().encode(), None
    )
    adm = _admission(store, now)
    await adm.refresh()
    assert await adm.verdict("acme") == "run"
    # renewed in the store at 102; the worker's copy still says 100 and now it is 104
    await store.put(
        "acme", Pool(spec=spec, created_at=100, last_renewed=102).model_dump_json().encode(), rev
    )
    now[0] = 104.0
    assert await adm.verdict("acme") == "elsewhere"  # read < 1 s ago: retry, never "gone"
    adm._read_at -= 2  # a second later: read again, the renewal is seen
    assert await adm.verdict("acme") == "run"
    assert await adm.verdict("default") == "run"
    await store.delete("acme")
    now[0] = 106.0  # the worker's copy ran out too
    adm._read_at -= 2
    assert await adm.verdict("acme") == "gone"  # a fresh reading does not know it
