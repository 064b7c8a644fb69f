"""Small model/bundle documents shared by the config tests (no model weights needed)."""

from __future__ import annotations

from typing import Any

from sie.core.config import Bundle, parse_bundle
from sie.core.registry import ModelRegistry

ST = "sie.engines.encoders.sentence_transformers"
ADAPTER = f"{ST}:DenseEncoder"

DEFAULT_BUNDLE = parse_bundle({"name": "default", "priority": 10, "adapters": [ST]})
OTHER_BUNDLE = parse_bundle({"name": "other", "priority": 20, "adapters": [ST]})
EMPTY_BUNDLE = parse_bundle({"name": "nothing", "priority": 5, "adapters": ["x.y"]})


def model_doc(sie_id: str = "org/m", **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "sie_id": sie_id,
        "hf_id": sie_id,
        "tasks": {"encode": {"dense": {"dim": 8}}},
        "profiles": {"default": {"adapter_path": ADAPTER, "max_batch_tokens": 1024}},
    }
    doc.update(extra)
    return doc


def model_yaml(sie_id: str = "org/m", **extra: Any) -> bytes:
    from sie.core.config import dump_yaml

    return dump_yaml(model_doc(sie_id, **extra)).encode()


def registry(*bundles: Bundle) -> ModelRegistry:
    r = ModelRegistry()
    r.install_bundles(bundles or (DEFAULT_BUNDLE,))
    return r
