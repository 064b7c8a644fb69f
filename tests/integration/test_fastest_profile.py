"""The MiniLM ``fastest`` profile (sie.engines.onnx.fastest) and SIE_DEFAULT_PROFILES:
the fastest engine that passes its checks serves, a refused one falls through to the
next, and a bare model id routes to the configured profile (docs/performance.md
"Choosing a MiniLM profile")."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from sie.core.config import ModelConfig, parse_model_config
from sie.engines.encoders.sentence_transformers import DenseEncoder
from sie.engines.onnx.encoders import OnnxDenseEncoder
from sie.engines.onnx.fastest import FastestDenseEncoder
from sie.engines.runtime.threads import cpu_cores
from tests.conftest import CONFIGS, MINILM, MODEL_CACHE, run_stack

pytestmark = pytest.mark.slow

CACHE = MODEL_CACHE / "sie-models"
TEXTS = ["a short query", "the quick brown fox jumps over the lazy dog near the river bank"]


def _minilm(loadtime: dict[str, Any] | None = None) -> ModelConfig:
    from ruamel.yaml import YAML

    doc = YAML(typ="safe").load(
        (CONFIGS / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text()
    )
    if loadtime:
        doc["profiles"]["fastest"]["adapter_options"] = {"loadtime": loadtime}
    return parse_model_config(doc)


def _fastest(config: ModelConfig) -> FastestDenseEncoder:
    return FastestDenseEncoder(
        config, config.resolve_profile("fastest"), "cpu", model_cache_dir=CACHE
    )


def _torch_dense(texts: list[str]) -> np.ndarray:
    config = _minilm()
    ref = DenseEncoder(config, config.resolve_profile("default"), "cpu")
    ref.load()
    try:
        prepared, _ = ref.prepare(texts, instruction=None, is_query=False, options={})
        out: np.ndarray = ref.encode(prepared, output_types=("dense",), options={})["dense"]
        return out
    finally:
        ref.unload()


def _dense(engine: FastestDenseEncoder, texts: list[str]) -> np.ndarray:
    prepared, counts = engine.prepare(texts, instruction=None, is_query=False, options={})
    assert all(c >= 1 for c in counts)
    out: np.ndarray = engine.encode(prepared, output_types=("dense",), options={})["dense"]
    return out


def test_on_minilm_int8_passes_and_serves_without_waiting_for_company() -> None:
    engine = _fastest(_minilm())
    engine.load()
    try:
        assert engine.served == "onnx-int8" and engine.refused == {}
        assert engine.gains_from_batching is False  # one text per call: no batch wait
        # one call per core, each running its passes on its own thread
        assert engine.wanted_engine_slots == cpu_cores()
        got, want = _dense(engine, TEXTS), _torch_dense(TEXTS)
        cos = (got * want).sum(axis=1)  # both unit length (MiniLM normalises)
        assert got.shape == (2, 384) and float(cos.min()) >= 0.95
        scores = engine.score([("a short query", t) for t in TEXTS], instruction=None, options={})
        assert len(scores) == 2 and scores[0] > scores[1]
    finally:
        engine.unload()


def test_an_int8_graph_below_its_bound_tries_token_scales_before_float32() -> None:
    # MiniLM's per-tensor int8 has min cosine 0.9645 and its per-token one 0.969
    engine = _fastest(_minilm({"int8_min_cosine": 0.967}))
    engine.load()
    try:
        assert engine.served == "onnx-int8-token"
        assert "int8 quantisation loses too much" in engine.refused["onnx-int8"]
        assert engine.gains_from_batching is False  # still one text per pass
        got, want = _dense(engine, TEXTS), _torch_dense(TEXTS)
        assert float((got * want).sum(axis=1).min()) >= 0.967
    finally:
        engine.unload()


def test_an_int8_graph_below_its_bound_falls_through_to_float32() -> None:
    engine = _fastest(_minilm({"int8_min_cosine": 0.99999}))
    engine.load()
    try:
        assert engine.served == "onnx-float32"
        assert "int8 quantisation loses too much" in engine.refused["onnx-int8"]
        assert "int8 quantisation loses too much" in engine.refused["onnx-int8-token"]
        assert engine.gains_from_batching is True
        assert engine.wanted_engine_slots == 0  # the worker's setting
        got, want = _dense(engine, TEXTS), _torch_dense(TEXTS)
        assert float((got * want).sum(axis=1).min()) >= 0.99999
    finally:
        engine.unload()


def test_an_export_that_does_not_match_torch_falls_through_to_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = OnnxDenseEncoder._check_outputs

    def perturbed(self: OnnxDenseEncoder, texts: list[str]) -> dict[str, Any]:
        out = real(self, texts)
        out["dense"] = out["dense"] + np.float32(0.01) * np.sign(out["dense"])
        return out

    monkeypatch.setattr(OnnxDenseEncoder, "_check_outputs", perturbed)
    engine = _fastest(_minilm())
    engine.load()
    try:
        assert engine.served == "torch"
        assert set(engine.refused) == {"onnx-int8", "onnx-int8-token", "onnx-float32"}
        assert all("does not reproduce the torch pipeline" in m for m in engine.refused.values())
        np.testing.assert_allclose(_dense(engine, TEXTS), _torch_dense(TEXTS), atol=1e-6)
    finally:
        engine.unload()


def test_missing_weights_fail_the_load_instead_of_falling_through() -> None:
    from ruamel.yaml import YAML

    from sie.core.errors import ModelLoadFailed

    doc = YAML(typ="safe").load(
        (CONFIGS / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text()
    )
    doc.update(sie_id="nobody/nothing", hf_id="nobody/nothing")
    engine = _fastest(parse_model_config(doc))
    with pytest.raises(ModelLoadFailed) as err:
        engine.load()
    assert err.value.fields["error_class"] == "NOT_FOUND" and engine.refused == {}


def test_a_bare_id_serves_the_default_profile_setting() -> None:
    """The base id serves ``fastest`` under its own name; ``id:default`` is torch."""

    def dense(c: httpx.Client, model: str) -> np.ndarray:
        r = c.post(f"/v1/encode/{model}", json={"items": [{"text": "hello"}]})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model
        return np.asarray(r.json()["items"][0]["dense"]["values"], dtype=np.float32)

    with run_stack(preload=(MINILM,), default_profiles=((MINILM, "fastest"),)) as s:
        with httpx.Client(base_url=s.base_url, timeout=60) as c:
            health = c.get("/health").json()
            loaded = {m["name"] for w in health["workers"] for m in w.get("models", [])}
            assert MINILM in loaded and f"{MINILM}:fastest" not in loaded
            info = c.get(f"/v1/models/{MINILM}").json()
            assert info["id"] == MINILM
            defaults = {p for p, v in info["profiles"].items() if v["is_default"]}
            assert defaults == {"fastest"}  # the profile the bare id serves
            assert info["engines"] == ["onnx-int8"]  # the engine fastest picked at load
            variant = c.get(f"/v1/models/{MINILM}:onnx").json()
            assert variant["profiles"] == {"onnx": {"is_default": True}}
            assert variant["engines"] == []  # a profile that names its engine: none picked
            r = c.post("/v1/embeddings", json={"model": MINILM, "input": TEXTS})
            assert r.status_code == 200 and r.json()["model"] == MINILM
            fast, torch = dense(c, MINILM), dense(c, f"{MINILM}:default")
            # options.profile "default" names the profile, not the bare id (which is fastest)
            body = {"items": [{"text": "hello"}], "params": {"options": {"profile": "default"}}}
            r = c.post(f"/v1/encode/{MINILM}", json=body)
            assert r.status_code == 200, r.text
            by_option = np.asarray(r.json()["items"][0]["dense"]["values"], dtype=np.float32)
            np.testing.assert_allclose(by_option, torch, atol=1e-6)
        np.testing.assert_allclose(torch, _torch_dense(["hello"])[0], atol=1e-5)
        assert 0.95 <= float(np.dot(fast, torch)) < 0.9999  # int8, not torch
