"""The Kubernetes pool store beyond the contract (sie.transport.k8s_pools docstring;
docs/pools.md): the Lease that mirrors a pool, object names, several gateways on one
API server, and an API server that is down or failing.

The API server is a FAKE (``tests/fakes/fake_k8s.py``: no cluster can run here), on a
loopback port, spoken to by the real ``kubernetes_asyncio`` client.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from sie.core.pools import Pool, PoolSpec
from sie.transport.base import BusError
from sie.transport.k8s_pools import KubernetesPoolStore, object_name
from sie.transport.pools import PoolConflict
from tests.contract.test_pool_store import NAMESPACE, kubernetes_store
from tests.fakes.fake_k8s import FakeKubernetes

pytestmark = pytest.mark.anyio

T0 = 1_764_660_000.25


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


@pytest.fixture
async def store(fake: FakeKubernetes) -> AsyncIterator[KubernetesPoolStore]:
    async with kubernetes_store(fake.url) as s:
        yield s


def pool_doc(name: str, *, ttl: int | None, created: float, renewed: float) -> bytes:
    spec = PoolSpec(name=name, gpus={"default": 1}, ttl_seconds=ttl)
    return Pool(spec=spec, created_at=created, last_renewed=renewed).model_dump_json().encode()


def micro(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def test_the_lease_mirrors_the_pool(fake: FakeKubernetes, store: KubernetesPoolStore) -> None:
    r1 = await store.put("acme", pool_doc("acme", ttl=3600, created=T0, renewed=T0), None)
    cm = fake.object("configmaps", NAMESPACE, "sie-pool-acme")
    lease = fake.object("leases", NAMESPACE, "sie-pool-acme")
    assert cm is not None and lease is not None
    assert cm["metadata"]["resourceVersion"] == r1
    assert cm["metadata"]["labels"]["sie.superlinked.com/pool"] == "acme"
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "sie"
    assert lease["spec"] == {
        "holderIdentity": "sie-gateway",
        "leaseDurationSeconds": 3600,
        "acquireTime": micro(T0),
        "renewTime": micro(T0),
    }
    assert lease["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "sie-pool-acme",
            "uid": cm["metadata"]["uid"],
        }
    ]

    # a renewal (a write of the same pool, last_renewed later) moves renewTime on
    renewed = pool_doc("acme", ttl=3600, created=T0, renewed=T0 + 60.5)
    r2 = await store.put("acme", renewed, r1)
    assert r2 != r1 and await store.get("acme") == (renewed, r2)
    coord = client.CoordinationV1Api(store.api_client)
    got = await coord.read_namespaced_lease("sie-pool-acme", NAMESPACE)  # as kubectl sees it
    assert got.spec.renew_time == datetime.fromtimestamp(T0 + 60.5, UTC)
    assert got.spec.acquire_time == datetime.fromtimestamp(T0, UTC)
    assert got.spec.lease_duration_seconds == 3600

    # a pool without a TTL: a Lease with no duration; a document that is no pool: none
    await store.put("forever", pool_doc("forever", ttl=None, created=T0, renewed=T0), None)
    forever = fake.object("leases", NAMESPACE, "sie-pool-forever")
    assert forever is not None and "leaseDurationSeconds" not in forever["spec"]
    await store.put("opaque", b'{"v": 1}', None)
    assert fake.object("leases", NAMESPACE, "sie-pool-opaque") is None
    assert set(await store.list_pools()) == {"acme", "forever", "opaque"}


async def test_a_lease_write_that_fails_does_not_fail_the_put(
    fake: FakeKubernetes, store: KubernetesPoolStore
) -> None:
    fake.fail_next(1, 503, path="/leases")
    r1 = await store.put("acme", pool_doc("acme", ttl=60, created=T0, renewed=T0), None)
    assert fake.object("leases", NAMESPACE, "sie-pool-acme") is None
    assert (await store.get("acme")) is not None
    r2 = await store.put("acme", pool_doc("acme", ttl=60, created=T0, renewed=T0 + 1), r1)
    lease = fake.object("leases", NAMESPACE, "sie-pool-acme")  # mirrored on the next write
    assert lease is not None and lease["spec"]["renewTime"] == micro(T0 + 1) and r2 != r1


async def test_deleting_the_pool_removes_its_lease(
    fake: FakeKubernetes, store: KubernetesPoolStore
) -> None:
    r1 = await store.put("acme", pool_doc("acme", ttl=60, created=T0, renewed=T0), None)
    await store.delete("acme", r1)
    assert fake.names("configmaps", NAMESPACE) == [] and fake.names("leases", NAMESPACE) == []
    assert (
        "DELETE",
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/sie-pool-acme",
    ) in fake.requests

    # deleted by someone else (kubectl delete configmap): the owner reference collects it
    await store.put("acme", pool_doc("acme", ttl=60, created=T0, renewed=T0), None)
    assert fake.names("leases", NAMESPACE) == ["sie-pool-acme"]
    core = client.CoreV1Api(store.api_client)
    await core.delete_namespaced_config_map("sie-pool-acme", NAMESPACE)
    assert fake.names("leases", NAMESPACE) == []
    assert await store.get("acme") is None and await store.list_pools() == {}


async def test_names_map_to_valid_distinct_objects(store: KubernetesPoolStore) -> None:
    names = ["a_b", "a-b", "ab", "a_", "_a", "-a", "a-", "_", "a__b", "x" * 63, "_" * 63]
    objects = {object_name(n) for n in names}
    assert len(objects) == len(names)  # injective
    assert object_name("a_b") == "sie-pool-a.b" and object_name("acme") == "sie-pool-acme"
    revisions = {n: await store.put(n, f'{{"n": "{n}"}}'.encode(), None) for n in names}
    listed = await store.list_pools()
    assert set(listed) == set(names)
    for n in names:
        assert listed[n] == (f'{{"n": "{n}"}}'.encode(), revisions[n])
        assert await store.get(n) == listed[n]
    await store.delete("a_b", revisions["a_b"])
    assert await store.get("a_b") is None and await store.get("a-b") is not None


async def test_an_unchanged_write_keeps_the_revision(store: KubernetesPoolStore) -> None:
    # Kubernetes writes nothing for a replace that changes nothing (documented)
    r1 = await store.put("acme", b'{"v": 1}', None)
    assert await store.put("acme", b'{"v": 1}', r1) == r1
    r2 = await store.put("acme", b'{"v": 2}', r1)
    assert r2 != r1
    with pytest.raises(PoolConflict):
        await store.put("acme", b'{"v": 3}', r1)


async def test_two_gateways_share_pools(fake: FakeKubernetes) -> None:
    async with kubernetes_store(fake.url) as a, kubernetes_store(fake.url) as b:
        r1 = await a.put("acme", b'{"v": 1}', None)
        assert await b.get("acme") == (b'{"v": 1}', r1)
        with pytest.raises(PoolConflict):
            await b.put("acme", b'{"v": 0}', None)  # exists
        r2 = await b.put("acme", b'{"v": 2}', r1)
        assert await a.list_pools() == {"acme": (b'{"v": 2}', r2)}

        outcomes: list[str] = []

        async def write(store: KubernetesPoolStore, value: bytes) -> None:
            try:
                await store.put("acme", value, r2)
                outcomes.append("won")
            except PoolConflict:
                outcomes.append("lost")

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, a, b'{"v": "a"}')
            tg.start_soon(write, b, b'{"v": "b"}')
        assert sorted(outcomes) == ["lost", "won"]
        doc, r3 = await a.get("acme") or (b"", "")
        assert doc in (b'{"v": "a"}', b'{"v": "b"}') and await b.get("acme") == (doc, r3)

        await a.delete("acme", r3)
        assert await b.get("acme") is None
        with pytest.raises(PoolConflict):
            await b.put("acme", b'{"v": 4}', r3)  # deleted since it was read


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def expect_bus_errors(store: KubernetesPoolStore) -> None:
    calls: list[Any] = [
        store.list_pools(),
        store.get("acme"),
        store.put("acme", b"{}", None),
        store.put("acme", b"{}", "7"),
        store.delete("acme", "7"),
    ]
    for call in calls:
        with pytest.raises(BusError, match="pool store"):
            await call


async def test_a_server_that_is_down_is_a_bus_error(fake: FakeKubernetes) -> None:
    async with kubernetes_store(f"http://127.0.0.1:{free_port()}") as store:
        await expect_bus_errors(store)
    async with kubernetes_store(fake.url) as store:
        await store.put("acme", b"{}", None)
        fake.stop()  # went down after it answered
        await expect_bus_errors(store)


async def test_server_errors_and_timeouts_are_bus_errors(fake: FakeKubernetes) -> None:
    async with kubernetes_store(fake.url, timeout_s=0.3) as store:
        fake.fail_next(5, 503)
        await expect_bus_errors(store)
        fake.fail_next(5, 500)
        await expect_bus_errors(store)
        fake.delay_s = 1.0
        with pytest.raises(BusError, match="pool store"):
            await store.list_pools()
        fake.delay_s = 0.0
        assert await store.list_pools() == {}


async def test_the_in_cluster_store_outside_a_pod_is_a_bus_error() -> None:
    """``SIE_POOL_STORE=kubernetes`` (the container's ``InClusterPoolStore``) outside a
    pod: each call is a ``BusError`` the gateway logs, never a crash."""
    from sie.container import build_pool_store
    from sie.settings import ServeSettings
    from sie.transport.k8s_pools import InClusterPoolStore

    store = build_pool_store(ServeSettings(pool_store="kubernetes"), bus=None)  # type: ignore[arg-type]
    assert isinstance(store, InClusterPoolStore)
    with pytest.raises(BusError, match="not in a Kubernetes pod"):
        await store.list_pools()
