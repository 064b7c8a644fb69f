"""ConfigStore contract (architecture §9; reference §5.6), over every backend we can run:
a local directory, ``memory://``, and ``s3://`` against a local moto server."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sie.control.store import ConfigStore
from sie.core.errors import ContentConflict, InvalidModelId, StoreUnavailable

BACKENDS = ["local", "memory", "s3"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(params=BACKENDS)
def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    if request.param == "memory":
        return f"memory://store-{uuid.uuid4().hex}"
    endpoint = request.getfixturevalue("moto_endpoint")
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(k, v)
    import boto3

    bucket = f"b{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    import fsspec

    fsspec.filesystem("s3").clear_instance_cache()
    return f"s3://{bucket}/sie"


def test_empty_store(store_url: str) -> None:
    s = ConfigStore(store_url)
    assert s.read_epoch() == 0 and s.list_models() == [] and s.read_model("org/m") is None


def test_write_read_list_and_slash_mapping(store_url: str) -> None:
    s = ConfigStore(store_url)
    s.write_model("org/m", "sie_id: org/m\n", 1)
    s.write_epoch(1)
    s.write_model("plain", "sie_id: plain\n", 2)
    s.write_epoch(2)
    assert s.list_models() == ["org/m", "plain"]
    assert s.read_model("org/m") == "sie_id: org/m\n"
    assert s.fs.exists(s._path("models", "org__m.yaml"))
    s.write_model("org/m", "sie_id: org/m\nx: 1\n", 3)
    assert s.read_model("org/m") == "sie_id: org/m\nx: 1\n"
    assert dict(s.load_all())["plain"] == "sie_id: plain\n"


def test_survives_reopen(store_url: str) -> None:
    s = ConfigStore(store_url)
    s.write_model("a/b", "sie_id: a/b\n", 7)
    s.write_epoch(7)
    again = ConfigStore(store_url)
    assert again.read_epoch() == 7 and again.list_models() == ["a/b"]


@pytest.mark.parametrize("content", [b"", b"\n", b"garbage", b"-3"])
def test_malformed_epoch_is_repaired_from_models_not_read_as_zero(
    store_url: str, content: bytes
) -> None:
    # architecture §9: a zero-byte epoch file must not collapse drift detection to "0 forever"
    s = ConfigStore(store_url)
    s.write_model("org/m", "sie_id: org/m\n", 4)
    s.write_model("org/n", "sie_id: org/n\n", 5)
    s._write(s._path("epoch"), content)
    assert s.read_epoch() == 5
    assert ConfigStore(store_url).read_epoch() == 5  # rewritten, not just computed


def test_epoch_behind_models_is_repaired(store_url: str) -> None:
    s = ConfigStore(store_url)
    s.write_model("org/m", "sie_id: org/m\n", 9)
    s.write_epoch(3)
    assert s.read_epoch() == 9


def test_ids_that_cannot_round_trip_are_rejected(store_url: str) -> None:
    s = ConfigStore(store_url)
    for bad in ("a__b", "../x", "status", "org/status"):
        with pytest.raises(InvalidModelId):
            s.write_model(bad, "x", 1)
    assert s.list_models() == []


def test_local_write_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    s = ConfigStore(str(tmp_path))
    s.write_model("org/m", "one\n", 1)
    real_replace = os.replace

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    os.replace = boom  # type: ignore[assignment]
    try:
        with pytest.raises(StoreUnavailable):
            s.write_model("org/m", "two\n", 2)
    finally:
        os.replace = real_replace
    assert s.read_model("org/m") == "one\n"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["org__m.yaml"]


def test_ids_sharing_a_file_name_do_not_overwrite_each_other(store_url: str) -> None:
    s = ConfigStore(store_url)
    s.write_model("acme_/x", "sie_id: acme_/x\n", 1)
    with pytest.raises(ContentConflict):
        s.write_model("acme/_x", "sie_id: acme/_x\n", 2)  # both are acme___x.yaml
    assert s.list_models() == ["acme_/x"]
    assert s.read_model("acme_/x") == "sie_id: acme_/x\n"
