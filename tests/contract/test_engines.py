"""The task-engine contract (``sie.engines.base``), one suite over every shipped encode,
score and extract engine, on real offline weights.

Each engine is built from a config the way the worker builds it (``load_engine_class``
restricted to the default bundle's modules), and must: implement its task protocol by
method, do no I/O before ``load`` (a missing weights path fails at ``load`` with
``ModelLoadFailed``), report its memory after ``load``, answer one result per input in
input order, give a row that does not depend on the rest of the batch, and unload
idempotently. Kind-specific shapes (vectors, scores, entity offsets) follow.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.core.config import ModelConfig, parse_bundle, parse_model_config
from sie.core.errors import ModelLoadFailed
from sie.engines.base import (
    is_encoder,
    is_extractor,
    is_scorer,
    load_engine_class,
    memory_bytes,
)
from tests.builders import build_untrained_gliner
from tests.conftest import CONFIGS, MODEL_CACHE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BUNDLE = parse_bundle((ROOT / "bundles" / "default.yaml").read_text())

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "a",
    "Jane Doe lives in Paris and writes to jane.doe@example.com every Monday.",
    "Ünïcödé text — with dashes, emoji 🎉 and\ttabs\nand new lines.",
    "word " * 300,  # longer than some windows
]


@dataclass(frozen=True)
class Case:
    """One shipped engine: how to get its config, and what to call it with."""

    name: str
    kind: str  # encode | score | extract
    module: str  # the adapter module the config names
    config: Callable[[pytest.TempPathFactory, Path], ModelConfig]
    labels: tuple[str, ...] | None = None
    profile: str = "default"


def _shipped(file: str) -> Callable[[pytest.TempPathFactory, Path], ModelConfig]:
    return lambda _tmp, _ce: parse_model_config((CONFIGS / file).read_text())


def _doc(sie_id: str, weights: Path, adapter: str, task: str) -> ModelConfig:
    return parse_model_config(
        {
            "sie_id": sie_id,
            "weights_path": str(weights),
            "tasks": {task: {}},
            "profiles": {"default": {"adapter_path": adapter, "max_batch_tokens": 8192}},
        }
    )


def _gliner(tmp: pytest.TempPathFactory, _ce: Path) -> ModelConfig:
    weights = build_untrained_gliner(tmp.mktemp("gliner") / "model")
    return _doc("test/gliner", weights, "sie.engines.extractors.gliner:GlinerExtractor", "extract")


def _cross_encoder(_tmp: pytest.TempPathFactory, ce: Path) -> ModelConfig:
    adapter = "sie.engines.scorers.cross_encoder:CrossEncoderScorer"
    return _doc("test/cross-encoder", ce, adapter, "score")


def _cross_encoder_onnx(_tmp: pytest.TempPathFactory, ce: Path) -> ModelConfig:
    adapter = "sie.engines.onnx.cross:OnnxCrossEncoderScorer"
    return _doc("test/cross-encoder-onnx", ce, adapter, "score")


ST = "sie.engines.encoders.sentence_transformers"
ONNX = "sie.engines.onnx.encoders"
MINILM_YAML = "sentence-transformers__all-MiniLM-L6-v2.yaml"
CASES = [
    Case("minilm-dense", "encode", ST, _shipped(MINILM_YAML)),
    Case("minilm-onnx", "encode", ONNX, _shipped(MINILM_YAML), profile="onnx"),
    Case("minilm-onnx-int8", "encode", ONNX, _shipped(MINILM_YAML), profile="onnx-int8"),
    Case(
        "minilm-fastest",
        "encode",
        "sie.engines.onnx.fastest",
        _shipped(MINILM_YAML),
        profile="fastest",
    ),
    Case("splade-sparse", "encode", ST, _shipped("rasyosef__splade-tiny.yaml")),
    Case("splade-onnx", "encode", ONNX, _shipped("rasyosef__splade-tiny.yaml"), profile="onnx"),
    Case("cross-encoder", "score", "sie.engines.scorers.cross_encoder", _cross_encoder),
    Case("cross-encoder-onnx", "score", "sie.engines.onnx.cross", _cross_encoder_onnx),
    Case(
        "gliner",
        "extract",
        "sie.engines.extractors.gliner",
        _gliner,
        labels=("person", "location", "email"),
    ),
    Case(
        "rampart",
        "extract",
        "sie.engines.extractors.token_classification",
        _shipped("nationaldesignstudio__rampart.yaml"),
    ),
]

#: Every engine module the default bundle lists, except generators (their own suite:
#: test_generation_engines.py): the cases above must cover them all.
TASK_MODULES = {m for m in DEFAULT_BUNDLE.adapters if ".generators." not in m}


def test_every_shipped_task_engine_module_has_a_case() -> None:
    assert {c.module for c in CASES} == TASK_MODULES


def _build(factory: Any, config: ModelConfig, profile: Any) -> Any:
    """``factory(config, profile, "cpu")`` as the worker calls it: engines that convert
    weights (the ONNX export) get the tests' shared model cache (``run_stack``'s)."""
    extra: dict[str, Any] = {}
    if "model_cache_dir" in inspect.signature(factory).parameters:
        extra["model_cache_dir"] = str(MODEL_CACHE / "sie-models")
    return factory(config, profile, "cpu", **extra)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.name)
def loaded(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cross_encoder_dir: Path,
) -> Iterator[tuple[Case, ModelConfig, Any]]:
    case: Case = request.param
    config = case.config(tmp_path_factory, cross_encoder_dir)
    profile = config.resolve_profile(case.profile)
    assert profile.adapter_module == case.module
    factory = load_engine_class(profile.adapter_path, DEFAULT_BUNDLE.adapters)
    engine = _build(factory, config, profile)
    engine.load()
    yield case, config, engine
    engine.unload()


def _run(case: Case, config: ModelConfig, engine: Any, texts: list[str]) -> list[Any]:
    """One result per text: encode → ``{output: row}``, score → the score of
    ``(query, text)``, extract → the text's entities."""
    if case.kind == "encode":
        assert is_encoder(engine)
        types = [t for t in engine.outputs if t in config.outputs]
        prepared, counts = engine.prepare(texts, instruction=None, is_query=False, options={})
        assert len(prepared) == len(counts) == len(texts) and all(c >= 1 for c in counts)
        out = engine.encode(prepared, output_types=types, options={}, lengths=counts)
        assert set(out) == set(types)
        return [{t: out[t][i] for t in types} for i in range(len(texts))]
    if case.kind == "score":
        assert is_scorer(engine)
        scores = engine.score(
            [("what is this about", t) for t in texts], instruction=None, options={}
        )
        assert len(scores) == len(texts)
        return [float(s) for s in scores]
    assert is_extractor(engine)
    labels = list(case.labels) if case.labels is not None else None
    return list(engine.extract(texts, labels=labels, options={}))


def _same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, tuple):  # sparse: (indices, values)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_allclose(a[1], b[1], rtol=1e-4, atol=1e-5)
    elif isinstance(a, list):
        assert [(e["label"], e["start"], e["end"]) for e in a] == [
            (e["label"], e["start"], e["end"]) for e in b
        ]
        for x, y in zip(a, b, strict=True):
            assert math.isclose(x["score"], y["score"], rel_tol=1e-3, abs_tol=1e-4)
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5)
    else:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_implements_its_protocol_and_reports_memory(loaded: tuple[Case, ModelConfig, Any]) -> None:
    case, _, engine = loaded
    check = {"encode": is_encoder, "score": is_scorer, "extract": is_extractor}[case.kind]
    assert check(engine)
    assert memory_bytes(engine) > 0


def test_one_result_per_input_in_order_independent_of_the_batch(
    loaded: tuple[Case, ModelConfig, Any],
) -> None:
    case, config, engine = loaded
    batch = _run(case, config, engine, TEXTS)
    assert len(batch) == len(TEXTS)
    for i, text in enumerate(TEXTS):
        _same(_run(case, config, engine, [text])[0], batch[i])
    reversed_ = _run(case, config, engine, TEXTS[::-1])[::-1]
    for a, b in zip(batch, reversed_, strict=True):
        _same(a, b)


def test_result_shapes(loaded: tuple[Case, ModelConfig, Any]) -> None:
    case, config, engine = loaded
    results = _run(case, config, engine, TEXTS)
    for text, r in zip(TEXTS, results, strict=True):
        if case.kind == "encode":
            for t, v in r.items():
                if t == "dense":
                    assert v.dtype == np.float32 and v.shape == (config.dims.get(t, v.shape[0]),)
                    assert np.all(np.isfinite(v))
                elif t == "multivector":
                    assert v.dtype == np.float32 and v.ndim == 2 and v.shape[0] >= 1
                else:
                    indices, values = v
                    assert np.all(np.diff(np.asarray(indices)) > 0)  # ascending, unique
                    assert len(indices) == len(values) and np.all(np.asarray(values) > 0)
        elif case.kind == "score":
            assert math.isfinite(r)
        else:
            starts = [e["start"] for e in r]
            assert starts == sorted(starts)
            for e in r:
                assert 0 <= e["start"] < e["end"] <= len(text)
                assert e["text"] == text[e["start"] : e["end"]]
                assert 0.0 <= e["score"] <= 1.0 and isinstance(e["label"], str)


def test_the_constructor_does_no_io_and_load_names_missing_weights(
    loaded: tuple[Case, ModelConfig, Any], tmp_path: Path
) -> None:
    case, config, _ = loaded
    profile = config.resolve_profile(case.profile)
    # no package or hub fallback either (weights resolution tries those after weights_path)
    missing = config.model_copy(
        update={"weights_path": str(tmp_path / "absent"), "hf_id": None, "package_backed": False}
    )
    factory = load_engine_class(profile.adapter_path, DEFAULT_BUNDLE.adapters)
    engine = _build(factory, missing, profile)  # nothing read yet
    with pytest.raises(ModelLoadFailed):
        engine.load()
    engine.unload()  # idempotent, also before a successful load
    engine.unload()
