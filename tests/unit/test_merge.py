"""Append-only merge rules of the config write path (architecture §3 steps 3.1-3.3)."""

from __future__ import annotations

import pytest

from sie.core.config import parse_model_config
from sie.core.epoch import ConfigEpoch
from sie.core.errors import ContentConflict, UnroutableModel, ValidationFailed
from sie.core.merge import merge_model_write
from tests.configdata import ADAPTER, EMPTY_BUNDLE, OTHER_BUNDLE, model_doc, registry


def test_new_model_creates_every_profile() -> None:
    r = merge_model_write(
        None,
        model_doc(
            profiles={
                "default": {"adapter_path": ADAPTER, "max_batch_tokens": 8},
                "fast": {"extends": "default", "max_batch_tokens": 4},
            }
        ),
    )
    assert r.created == ["default", "fast"] and r.skipped == []


def test_replay_is_a_no_op_even_with_empty_option_blocks() -> None:
    existing = parse_model_config(model_doc())
    again = model_doc()
    again["profiles"]["default"]["adapter_options"] = {"loadtime": {}, "runtime": {}}
    r = merge_model_write(existing, again)
    assert r.created == [] and r.skipped == ["default"]
    assert r.config == existing


def test_append_profile_preserves_fields_and_other_profiles() -> None:
    existing = parse_model_config(model_doc(max_sequence_length=128))
    r = merge_model_write(
        existing,
        {"sie_id": "org/m", "profiles": {"long": {"extends": "default", "max_batch_tokens": 99}}},
    )
    assert r.created == ["long"]
    assert r.config.max_sequence_length == 128
    assert set(r.config.profiles) == {"default", "long"}
    assert r.document["profiles"]["long"] == {"extends": "default", "max_batch_tokens": 99}


def test_changed_profile_body_is_409_not_422() -> None:
    # reference §9 item 11: the public implementation answers 422 here; a conflict is 409
    existing = parse_model_config(model_doc())
    changed = model_doc()
    changed["profiles"]["default"]["max_batch_tokens"] = 2048
    with pytest.raises(ContentConflict) as e:
        merge_model_write(existing, changed)
    assert e.value.status == 409 and e.value.fields["conflicting_profiles"] == ["default"]


def test_top_level_metadata_is_append_only() -> None:
    existing = parse_model_config(model_doc(max_sequence_length=128))
    with pytest.raises(ContentConflict) as e:
        merge_model_write(existing, {**model_doc(), "max_sequence_length": 256})
    assert e.value.fields["conflicting_fields"] == ["max_sequence_length"]
    default = model_doc()["profiles"]["default"]
    # setting a field left at its default would change how existing profiles are served
    with pytest.raises(ContentConflict) as e:
        merge_model_write(
            existing, {"sie_id": "org/m", "pool": "gpu", "profiles": {"x": {"extends": "default"}}}
        )
    assert e.value.fields["conflicting_fields"] == ["pool"]
    # spelling out the effective value (any case) is no change
    r = merge_model_write(
        existing, {"sie_id": "org/m", "pool": "DEFAULT", "profiles": {"default": default}}
    )
    assert r.created == [] and r.skipped == ["default"]
    tenant = parse_model_config(model_doc(pool="tenant"))
    r2 = merge_model_write(
        tenant, {"sie_id": "org/m", "pool": "TENANT", "profiles": {"x": {"extends": "default"}}}
    )
    assert r2.created == ["x"]


def test_profile_count_is_bounded() -> None:
    from sie.core.merge import MAX_PROFILES

    many = {f"p{i}": {"extends": "default"} for i in range(MAX_PROFILES)}
    with pytest.raises(ValidationFailed, match="at most"):
        merge_model_write(parse_model_config(model_doc()), {"sie_id": "org/m", "profiles": many})


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"profiles": {}}, "sie_id"),
        ({"sie_id": "org/m"}, "profiles"),
        ({"sie_id": "org/m", "profiles": []}, "profiles"),
    ],
)
def test_missing_required_fields_are_422_naming_them(doc: dict, field: str) -> None:
    with pytest.raises(ValidationFailed) as e:
        merge_model_write(None, doc)
    assert e.value.status == 422 and e.value.fields["field"] == field


def test_unknown_key_is_422_naming_it() -> None:
    with pytest.raises(ValidationFailed, match="max_batch_tokenz: unknown key"):
        merge_model_write(
            None, model_doc(profiles={"default": {"adapter_path": ADAPTER, "max_batch_tokenz": 1}})
        )
    existing = parse_model_config(model_doc())
    with pytest.raises(ValidationFailed, match=r"profiles\.new\.bogus"):
        merge_model_write(existing, {"sie_id": "org/m", "profiles": {"new": {"bogus": 1}}})


def test_registry_plan_rejects_unroutable_new_profile_but_allows_extends() -> None:
    reg = registry()
    reg.add_model_config(parse_model_config(model_doc()))
    with pytest.raises(UnroutableModel):
        reg.plan_write(
            {
                "sie_id": "org/m",
                "profiles": {"x": {"adapter_path": "nowhere.mod:C", "max_batch_tokens": 8}},
            }
        )
    assert reg.plan_write(
        {"sie_id": "org/m", "profiles": {"x": {"extends": "default"}}}
    ).created == ["x"]
    with pytest.raises(UnroutableModel):
        reg.plan_write(
            model_doc(
                "org/new", profiles={"default": {"adapter_path": "x.y:Z", "max_batch_tokens": 8}}
            )
        )


def test_registry_bundles_follow_priority() -> None:
    reg = registry(OTHER_BUNDLE, EMPTY_BUNDLE)
    reg.add_model_config(parse_model_config(model_doc()))
    assert reg.snapshot.bundles_of_model("org/m") == ["other"]


def test_epoch_only_moves_forward_unless_forced() -> None:
    e = ConfigEpoch()
    assert e.set_max(3) and not e.set_max(2) and e.get() == 3
    e.force_set(1)
    assert e.get() == 1 and e.increment() == 2
