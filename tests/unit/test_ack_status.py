"""Worker-ack status computation rules (architecture §6)."""

from __future__ import annotations

import pytest

from sie.control.ack_status import WorkerAck, worker_ack_status
from sie.core.config import parse_model_config
from sie.core.errors import ModelNotFound
from tests.configdata import DEFAULT_BUNDLE, OTHER_BUNDLE, model_doc, registry


def snap(*docs: dict) -> object:
    r = registry(DEFAULT_BUNDLE, OTHER_BUNDLE)
    for d in docs:
        r.add_model_config(parse_model_config(d))
    return r.snapshot


def ack(wid: str, bundle: str, h: str, *, pool: str = "default", healthy: bool = True) -> WorkerAck:
    return WorkerAck(wid, bundle, pool, h, healthy)


def test_acked_pending_and_every_bundle_listed() -> None:
    s = snap(model_doc())
    h = s.bundle_config_hash("default", "default")  # type: ignore[attr-defined]
    out = worker_ack_status(s, "org/m", [ack("w1", "default", h), ack("w2", "default", "old")], 7)  # type: ignore[arg-type]
    assert out["config_epoch"] == 7 and out["source"] == "gateway-registry"
    rows = {r["bundle_id"]: r for r in out["bundles"]}
    assert list(rows) == ["default", "other"]  # priority order
    assert rows["default"]["acked_workers"] == ["w1"] and rows["default"]["pending_workers"] == [
        "w2"
    ]
    assert rows["default"]["expected_bundle_config_hash"] == h and rows["default"]["acked"] is False
    assert rows["other"]["total_eligible_workers"] == 0 and rows["other"]["acked"] is False
    assert out["all_bundles_acked"] is False and out["no_bundles"] is False


def test_all_acked() -> None:
    s = snap(model_doc())
    workers = [ack("a", b, s.bundle_config_hash(b, "default")) for b in ("default", "other")]  # type: ignore[attr-defined]
    out = worker_ack_status(s, "org/m", workers, 1)  # type: ignore[arg-type]
    assert out["all_bundles_acked"] is True


def test_unhealthy_other_case_and_other_pool_workers_count_nowhere() -> None:
    s = snap(model_doc())
    workers = [
        ack("sick", "default", "x", healthy=False),
        ack("case", "Default", "x"),
        ack("elsewhere", "default", "x", pool="tenant"),
    ]
    row = worker_ack_status(s, "org/m", workers, 0)["bundles"][0]  # type: ignore[arg-type]
    assert (
        row["total_eligible_workers"] == 0 and row["acked_workers"] == row["pending_workers"] == []
    )


def test_pool_scoped_expectation() -> None:
    s = snap(model_doc(pool="tenant"), model_doc("org/base"))
    h = s.bundle_config_hash("default", "tenant")  # type: ignore[attr-defined]
    assert h != s.bundle_config_hash("default", "default")  # type: ignore[attr-defined]
    out = worker_ack_status(s, "org/m", [ack("t1", "default", h, pool="tenant")], 0)  # type: ignore[arg-type]
    row = out["bundles"][0]
    assert row["pool"] == "tenant" and row["acked_workers"] == ["t1"]


def test_no_bundles_is_not_acked() -> None:
    r = registry(DEFAULT_BUNDLE)
    r.add_model_config(parse_model_config(model_doc()))
    r.install_bundles([])  # the bundle went away: nothing serves the model
    out = worker_ack_status(r.snapshot, "org/m", [], 3)
    assert out == {
        "model_id": "org/m",
        "config_epoch": 3,
        "all_bundles_acked": False,
        "no_bundles": True,
        "bundles": [],
        "source": "gateway-registry",
    }


def test_unknown_model_is_404() -> None:
    with pytest.raises(ModelNotFound):
        worker_ack_status(snap(), "nope", [], 0)  # type: ignore[arg-type]
