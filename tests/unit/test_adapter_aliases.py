"""Adapter paths that name an engine module by its pre-reorganisation path keep working
(docs/architecture.md "Where things go"): they match the bundle and import the moved class,
while the stored text, and so the config hash, stays as written."""

import importlib

import pytest

from sie.core.config import (
    RENAMED_ADAPTER_MODULES,
    canonical_adapter_path,
    parse_bundle,
    parse_model_config,
)
from sie.core.hashing import bundle_config_hash
from sie.engines.base import load_engine_class
from sie.engines.encoders.sentence_transformers import DenseEncoder

NEW_BUNDLE = parse_bundle(
    {"name": "default", "adapters": ["sie.engines.encoders.sentence_transformers"]}
)


def _config(adapter_path: str):  # type: ignore[no-untyped-def]
    return parse_model_config(
        {
            "sie_id": "org/mini",
            "hf_id": "org/mini",
            "tasks": {"encode": {"dense": {"dim": 4}}},
            "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 64}},
        }
    )


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_ADAPTER_MODULES.items()))
def test_every_renamed_module_moved_and_its_target_imports(old: str, new: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    importlib.import_module(new)
    assert canonical_adapter_path(f"{old}:X") == f"{new}:X"
    assert canonical_adapter_path(old) == new


def test_unrenamed_paths_are_unchanged() -> None:
    assert canonical_adapter_path("acme.engines.x:Y") == "acme.engines.x:Y"


def test_old_path_config_matches_a_new_path_bundle_and_keeps_its_text() -> None:
    cfg = _config("sie.engines.sentence_transformers:DenseEncoder")
    assert cfg.profiles["default"].adapter_path == "sie.engines.sentence_transformers:DenseEncoder"
    assert NEW_BUNDLE.runs(cfg.resolve_profile("default").adapter_module)
    # a different hash from the new spelling: the text is hashed as stored
    new = _config("sie.engines.encoders.sentence_transformers:DenseEncoder")
    assert bundle_config_hash([cfg], NEW_BUNDLE) != bundle_config_hash([new], NEW_BUNDLE)
    assert bundle_config_hash([cfg], NEW_BUNDLE) != ""


def test_old_bundle_runs_new_path() -> None:
    old = parse_bundle({"name": "legacy", "adapters": ["sie.engines.sentence_transformers"]})
    assert old.runs("sie.engines.encoders.sentence_transformers")
    assert not old.runs("sie.engines.scorers.cross_encoder")


def test_old_path_loads_the_moved_class_under_either_bundle_spelling() -> None:
    for allowed in (
        ["sie.engines.encoders.sentence_transformers"],
        ["sie.engines.sentence_transformers"],
    ):
        assert (
            load_engine_class("sie.engines.sentence_transformers:DenseEncoder", allowed)
            is DenseEncoder
        )
        assert (
            load_engine_class("sie.engines.encoders.sentence_transformers:DenseEncoder", allowed)
            is DenseEncoder
        )
