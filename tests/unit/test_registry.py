"""ModelRegistry resolution (architecture §16.1) and atomic snapshots."""

import threading

import pytest

from sie.core.config import parse_bundle, parse_model_config
from sie.core.errors import ModelNotFound, UnroutableModel
from sie.core.registry import ModelRegistry

DEFAULT = parse_bundle({"name": "default", "priority": 10, "adapters": ["eng.st", "eng.clip"]})
SGLANG = parse_bundle({"name": "sglang", "priority": 20, "adapters": ["eng.sglang"]})
CANDLE = parse_bundle({"name": "candle", "priority": 30, "adapters": ["eng.candle", "eng.st"]})


def model(sie_id: str, **profiles: dict) -> object:
    return parse_model_config(
        {
            "sie_id": sie_id,
            "hf_id": sie_id,
            "tasks": {"encode": {"dense": {"dim": 4}}},
            "profiles": profiles,
        }
    )


def reg() -> ModelRegistry:
    r = ModelRegistry()
    r.install_bundles([CANDLE, SGLANG, DEFAULT])
    return r


def test_lowest_priority_bundle_wins_and_variants_route() -> None:
    r = reg()
    r.add_model_config(
        model(
            "intfloat/e5-small-v2",
            default={"adapter_path": "eng.st:Dense", "max_batch_tokens": 8},
            candle={"adapter_path": "eng.candle:Emb", "max_batch_tokens": 8},
            short={"extends": "default", "max_batch_tokens": 2},
        )
    )
    entry, bundle = r.resolve("intfloat/e5-small-v2")
    assert bundle == "default" and entry.bundles == ("default", "candle")
    entry, bundle = r.resolve("intfloat/e5-small-v2:candle")
    assert bundle == "candle" and entry.profile.name == "candle"
    entry, bundle = r.resolve("intfloat/e5-small-v2:short")
    assert bundle == "default" and entry.profile.max_batch_tokens == 2
    # pinning a compatible bundle works; an incompatible one is refused
    assert r.resolve("intfloat/e5-small-v2", bundle="candle")[1] == "candle"
    with pytest.raises(ModelNotFound) as exc:
        r.resolve("intfloat/e5-small-v2", bundle="sglang")
    assert exc.value.fields["compatible_bundles"] == ["default", "candle"]


def test_unknown_and_unroutable() -> None:
    r = reg()
    with pytest.raises(ModelNotFound):
        r.resolve("nope")
    with pytest.raises(ModelNotFound):
        r.resolve("nope:default")
    with pytest.raises(UnroutableModel) as exc:
        r.add_model_config(
            model("x/y", default={"adapter_path": "eng.unknown:A", "max_batch_tokens": 1})
        )
    assert exc.value.status == 422 and exc.value.fields["adapter_modules"] == ["eng.unknown"]
    assert "x/y" not in r.snapshot.configs


def test_install_bundles_recomputes_routes() -> None:
    r = reg()
    r.add_model_config(
        model("a/b", default={"adapter_path": "eng.sglang:Gen", "max_batch_tokens": 1})
    )
    assert r.resolve("a/b")[1] == "sglang"
    r.install_bundles([DEFAULT])
    with pytest.raises(ModelNotFound):
        r.resolve("a/b")
    assert "a/b" in r.snapshot.configs  # the config is kept, just not routable


def test_readers_never_see_a_torn_snapshot() -> None:
    r = reg()
    stop = threading.Event()
    torn: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            snap = r.snapshot
            for mid, entry in snap.entries.items():
                if entry.config.sie_id not in snap.configs:
                    torn.append(mid)

    t = threading.Thread(target=reader)
    t.start()
    for i in range(300):
        r.add_model_config(
            model(f"m/{i}", default={"adapter_path": "eng.st:D", "max_batch_tokens": 1})
        )
        r.install_bundles([DEFAULT, SGLANG] if i % 2 else [DEFAULT, CANDLE])
    stop.set()
    t.join()
    assert torn == []
    assert len(r.snapshot.entries) == 300


def test_replacing_with_equal_configs_keeps_the_served_objects_and_their_dumps() -> None:
    """A re-export that changes nothing (sync's bootstrap after a delta it already
    applied) keeps each unchanged config object, so its dumped YAML stays cached; a
    changed config replaces its object and its dump."""
    r = reg()
    st = {"adapter_path": "eng.st:Dense", "max_batch_tokens": 8}
    r.add_model_config(model("org/a", default=st))
    r.add_model_config(model("org/b", default=st))
    text = r.snapshot.config_yaml("org/a")
    before_b = r.snapshot.configs["org/b"]
    r.replace_models(
        [
            (model("org/a", default=st), "api"),
            (model("org/b", default={**st, "max_batch_tokens": 4}), "api"),
        ]
    )
    assert r.snapshot.cached_config_yaml("org/a") == text
    assert r.snapshot.configs["org/b"] is not before_b
    assert r.snapshot.configs["org/b"].profiles["default"].max_batch_tokens == 4
    assert r.snapshot.cached_config_yaml("org/b") is None
