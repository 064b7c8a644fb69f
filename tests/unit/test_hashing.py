"""bundle_config_hash vectors (architecture §7; reference §5.7)."""

import hashlib

from sie.core.config import parse_bundle, parse_model_config
from sie.core.hashing import (
    bundle_config_hash,
    bundle_document,
    bundles_hash,
    canonical_json,
    canonicalize_adapter_options,
)

BUNDLE = parse_bundle(
    {"name": "default", "priority": 10, "adapters": ["sie.engines.sentence_transformers"]}
)
OTHER = parse_bundle({"name": "gpu", "priority": 20, "adapters": ["sie.engines.vllm"]})

MINI = parse_model_config(
    {
        "sie_id": "sentence-transformers/all-MiniLM-L6-v2",
        "hf_id": "sentence-transformers/all-MiniLM-L6-v2",
        "tasks": {"encode": {"dense": {"dim": 384}}},
        "profiles": {
            "default": {
                "adapter_path": "sie.engines.sentence_transformers:DenseEncoder",
                "max_batch_tokens": 16384,
                "adapter_options": {
                    "loadtime": {"trust_remote_code": False},
                    "runtime": {"normalize": True},
                },
            },
            "short": {"extends": "default", "max_batch_tokens": 512},
            "llm": {"adapter_path": "sie.engines.vllm:Generator", "max_batch_tokens": 1},
        },
    }
)

# The canonical JSON, written out by hand: sorted keys, compact, profiles by name,
# the vllm profile excluded from this bundle, adapter_options kept (a truthy value).
MINI_JSON = (
    '[{"profiles":['
    '{"config":{"adapter_options":{"loadtime":{"trust_remote_code":false},"runtime":{"normalize":true}},'
    '"adapter_path":"sie.engines.sentence_transformers:DenseEncoder","compute_precision":null,'
    '"max_batch_tokens":16384},"name":"default"},'
    '{"config":{"adapter_options":null,"adapter_path":null,"compute_precision":null,'
    '"max_batch_tokens":512},"name":"short"}],'
    '"revision":null,"sie_id":"sentence-transformers/all-MiniLM-L6-v2"}]'
)
MINI_HASH = "88327438d76f497bf19c976ba83f167e98c1994b2f12a30114d6621427dd1b58"


def test_canonical_document_matches_hand_written_json() -> None:
    assert canonical_json(bundle_document([MINI], BUNDLE)).decode() == MINI_JSON


def test_fixed_vector() -> None:
    assert hashlib.sha256(MINI_JSON.encode()).hexdigest() == MINI_HASH
    assert bundle_config_hash([MINI], BUNDLE) == MINI_HASH


def test_falsy_adapter_options_canonicalise_to_null() -> None:
    # architecture §7: every value Python-falsy -> None, including {"flag": 0}.
    for falsy in ({"flag": 0}, {}, {"a": None, "b": False, "c": 0.0, "d": "", "e": [], "f": {}}):
        assert canonicalize_adapter_options(falsy) is None
    assert canonicalize_adapter_options({"flag": 1}) == {"flag": 1}
    assert canonicalize_adapter_options({"loadtime": {"flag": 0}}) == {"loadtime": {"flag": 0}}
    assert canonicalize_adapter_options(None) is None


def test_empty_options_hash_like_absent_options() -> None:
    base = MINI.model_dump(exclude_unset=True)
    with_empty = {
        **base,
        "profiles": {
            "default": {
                **base["profiles"]["default"],
                "adapter_options": {"loadtime": {}, "runtime": {}},
            }
        },
    }
    without = {
        **base,
        "profiles": {
            "default": {
                k: v for k, v in base["profiles"]["default"].items() if k != "adapter_options"
            }
        },
    }
    assert bundle_config_hash([parse_model_config(with_empty)], BUNDLE) == bundle_config_hash(
        [parse_model_config(without)], BUNDLE
    )


def test_revision_and_routable_fields_change_the_hash_others_do_not() -> None:
    base = MINI.model_dump(exclude_unset=True)
    pinned = parse_model_config({**base, "hf_revision": "a" * 40})
    longer = parse_model_config({**base, "max_sequence_length": 128})  # not a routable field
    assert bundle_config_hash([pinned], BUNDLE) != MINI_HASH
    assert bundle_config_hash([longer], BUNDLE) == MINI_HASH


def test_unrelated_bundle_and_empty_set() -> None:
    assert bundle_config_hash([], BUNDLE) == ""
    assert bundle_config_hash([MINI], parse_bundle({"name": "x", "adapters": ["nothing"]})) == ""
    only_llm = bundle_document([MINI], OTHER)
    assert [p["name"] for p in only_llm[0]["profiles"]] == ["llm"]


def test_pool_scope() -> None:
    tenant = parse_model_config(
        {**MINI.model_dump(exclude_unset=True), "sie_id": "t/m", "pool": "tenant"}
    )
    assert bundle_config_hash([MINI, tenant], BUNDLE, pool="default") == MINI_HASH
    assert bundle_config_hash([MINI, tenant], BUNDLE, pool="tenant") != MINI_HASH


def test_bundles_hash_is_order_independent() -> None:
    assert bundles_hash([BUNDLE, OTHER]) == bundles_hash([OTHER, BUNDLE])
    assert bundles_hash([]) == ""
    assert (
        bundles_hash([BUNDLE])
        == hashlib.sha256(
            b'[{"adapters":["sie.engines.sentence_transformers"],"name":"default","priority":10}]'
        ).hexdigest()
    )
