"""Pool specs, leases and assignment (sie.core.pools; docs/pools.md)."""

from __future__ import annotations

import pytest

from sie.core.errors import InvalidInput
from sie.core.pools import (
    Pool,
    WorkerRef,
    admits,
    assign,
    canonical_name,
    capped,
    hrw_pick,
    parse_spec,
    pool_state,
)


def test_names_are_validated_and_lowercased() -> None:
    assert canonical_name(" Acme-1_x ", "name") == "acme-1_x"
    for bad in ("", "a.b", "a b", "x" * 64, "ü", 7, None):
        with pytest.raises(InvalidInput) as exc:
            canonical_name(bad, "name")
        assert exc.value.fields["field"] == "name"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpus": {"l4": 1}}, "name"),
        ({"name": "acme"}, "gpus"),
        ({"name": "acme", "gpus": {}}, "gpus"),
        ({"name": "acme", "gpus": {"l4": -1}}, "gpus"),
        ({"name": "acme", "gpus": {"l4": True}}, "gpus"),
        ({"name": "acme", "gpus": {"L4": 1, "l4": 2}}, "gpus"),
        ({"name": "acme", "gpus": {"l 4": 1}}, "gpus.l 4"),
        ({"name": "acme", "gpus": {"l4": 1}, "ttl_seconds": 0}, "ttl_seconds"),
        ({"name": "acme", "gpus": {"l4": 1}, "queue_pool": "a.b"}, "queue_pool"),
        ({"name": "acme", "gpus": {"l4": 1}, "pinned_models": "m"}, "pinned_models"),
        ({"name": "acme", "gpus": {"l4": 1}, "surprise": 1}, "surprise"),
        ({"name": "default", "gpus": {"l4": 1}}, "name"),
        ({"name": "DEFAULT", "gpus": {"l4": 1}}, "name"),
    ],
)
def test_bad_specs_name_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        parse_spec(body)
    assert exc.value.fields["field"] == field, exc.value.message


def test_a_spec_is_canonical() -> None:
    spec = parse_spec(
        {"name": "Acme", "gpus": {"L4": 2}, "gpu_caps": {"l4": 3}, "bundle": "Default"}
    )
    assert (spec.name, spec.gpus, spec.gpu_caps, spec.bundle) == (
        "acme",
        {"l4": 2},
        {"l4": 3},
        "default",
    )
    assert spec.queue_pool == "default" and spec.ttl_seconds is None


def test_leases_expire_from_the_last_renewal() -> None:
    spec = parse_spec({"name": "acme", "gpus": {"l4": 1}, "ttl_seconds": 60})
    pool = Pool(spec=spec, created_at=1000.0, last_renewed=1030.0)
    assert pool.expires_at() == 1090.0
    assert not pool.expired(1089.9) and pool.expired(1090.0)
    forever = Pool(spec=parse_spec({"name": "b", "gpus": {"l4": 1}}), created_at=0, last_renewed=0)
    assert forever.expires_at() is None and not forever.expired(1e12)


W = [
    WorkerRef("w3", "default", "l4", "default"),
    WorkerRef("w1", "default", "L4", "default"),
    WorkerRef("w2", "default", "l4", "sglang"),
    WorkerRef("w4", "default", "a100", "default"),
    WorkerRef("w5", "gpu", "l4", "default"),
    WorkerRef("w6", "default", "l4", "default", ready=False),
]


def ids(ws: list[WorkerRef]) -> list[str]:
    return [w.worker_id for w in ws]


def test_assignment_is_deterministic_and_respects_profile_bundle_cap_and_queue_pool() -> None:
    spec = parse_spec({"name": "acme", "gpus": {"l4": 2}})
    assert ids(assign(spec, W)) == ["w1", "w2", "w3"]
    assert ids(assign(spec, list(reversed(W)))) == ["w1", "w2", "w3"]  # any order in
    capped = parse_spec({"name": "acme", "gpus": {"l4": 1}, "gpu_caps": {"l4": 2}})
    assert ids(assign(capped, W)) == ["w1", "w2"]
    bundled = parse_spec({"name": "acme", "gpus": {"l4": 1, "a100": 1}, "bundle": "default"})
    assert ids(assign(bundled, W)) == ["w1", "w3", "w4"]
    gpu = parse_spec({"name": "acme", "gpus": {"l4": 1}, "queue_pool": "gpu"})
    assert ids(assign(gpu, W)) == ["w5"]


def test_state_follows_the_required_workers_and_the_lease() -> None:
    spec = parse_spec({"name": "acme", "gpus": {"l4": 3}, "ttl_seconds": 10})
    pool = Pool(spec=spec, created_at=0, last_renewed=0)
    assert pool_state(pool, assign(spec, W), now=5) == "active"
    need_more = Pool(
        spec=parse_spec({"name": "a", "gpus": {"l4": 4}}), created_at=0, last_renewed=0
    )
    assert pool_state(need_more, assign(need_more.spec, W), now=5) == "pending"
    assert pool_state(pool, assign(spec, W), now=10) == "expired"


def test_rendezvous_choice_is_stable_spread_and_moves_only_a_leaving_workers_keys() -> None:
    workers = [f"w{i}" for i in range(4)]
    keys = [f"req-{i}" for i in range(2000)]
    picks = {k: hrw_pick(workers, k) for k in keys}
    assert picks == {k: hrw_pick(list(reversed(workers)), k) for k in keys}  # order-free
    counts = {w: list(picks.values()).count(w) for w in workers}
    assert all(400 <= n <= 600 for n in counts.values()), counts
    after = {k: hrw_pick(workers[:-1], k) for k in keys}
    moved = {k for k in keys if after[k] != picks[k]}
    assert moved == {k for k in keys if picks[k] == "w3"}
    assert hrw_pick([], "x") is None


def test_a_worker_admits_only_what_its_pools_assign_it() -> None:
    spec = parse_spec({"name": "acme", "gpus": {"l4": 1}, "gpu_caps": {"l4": 1}})
    pool = Pool(spec=spec, created_at=0, last_renewed=0, assigned_workers=("w1",))
    w1, w2 = WorkerRef("w1", "default", "L4", "b"), WorkerRef("w2", "default", "l4", "b")
    assert capped(spec, "L4") and not capped(spec, "a100")
    assert admits(pool, w1, 1.0) and not admits(pool, w2, 1.0)
    assert not admits(None, w1, 1.0)  # unknown: fails closed
    # uncapped: every worker of its lanes; other profiles, queue pools, bundles: none
    open_ = Pool(spec=parse_spec({"name": "o", "gpus": {"l4": 1}}), created_at=0, last_renewed=0)
    assert admits(open_, w2, 1.0)
    assert not admits(open_, WorkerRef("w3", "default", "a100", "b"), 1.0)
    assert not admits(open_, WorkerRef("w3", "other", "l4", "b"), 1.0)
    bundled = parse_spec({"name": "x", "gpus": {"l4": 1}, "bundle": "c"})
    assert not admits(Pool(spec=bundled, created_at=0, last_renewed=0), w1, 1.0)
    # expired: nothing
    leased = parse_spec({"name": "t", "gpus": {"l4": 1}, "ttl_seconds": 5})
    assert not admits(Pool(spec=leased, created_at=0, last_renewed=0), w1, 5.0)
