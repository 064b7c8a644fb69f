"""The ONNX Runtime encoder engines (``sie.engines.onnx``): the export cache, the load
checks (parity with torch, the int8 quality bound), the pipeline and precision rules.

The engine loads share the tests' model cache (``MODEL_CACHE/sie-models``, as
``run_stack`` and the contract suite): MiniLM is exported once per machine. Tests that
count exports use their own cache directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sie.engines.onnx.graphs as graphs
from sie.core.config import ModelConfig, parse_model_config
from sie.core.errors import ModelLoadFailed
from sie.engines.onnx.checks import (
    Int8Bounds,
    Int8Quality,
    check_int8,
    row_cosines,
    top_k_overlap,
)
from sie.engines.onnx.encoders import OnnxDenseEncoder
from sie.engines.onnx.export import FP32_FILE, weights_digest
from sie.engines.onnx.graphs import fp32_graph, precision, read_st_pipeline
from tests.conftest import CONFIGS, MINILM, MODEL_CACHE

SHARED_CACHE = MODEL_CACHE / "sie-models"


def _minilm(extra_profiles: dict[str, Any] | None = None, **top: Any) -> ModelConfig:
    from ruamel.yaml import YAML

    doc = YAML(typ="safe").load(
        (CONFIGS / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text()
    )
    doc["profiles"].update(extra_profiles or {})
    doc.update(top)
    return parse_model_config(doc)


def _engine(config: ModelConfig, profile: str, cache: Path = SHARED_CACHE) -> OnnxDenseEncoder:
    return OnnxDenseEncoder(config, config.resolve_profile(profile), "cpu", model_cache_dir=cache)


@pytest.fixture
def exports(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every ``export_graph`` call's target, in order (the real export still runs)."""
    seen: list[Path] = []
    real = graphs.export_graph

    def counting(*args: Any) -> float:
        seen.append(args[5])
        return real(*args)

    monkeypatch.setattr(graphs, "export_graph", counting)
    return seen


# -- the export cache -----------------------------------------------------------------


def _fake_weights(root: Path, config: str = '{"a": 1}') -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(config)
    (root / "model.safetensors").write_bytes(b"\0" * 64)
    return root


def test_the_export_is_cached_by_weights_hash(tmp_path: Path) -> None:
    config = _minilm()
    profile = config.resolve_profile("onnx")
    root = _fake_weights(tmp_path / "w")
    made: list[Path] = []

    def export(target: Path) -> None:
        made.append(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"graph")

    first, shipped = fp32_graph(
        config, profile, root, tmp_path / "cache", head="encoder", export=export
    )
    again, _ = fp32_graph(config, profile, root, tmp_path / "cache", head="encoder", export=export)
    assert not shipped and first == again == made[0] and len(made) == 1  # reused
    assert first.name == FP32_FILE and first.is_relative_to(tmp_path / "cache" / "onnx")
    digest = weights_digest(root)
    (root / "config.json").write_text('{"a": 2}')  # new weights: a new key, a new export
    assert weights_digest(root) != digest
    changed, _ = fp32_graph(
        config, profile, root, tmp_path / "cache", head="encoder", export=export
    )
    assert len(made) == 2 and changed != first and changed.parent != first.parent
    other_head, _ = fp32_graph(config, profile, root, tmp_path / "cache", head="mlm", export=export)
    assert len(made) == 3 and other_head.parent != changed.parent


def test_a_directory_without_weights_cannot_be_exported(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadFailed, match=r"no \*\.safetensors"):
        weights_digest(tmp_path)


@pytest.mark.slow
def test_a_second_load_reuses_the_exported_graph(tmp_path: Path, exports: list[Path]) -> None:
    config = _minilm()
    first = _engine(config, "onnx", tmp_path)
    first.load()
    assert first.graph_path is not None and exports == [first.graph_path]
    stamp = first.graph_path.stat().st_mtime_ns
    first.unload()
    second = _engine(config, "onnx", tmp_path)
    second.load()
    assert exports == [first.graph_path] and second.graph_path == first.graph_path
    assert second.graph_path.stat().st_mtime_ns == stamp
    second.unload()


@pytest.mark.slow
def test_a_shipped_model_onnx_is_used_as_is(
    tmp_path: Path, minilm_path: Path, exports: list[Path]
) -> None:
    seed = _engine(_minilm(), "onnx")
    seed.load()  # the shared cache's export stands in for a graph a package ships
    assert seed.graph_path is not None
    root = tmp_path / "weights"
    root.mkdir()
    for p in minilm_path.iterdir():
        os.symlink(p, root / p.name)
    os.symlink(seed.graph_path, root / "model.onnx")
    exports.clear()
    engine = _engine(_minilm(weights_path=str(root), hf_id=None), "onnx", tmp_path / "cache")
    engine.load()
    assert engine.graph_path == root / "model.onnx" and exports == []
    assert not (tmp_path / "cache").exists()  # nothing exported, nothing cached


# -- the load checks ------------------------------------------------------------------


@pytest.mark.slow
def test_a_graph_that_does_not_match_torch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = OnnxDenseEncoder._check_outputs

    def perturbed(self: OnnxDenseEncoder, texts: list[str]) -> dict[str, Any]:
        out = real(self, texts)
        out["dense"] = out["dense"] + np.float32(0.01) * np.sign(out["dense"])
        return out

    monkeypatch.setattr(OnnxDenseEncoder, "_check_outputs", perturbed)
    engine = _engine(_minilm(), "onnx")
    with pytest.raises(ModelLoadFailed) as err:
        engine.load()
    assert "does not reproduce the torch pipeline: cosine 0.99" in err.value.message
    assert "< 1e-05" not in err.value.message and "dense of the" in err.value.message
    assert err.value.fields["error_class"] == "CONFIG" and err.value.fields["permanent"]


@pytest.mark.slow
def test_int8_passes_its_bound_on_minilm_and_is_refused_under_an_impossible_one() -> None:
    engine = _engine(_minilm(), "onnx-int8")
    engine.load()
    q = engine.int8_quality
    bounds = Int8Bounds()
    assert engine.precision == "int8" and engine.graph_path is not None
    assert "int8" in engine.graph_path.name and engine.parity_cosine >= 0.99999
    assert q.min_cosine >= bounds.min_cosine and q.mean_cosine >= bounds.mean_cosine
    assert q.top10_overlap >= bounds.top10_overlap
    engine.unload()
    strict = {
        "extends": "default",
        "adapter_path": "sie.engines.onnx.encoders:OnnxDenseEncoder",
        "compute_precision": "int8",
        "adapter_options": {"loadtime": {"int8_min_cosine": 0.99999}},
    }
    refused = _engine(_minilm({"strict": strict}), "strict")
    with pytest.raises(ModelLoadFailed) as err:
        refused.load()
    msg = err.value.message
    assert "int8 quantisation loses too much" in msg and "(bound 0.99999)" in msg
    assert "mean cosine" in msg and "top-10 agreement" in msg
    assert err.value.fields["error_class"] == "CONFIG"


@pytest.mark.slow
def test_int8_with_token_scales_is_closer_to_float32_and_batch_invariant() -> None:
    engine = _engine(_minilm(), "onnx-int8")
    engine.load()
    tensor_q = engine.int8_quality
    assert engine.int8_scales == "tensor"
    engine.unload()
    token = {
        "extends": "default",
        "adapter_path": "sie.engines.onnx.encoders:OnnxDenseEncoder",
        "compute_precision": "int8",
        "adapter_options": {"loadtime": {"int8_activation_scales": "token"}},
    }
    engine = _engine(_minilm({"token": token}), "token")
    engine.load()
    try:
        q = engine.int8_quality
        assert engine.int8_scales == "token" and "tokenscales" in engine.graph_path.name
        assert q.min_cosine > tensor_q.min_cosine and q.mean_cosine > tensor_q.mean_cosine
        assert q.top10_overlap >= tensor_q.top10_overlap
        # a text's vector does not depend on the batch its tokens are padded into
        texts = ["short", "a much longer sentence about the weather in the mountains today"]
        sess = engine._sessions
        assert sess is not None and engine._inputs is not None
        feats = engine._inputs.features(texts)  # one padded batch, both texts
        together = sess.run(feats)
        alone = sess.run(engine._inputs.features(texts[:1]))
        n = alone.shape[1]
        np.testing.assert_allclose(together[0, :n], alone[0], rtol=0, atol=1e-5)
    finally:
        engine.unload()


def test_int8_activation_scales_must_be_known() -> None:
    bad = {
        "extends": "default",
        "adapter_path": "sie.engines.onnx.encoders:OnnxDenseEncoder",
        "compute_precision": "int8",
        "adapter_options": {"loadtime": {"int8_activation_scales": "row"}},
    }
    with pytest.raises(
        ModelLoadFailed, match="int8_activation_scales must be one of tensor, token"
    ):
        _engine(_minilm({"bad": bad}), "bad").load()


def test_int8_gate_measures() -> None:
    rng = np.random.default_rng(0)
    fp32 = rng.normal(size=(20, 16)).astype(np.float32)
    same = check_int8("m", fp32, fp32.copy(), Int8Bounds())
    assert same == Int8Quality(pytest.approx(1.0), pytest.approx(1.0), 1.0)
    noisy = fp32 + rng.normal(scale=2.0, size=fp32.shape).astype(np.float32)
    with pytest.raises(ModelLoadFailed, match=r"min cosine 0\.[0-9]+ \(bound 0\.95\)"):
        check_int8("m", fp32, noisy, Int8Bounds())


@pytest.mark.parametrize("bad", [1.5, -0.1, "0.9", True])
def test_int8_bounds_are_numbers_in_0_1(bad: Any) -> None:
    with pytest.raises(ModelLoadFailed, match=r"loadtime\.int8_min_top10 must be a number"):
        Int8Bounds.from_loadtime({"int8_min_top10": bad}, "m")
    assert Int8Bounds.from_loadtime({"int8_min_cosine": 1}, "m").min_cosine == 1.0


def test_row_cosines_and_top_k_overlap() -> None:
    a = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    b = np.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    assert row_cosines(a, b).tolist() == [1.0, 1.0, 0.0]  # zero and zero: equal
    with pytest.raises(ValueError):
        row_cosines(a, b[:2])
    unit = np.eye(12)[:, :12] + 0.01
    assert top_k_overlap(unit, unit, k=10) == 1.0


# -- pipeline and precision -----------------------------------------------------------


def _pipeline_dir(root: Path, modules: list[str], pooling: dict[str, Any]) -> Path:
    root.mkdir()
    doc = [
        {"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_{m}", "type": f"st.models.{m}"}
        for i, m in enumerate(modules)
    ]
    (root / "modules.json").write_text(json.dumps(doc))
    for i, m in enumerate(modules):
        if m == "Pooling":
            (root / f"{i}_{m}").mkdir()
            (root / f"{i}_{m}" / "config.json").write_text(json.dumps(pooling))
    return root


def test_the_pipeline_is_read_from_modules_json(tmp_path: Path, minilm_path: Path) -> None:
    assert read_st_pipeline(minilm_path, MINILM) == graphs.StPipeline("mean", True, False)
    cls = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    got = read_st_pipeline(_pipeline_dir(tmp_path / "cls", ["Transformer", "Pooling"], cls), "m")
    assert got == graphs.StPipeline("cls", False, False)
    named = _pipeline_dir(tmp_path / "named", ["Transformer", "Pooling"], {"pooling_mode": "mean"})
    assert read_st_pipeline(named, "m").pooling == "mean"
    (tmp_path / "plain").mkdir()
    assert read_st_pipeline(tmp_path / "plain", "m") == graphs.StPipeline("mean", False, False)


@pytest.mark.parametrize(
    ("modules", "pooling", "message"),
    [
        (["Transformer", "Pooling", "Dense"], {"pooling_mode_mean_tokens": True}, "Dense"),
        (["Transformer", "Pooling"], {"pooling_mode_max_tokens": True}, "max_tokens"),
        (["Pooling"], {"pooling_mode_mean_tokens": True}, "not a Transformer"),
    ],
)
def test_a_pipeline_the_graph_cannot_reproduce_is_refused(
    tmp_path: Path, modules: list[str], pooling: dict[str, Any], message: str
) -> None:
    with pytest.raises(ModelLoadFailed, match=message) as err:
        read_st_pipeline(_pipeline_dir(tmp_path / "p", modules, pooling), "m")
    assert "use a torch profile" in err.value.message


def test_precision_is_float32_or_int8() -> None:
    config = _minilm({"half": {"extends": "default", "compute_precision": "float16"}})
    assert precision(config.resolve_profile("onnx"), "m") == "float32"
    assert precision(config.resolve_profile("onnx-int8"), "m") == "int8"
    assert precision(config.resolve_profile("default"), "m") == "float32"
    with pytest.raises(ModelLoadFailed, match="compute_precision 'float16'"):
        precision(config.resolve_profile("half"), "m")


def test_the_profiles_route_to_the_onnx_bundle_module() -> None:
    from sie.core.config import parse_bundle
    from sie.core.registry import ModelRegistry

    registry = ModelRegistry()
    registry.install_bundles(
        [parse_bundle((CONFIGS.parent / "bundles" / "default.yaml").read_text())]
    )
    config = _minilm()
    assert set(registry.validate_model_config(config)) >= {"default", "onnx", "onnx-int8"}
    registry.add_model_config(config)
    entry, _ = registry.resolve(f"{MINILM}:onnx-int8")
    assert entry.profile.adapter_module == "sie.engines.onnx.encoders"
    assert entry.profile.compute_precision == "int8"
    assert entry.profile.runtime == {"normalize": True}  # inherited from default
    assert registry.resolve(MINILM)[0].profile.adapter_module.endswith("sentence_transformers")


# -- SPLADE -----------------------------------------------------------------------------


@pytest.mark.slow
def test_splade_on_onnx_gives_the_torch_sparse_vectors() -> None:
    from sie.engines.encoders.sentence_transformers import SparseEncoder
    from sie.engines.onnx.encoders import OnnxSparseEncoder

    config = parse_model_config((CONFIGS / "rasyosef__splade-tiny.yaml").read_text())
    assert config.resolve_profile("onnx").adapter_path.endswith(":OnnxSparseEncoder")  # shipped
    torch_engine = SparseEncoder(config, config.resolve_profile(), "cpu")
    torch_engine.load()
    engine = OnnxSparseEncoder(
        config, config.resolve_profile("onnx"), "cpu", model_cache_dir=SHARED_CACHE
    )
    engine.load()
    assert engine.sparse_dim == 30522 and engine.parity_cosine >= 0.99999
    texts = ["what is splade", "SPLADE expands documents with related terms.", "x " * 600]
    prepared, counts = engine.prepare(texts, instruction=None, is_query=False, options={})
    for opts in ({}, {"max_active_dims": 5}):
        got = engine.encode(prepared, output_types=("sparse",), options=opts, lengths=counts)
        want = torch_engine.encode(prepared, output_types=("sparse",), options=opts)
        for (gi, gv), (wi, wv) in zip(got["sparse"], want["sparse"], strict=True):
            np.testing.assert_array_equal(gi, wi)
            np.testing.assert_allclose(gv, wv, atol=1e-4)
    pairs = [("what is splade", texts[1]), ("what is splade", texts[2])]
    assert engine.score(pairs, instruction=None, options={}) == pytest.approx(
        torch_engine.score(pairs, instruction=None, options={}), abs=1e-3
    )
