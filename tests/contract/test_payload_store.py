"""Payload-store contract (sie.transport.payloads docstring; docs/api.md §11).

Every adapter runs this suite: fsspec's in-process ``memory://`` filesystem (the
embedded default) and a local directory (processes on one machine). Object stores
(s3, gs) take the same fsspec calls; they cannot run here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from sie.core.errors import PayloadUnavailable
from sie.transport.payloads import FsspecPayloadStore, payload_key

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FsspecPayloadStore]:
    if request.param == "memory":
        yield FsspecPayloadStore(f"memory://sie-payloads-test-{uuid.uuid4().hex}")
    else:
        yield FsspecPayloadStore(str(tmp_path / "payloads"))


async def test_put_get_delete(store: FsspecPayloadStore) -> None:
    key = payload_key("gw-1", "req-1", 3)
    data = os.urandom(3 * 1024 * 1024)
    await store.put(key, data)
    assert await store.get(key) == data
    await store.put(key, b"again")  # overwrite
    assert await store.get(key) == b"again"
    await store.delete([key, payload_key("gw-1", "req-1", 4)])  # a missing key is fine
    with pytest.raises(PayloadUnavailable):
        await store.get(key)


@pytest.mark.parametrize(
    "key",
    ["../etc/passwd", "/abs/path", "a/../../b", "", ".hidden/x", "a/b/c/d/e/f", "a\\b", "a b"],
)
async def test_keys_never_leave_the_root(store: FsspecPayloadStore, key: str) -> None:
    with pytest.raises(PayloadUnavailable):
        await store.get(key)
    with pytest.raises(PayloadUnavailable):
        await store.put(key, b"x")


async def test_sweep_removes_only_old_payloads(store: FsspecPayloadStore) -> None:
    old, new = payload_key("gw-dead", "r", 0), payload_key("gw-live", "r", 0)
    await store.put(old, b"old")
    await anyio.sleep(1.1)  # the sweep compares stored-at times (local mtimes are in seconds)
    await store.put(new, b"new")
    assert await store.sweep(older_than_s=1.0) == 1
    assert await store.get(new) == b"new"
    with pytest.raises(PayloadUnavailable):
        await store.get(old)
    assert await store.sweep(older_than_s=1.0) == 0


async def test_many_requests_leave_nothing_behind(store: FsspecPayloadStore) -> None:
    """Found by a hostile trial: one empty directory per request was left behind."""
    for i in range(200):
        key = payload_key("gw-1", f"req-{i}", 0)
        await store.put(key, b"x")
        await store.delete([key])
    found = store.fs.find(store.root, withdirs=True) if store.fs.exists(store.root) else []
    assert [p for p in found if p.rstrip("/") != store.root] == []
    if hasattr(store.fs, "pseudo_dirs"):  # the memory filesystem's directory list
        assert not [d for d in store.fs.pseudo_dirs if d.startswith(store.root + "/")]
