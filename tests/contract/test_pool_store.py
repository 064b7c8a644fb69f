"""Pool-store contract (sie.transport.pools docstring; docs/pools.md).

Every adapter runs this suite: the in-memory store (the embedded default), the NATS
JetStream key-value store against a real ``nats-server``, and the Kubernetes store
(ConfigMaps) through the real ``kubernetes_asyncio`` client against a FAKE API server
on a loopback port (``tests/fakes/fake_k8s.py``: no cluster can run here).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from sie.transport.pools import MemoryPoolStore, PoolConflict, PoolStore
from tests.fakes.fake_k8s import FakeKubernetes
from tests.natsserver import NatsServer

#: The namespace the Kubernetes store's tests use on the fake API server.
NAMESPACE = "sie-test"


@asynccontextmanager
async def kubernetes_store(url: str, *, timeout_s: float = 10.0) -> AsyncIterator[Any]:
    """A ``KubernetesPoolStore`` on the real ``kubernetes_asyncio`` client, talking to
    the API server at ``url`` (a ``FakeKubernetes``), closed on exit."""
    from kubernetes_asyncio import client

    from sie.transport.k8s_pools import KubernetesPoolStore

    api = client.ApiClient(client.Configuration(host=url))
    store = KubernetesPoolStore(api, NAMESPACE, timeout_s=timeout_s)
    try:
        yield store
    finally:
        await store.aclose()


pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "nats-kv", "kubernetes"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[PoolStore]:
    if request.param == "memory":
        yield MemoryPoolStore()
        return
    if request.param == "kubernetes":
        with FakeKubernetes() as fake:
            async with kubernetes_store(fake.url) as k8s_store:
                yield k8s_store
        return
    from sie.transport.nats import NatsBus
    from sie.transport.nats_kv import NatsKvPoolStore

    server: NatsServer = request.getfixturevalue("nats_server")
    async with NatsBus(server.url, initial_connect_attempts=3) as bus:
        bucket = f"SIE_POOLS_TEST_{request.node.name.split('[')[0][-20:]}"
        try:
            yield NatsKvPoolStore(bus, bucket=bucket)
        finally:
            await bus._js.delete_key_value(bucket)


async def test_create_read_update_delete(store: PoolStore) -> None:
    assert await store.list_pools() == {} and await store.get("acme") is None
    r1 = await store.put("acme", b'{"v": 1}', None)
    assert await store.get("acme") == (b'{"v": 1}', r1)
    r2 = await store.put("acme", b'{"v": 2}', r1)
    assert r2 != r1 and await store.get("acme") == (b'{"v": 2}', r2)
    await store.put("other", b"{}", None)
    assert set(await store.list_pools()) == {"acme", "other"}
    await store.delete("acme", r2)
    assert await store.get("acme") is None
    assert set(await store.list_pools()) == {"other"}
    await store.delete("acme")  # absent: not an error
    r3 = await store.put("acme", b'{"v": 3}', None)  # created again after a delete
    assert (await store.get("acme")) == (b'{"v": 3}', r3)


async def test_writes_are_compare_and_set(store: PoolStore) -> None:
    r1 = await store.put("acme", b"a", None)
    with pytest.raises(PoolConflict):
        await store.put("acme", b"b", None)  # exists
    r2 = await store.put("acme", b"b", r1)
    with pytest.raises(PoolConflict):
        await store.put("acme", b"c", r1)  # stale revision
    with pytest.raises(PoolConflict):
        await store.delete("acme", r1)
    assert (await store.get("acme")) == (b"b", r2)


async def test_concurrent_writers_one_wins(store: PoolStore) -> None:
    r1 = await store.put("acme", b"start", None)
    outcomes: list[str] = []

    async def writer(value: bytes) -> None:
        try:
            await store.put("acme", value, r1)
            outcomes.append("won")
        except PoolConflict:
            outcomes.append("lost")

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(writer, f"w{i}".encode())
    assert sorted(outcomes) == ["lost"] * 4 + ["won"]
