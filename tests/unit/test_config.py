"""Model config / bundle schema (reference §3.1, §3.3; architecture §16.3)."""

import pytest

from sie.core.config import parse_bundle, parse_model_config, validate_model_id
from sie.core.errors import ConfigError

BASE = """
sie_id: org/m
hf_id: org/m
tasks: {encode: {dense: {dim: 8}}}
profiles:
  default:
    adapter_path: sie.engines.encoders.sentence_transformers:DenseEncoder
    max_batch_tokens: 1024
    adapter_options: {loadtime: {a: 1}, runtime: {normalize: true}}
  fast:
    extends: default
    max_batch_tokens: 64
    adapter_options: {runtime: {normalize: false}}
"""


def test_parses_and_resolves_extends() -> None:
    cfg = parse_model_config(BASE)
    fast = cfg.resolve_profile("fast")
    assert fast.adapter_path == "sie.engines.encoders.sentence_transformers:DenseEncoder"
    assert fast.max_batch_tokens == 64
    assert fast.runtime == {"normalize": False}  # non-empty child dict replaces the parent's
    assert fast.loadtime == {"a": 1}  # empty child dict inherits
    assert cfg.outputs == ["dense"] and cfg.dims == {"dense": 8}
    assert cfg.effective_pool == "default"


HEAD = "sie_id: org/m\nhf_id: org/m\n"
PROFILE = "profiles: {default: {adapter_path: a.b:C, max_batch_tokens: 1}}\n"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (HEAD + "bogus: 1\ntasks: {}\n" + PROFILE, "bogus: unknown key"),
        (
            HEAD + "tasks: {}\nprofiles: {default: {adapter_path: a.b:C, max_batch_tokenz: 3}}\n",
            "profiles.default.max_batch_tokenz: unknown key",
        ),
        (
            HEAD + "tasks: {encode: {dense: {dim: 8, width: 3}}}\n" + PROFILE,
            "tasks.encode.dense.width: unknown key",
        ),
        (
            HEAD
            + "tasks: {}\nprofiles: {default: {adapter_path: a.b:C, max_batch_tokens: 1, adapter_options: {boot: {}}}}\n",
            "adapter_options.boot: unknown key",
        ),
    ],
)
def test_unknown_keys_are_named(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_model_config(text)
    assert needle in exc.value.message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "sie_id: m\nhf_id: m\ntasks: {}\nprofiles: {fast: {adapter_path: a:B, max_batch_tokens: 1}}\n",
            "default",
        ),
        (
            "sie_id: m\ntasks: {}\nprofiles: {default: {adapter_path: a:B, max_batch_tokens: 1}}\n",
            "hf_id",
        ),
        (
            "sie_id: m\nhf_id: m\ntasks: {}\nprofiles: {default: {max_batch_tokens: 1}}\n",
            "adapter_path",
        ),
        (
            "sie_id: m\nhf_id: m\ntasks: {}\nprofiles: {default: {extends: nope}}\n",
            "no profile named",
        ),
        (
            "sie_id: ../x\nhf_id: m\ntasks: {}\nprofiles: {default: {adapter_path: a:B, max_batch_tokens: 1}}\n",
            "traversal",
        ),
        (
            "sie_id: m\nhf_id: m\npool: 'a b'\ntasks: {}\nprofiles: {default: {adapter_path: a:B, max_batch_tokens: 1}}\n",
            "pool",
        ),
        (
            "sie_id: m\nhf_id: m\ntasks: {}\nprofiles: {default: {adapter_path: a:B, "
            "max_batch_tokens: 1}, q: {extends: default, compute_precision: int8}}\n",
            "int8 is served by the ONNX engines",
        ),
        ("- just\n- a list\n", "mapping"),
        ("sie_id: [unclosed\n", "invalid YAML"),
    ],
)
def test_invalid_configs(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_model_config(text)
    assert needle in exc.value.message


def test_pool_is_lowercased() -> None:
    cfg = parse_model_config(BASE + "pool: Tenant-A\n")
    assert cfg.effective_pool == "tenant-a"


@pytest.mark.parametrize("bad", ["status", "org/status", "a\\b", "-x", "a b", "a:b"])
def test_model_id_rules(bad: str) -> None:
    with pytest.raises(ConfigError):
        validate_model_id(bad)


def test_bundle_defaults_name_and_rejects_unknown() -> None:
    b = parse_bundle("priority: 5\nadapters: [x.y]\n", default_name="gpu")
    assert (b.name, b.priority, b.adapters) == ("gpu", 5, ["x.y"])
    with pytest.raises(ConfigError, match="colour: unknown key"):
        parse_bundle("name: b\ncolour: red\n")


def test_shipped_configs_load() -> None:
    from sie.control.seed import load_bundles, load_models
    from tests.conftest import BUNDLES, CONFIGS

    models = load_models(str(CONFIGS))
    bundles = load_bundles(str(BUNDLES))
    assert sorted(m.sie_id for m in models) == [
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "nationaldesignstudio/rampart",
        "rasyosef/splade-tiny",
        "sentence-transformers/all-MiniLM-L6-v2",
    ]
    assert (
        bundles[0].name == "default"
        and "sie.engines.encoders.sentence_transformers" in bundles[0].adapters
    )
