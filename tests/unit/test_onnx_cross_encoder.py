"""The ONNX Runtime cross-encoder (``sie.engines.onnx.cross``): the same scores as the
torch ``CrossEncoderScorer`` on the tests' two offline cross-encoders
(``tests.distill``: MiniLM distilled into a reranker, a tiny random BERT), the parity
refusal, the int8 gate, pair tokenisation, and one request served through a live stack.

The float32 bound the tests use is the engine's own parity bound on logits
(``SCORE_PARITY_ATOL`` + ``SCORE_PARITY_RTOL`` x |logit|, 1e-4 each); measured
differences are below 1e-6. Engine loads share the tests' model cache
(``MODEL_CACHE/sie-models``): each model is exported once per machine.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.core.config import ModelConfig, parse_model_config
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed
from sie.engines.base import is_scorer, load_engine_class
from sie.engines.onnx.cross import OnnxCrossEncoderScorer
from sie.engines.onnx.cross_checks import (
    SCORE_PARITY_ATOL,
    SCORE_PARITY_RTOL,
    ScoreInt8Bounds,
    ScoreInt8Quality,
    check_score_int8,
    check_score_parity,
    score_parity_probes,
    spearman,
)
from sie.engines.onnx.pairs import PairInputs, longest_first
from sie.engines.onnx.runtime import INPUT_NAMES
from sie.engines.scorers.cross_encoder import CrossEncoderScorer
from tests.conftest import BUNDLES, MODEL_CACHE, run_stack
from tests.distill import TRAIN_TEXTS, build_tiny_random_cross_encoder

SHARED_CACHE = MODEL_CACHE / "sie-models"
ONNX_ADAPTER = "sie.engines.onnx.cross:OnnxCrossEncoderScorer"
TORCH_ADAPTER = "sie.engines.scorers.cross_encoder:CrossEncoderScorer"

QUERIES = ["how do I bake bread at home", "who won the football match", "what is a telescope"]
DOCS = [
    "Knead the dough for ten minutes until it is smooth and elastic.",
    "The striker scored a header in the final minute of the match.",
    "A telescope lets astronomers observe distant galaxies.",
    "short",
    " ".join(TRAIN_TEXTS),  # longer than the window: truncated longest-first
]
PAIRS = [(q, d) for q in QUERIES for d in DOCS]


def _config(
    weights: Path | str,
    *,
    max_sequence_length: int | None = 256,
    onnx: dict[str, Any] | None = None,
) -> ModelConfig:
    """A reranker config: ``default`` torch, ``onnx`` / ``onnx-int8`` on ONNX Runtime."""
    onnx_profile = {"extends": "default", "adapter_path": ONNX_ADAPTER, **(onnx or {})}
    doc: dict[str, Any] = {
        "sie_id": "test/cross-encoder",
        "weights_path": str(weights),
        "tasks": {"score": {}},
        "profiles": {
            "default": {"adapter_path": TORCH_ADAPTER, "max_batch_tokens": 8192},
            "onnx": onnx_profile,
            "onnx-int8": {**onnx_profile, "compute_precision": "int8"},
        },
    }
    if max_sequence_length:
        doc["max_sequence_length"] = max_sequence_length
    return parse_model_config(doc)


def _onnx(config: ModelConfig, profile: str = "onnx") -> OnnxCrossEncoderScorer:
    return OnnxCrossEncoderScorer(
        config, config.resolve_profile(profile), "cpu", model_cache_dir=SHARED_CACHE
    )


def _torch(config: ModelConfig) -> CrossEncoderScorer:
    return CrossEncoderScorer(config, config.resolve_profile(), "cpu")


def _close(got: list[float], want: list[float]) -> None:
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= SCORE_PARITY_ATOL + SCORE_PARITY_RTOL * abs(w), (g, w)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_random_cross_encoder(tmp_path_factory.mktemp("ce") / "tiny")


@pytest.fixture(scope="module")
def distilled(cross_encoder_dir: Path) -> Iterator[tuple[CrossEncoderScorer, Any]]:
    """The distilled reranker on torch and on ONNX float32, loaded once."""
    config = _config(cross_encoder_dir)
    torch_engine, engine = _torch(config), _onnx(config)
    torch_engine.load()
    engine.load()
    yield torch_engine, engine
    engine.unload()
    torch_engine.unload()


# -- pair tokenisation ------------------------------------------------------------------


def _words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


@pytest.mark.parametrize("window", [16, 17])
def test_pairs_tokenise_as_the_transformers_tokenizer(minilm_path: Path, window: int) -> None:
    """Every combination of short, half-window and long sides (odd and even budgets:
    the odd token of a half split goes to the longer side), then sides long enough to
    be clipped before tokenisation, against ``tokenizer(q, d, truncation=...)``."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(minilm_path), local_files_only=True)
    inputs = PairInputs(minilm_path, window, False, INPUT_NAMES)
    assert inputs.template is not None and inputs.template.specials == 3  # [CLS] [SEP] [SEP]
    lengths = [0, 1, 5, 6, 7, 8, 13, 40]
    pairs = [(_words("q", a), _words("d", b)) for a in lengths for b in lengths]
    long_a, long_b = "alpha " * 120, "beta gamma " * 90  # over 32 x window characters
    pairs += [(long_a, long_b), (long_b, long_a), (long_a, long_a), ("q", long_b)]
    got = inputs.pair_features(pairs)
    want = hf(
        [q for q, _ in pairs],
        [d for _, d in pairs],
        truncation="longest_first",
        max_length=window,
        padding=True,
        return_tensors="np",
    )
    for name in INPUT_NAMES:
        np.testing.assert_array_equal(got[name], want[name])
    assert got["token_type_ids"][-1].tolist()[:5] == [0, 0, 0, 1, 1]  # [CLS] q [SEP] | d
    assert [len(ids) for ids, _ in inputs.rows(pairs[:3])] == [3, 5, 13]  # d0 = d ##0
    assert inputs.features(["one text"])["token_type_ids"].max() == 0  # single texts as before


def test_longest_first_keeps_the_tokenizers_lengths() -> None:
    assert longest_first(3, 4, 10) == (3, 4)  # fits
    assert longest_first(2, 30, 10) == (2, 8)  # the short side whole
    assert longest_first(30, 2, 10) == (8, 2)
    assert longest_first(30, 20, 11) == (6, 5)  # halves, the odd token to the longer
    assert longest_first(20, 30, 11) == (5, 6)
    assert longest_first(20, 20, 11) == (5, 6)  # a tie: to the second


def test_huge_sides_cost_a_bounded_amount(minilm_path: Path) -> None:
    """The tokenizer's own pair truncation pairs every overflow piece of one side with
    every piece of the other: two 100,000-character sides would need gigabytes."""
    inputs = PairInputs(minilm_path, 256, False, INPUT_NAMES)
    huge_a, huge_b = "relevance " * 10_000, "the quick brown fox " * 5_000
    feats = inputs.pair_features([(huge_a, huge_b), (huge_b, huge_a), ("q", huge_b)])
    assert feats["input_ids"].shape == (3, 256) and feats["attention_mask"].all()
    assert feats["input_ids"][0, 1] == feats["input_ids"][1, 129]  # 127 + 126 tokens


# -- the checks ---------------------------------------------------------------------------


def test_score_parity_passes_within_the_bound_and_names_the_worst_pair() -> None:
    probes = score_parity_probes(8)
    assert [n for n, _ in probes] == ["unpadded", "padded", "truncated"]

    def ref(pairs: list[tuple[str, str]]) -> np.ndarray:
        return np.linspace(-5.0, 5.0, len(pairs))

    assert check_score_parity("m", ref, lambda p: ref(p) + 5e-5, probes) <= 5e-5 + 1e-12

    def bumped(pairs: list[tuple[str, str]]) -> np.ndarray:  # the padded probe's third pair
        return ref(pairs) + np.where(np.arange(len(pairs)) == 2, 0.01 * (len(pairs) == 3), 0.0)

    with pytest.raises(ModelLoadFailed) as err:
        check_score_parity("m", ref, bumped, probes)
    msg = err.value.message
    assert "does not reproduce the torch cross-encoder" in msg and "0.01" in msg
    assert "pair 2 of the padded probe" in msg and "this profile is refused" in msg
    assert err.value.fields["error_class"] == "CONFIG" and err.value.fields["permanent"]
    with pytest.raises(ModelLoadFailed, match="3 scores for 4 pairs"):
        check_score_parity("m", ref, lambda p: ref(p)[:3], probes[2:])


def test_spearman_and_the_int8_measures() -> None:
    a = np.array([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    assert spearman(a, a).tolist() == [1.0, 1.0]
    assert spearman(a, a[:, ::-1]).tolist() == [-1.0, -1.0]
    rng = np.random.default_rng(0)
    fp32 = rng.normal(size=(10, 50))
    same = check_score_int8("m", fp32, fp32.copy(), ScoreInt8Bounds())
    assert same == ScoreInt8Quality(0.0, pytest.approx(1.0), 1.0)
    noisy = fp32 + rng.normal(scale=0.5, size=fp32.shape)
    with pytest.raises(ModelLoadFailed) as err:
        check_score_int8("m", fp32, noisy, ScoreInt8Bounds())
    msg = err.value.message
    assert "int8 quantisation changes the cross-encoder's scores too much" in msg
    assert "500 probe pairs" in msg and "(max 0.15)" in msg and "min Spearman" in msg
    assert "top-10 agreement" in msg and "(min 0.9)" in msg
    assert ScoreInt8Quality.measure(fp32, fp32[:2]).max_diff == math.inf  # shape mismatch


@pytest.mark.parametrize("bad", [1.5, -0.1, "0.9", True])
def test_score_int8_bounds_are_numbers_in_0_1(bad: Any) -> None:
    with pytest.raises(ModelLoadFailed, match=r"loadtime\.int8_min_spearman must be a number"):
        ScoreInt8Bounds.from_loadtime({"int8_min_spearman": bad}, "m")
    got = ScoreInt8Bounds.from_loadtime({"int8_max_score_diff": 0.2}, "m")
    assert got == ScoreInt8Bounds(max_diff=0.2)


# -- float32 against torch -------------------------------------------------------------


@pytest.mark.slow
def test_float32_scores_are_the_torch_scores(distilled: tuple[CrossEncoderScorer, Any]) -> None:
    torch_engine, engine = distilled
    assert is_scorer(engine) and engine.precision == "float32"
    assert engine.parity_max_diff is not None and engine.parity_max_diff < 1e-5
    assert engine.graph_path is not None and engine.graph_path.is_relative_to(SHARED_CACHE)
    assert engine.memory_bytes() > 10_000_000  # MiniLM: ~90 MB float32 graph
    for instruction in (None, "Judge relevance:"):
        for opts in ({}, {"activation": "none"}, {"activation": "sigmoid"}):
            got = engine.score(PAIRS, instruction=instruction, options=opts)
            want = torch_engine.score(PAIRS, instruction=instruction, options=opts)
            assert all(isinstance(s, float) for s in got)
            _close(got, want)
    squashed = engine.score(PAIRS, instruction=None, options={"activation": "sigmoid"})
    raw = engine.score(PAIRS, instruction=None, options={})
    assert squashed == pytest.approx([1 / (1 + math.exp(-r)) for r in raw], abs=1e-6)
    assert all(0.0 < s < 1.0 for s in squashed)


@pytest.mark.slow
def test_instruction_truncation_and_batch_independence(
    distilled: tuple[CrossEncoderScorer, Any],
) -> None:
    torch_engine, engine = distilled
    q, d = QUERIES[0], DOCS[0]
    by_hand = engine.score([(f"Find: {q}", d)], instruction=None, options={})
    assert engine.score([(q, d)], instruction="Find:", options={}) == by_hand
    huge = DOCS[0] + " " + " ".join(TRAIN_TEXTS) * 40  # far over the window, clipped first
    long_pairs = [(q, huge), (huge, d), (huge, huge)]
    _close(
        engine.score(long_pairs, instruction=None, options={}),
        torch_engine.score(long_pairs, instruction=None, options={}),
    )
    together = engine.score(PAIRS, instruction=None, options={})
    alone = [engine.score([p], instruction=None, options={})[0] for p in PAIRS]
    assert together == pytest.approx(alone, rel=1e-4, abs=1e-5)
    twice = engine.score([PAIRS[0], PAIRS[1], PAIRS[0]], instruction=None, options={})
    assert twice[0] == twice[2]  # equal pairs are scored once
    assert engine.score([], instruction=None, options={}) == []


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["softmax", "Sigmoid", 1, True])
def test_a_bad_activation_is_invalid_input(
    distilled: tuple[CrossEncoderScorer, Any], bad: Any
) -> None:
    with pytest.raises(InvalidInput) as err:
        distilled[1].score([("q", "d")], instruction=None, options={"activation": bad})
    assert err.value.fields["field"] == "params.options.activation"


@pytest.mark.slow
def test_the_tiny_random_model_on_a_short_window(tiny_dir: Path) -> None:
    config = _config(tiny_dir, max_sequence_length=16)
    torch_engine, engine = _torch(config), _onnx(config)
    with pytest.raises(InferenceError):
        engine.score([("q", "d")], instruction=None, options={})
    torch_engine.load()
    engine.load()
    assert engine._inputs is not None and engine._inputs.window == 16
    for opts in ({}, {"activation": "sigmoid"}):
        _close(
            engine.score(PAIRS, instruction="Find:", options=opts),
            torch_engine.score(PAIRS, instruction="Find:", options=opts),
        )
    assert 0 < engine.memory_bytes() < 10_000_000
    engine.unload()
    engine.unload()  # idempotent
    assert engine.memory_bytes() == 0


@pytest.mark.slow
def test_the_adapter_loads_from_the_default_bundle() -> None:
    from sie.core.config import parse_bundle

    bundle = parse_bundle((BUNDLES / "default.yaml").read_text())
    assert "sie.engines.onnx.cross" in bundle.adapters
    assert load_engine_class(ONNX_ADAPTER, bundle.adapters) is OnnxCrossEncoderScorer


# -- refusals ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_graph_that_does_not_match_torch_is_refused(
    monkeypatch: pytest.MonkeyPatch, cross_encoder_dir: Path
) -> None:
    real = OnnxCrossEncoderScorer._logits

    def perturbed(self: OnnxCrossEncoderScorer, pairs: Any) -> np.ndarray:
        return real(self, pairs) + np.float32(0.01)

    monkeypatch.setattr(OnnxCrossEncoderScorer, "_logits", perturbed)
    engine = _onnx(_config(cross_encoder_dir))
    with pytest.raises(ModelLoadFailed) as err:
        engine.load()
    msg = err.value.message
    assert "does not reproduce the torch cross-encoder: a logit differs by 0.01" in msg
    assert " probe; this profile is refused" in msg and "torch profiles are unaffected" in msg
    assert err.value.fields["error_class"] == "CONFIG" and err.value.fields["permanent"]


@pytest.mark.slow
def test_a_head_of_two_logits_is_refused(tmp_path: Path, tiny_dir: Path) -> None:
    from transformers import AutoConfig, BertForSequenceClassification

    root = tmp_path / "two-labels"
    config = AutoConfig.from_pretrained(str(tiny_dir), num_labels=2)
    BertForSequenceClassification(config).save_pretrained(str(root))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_dir / name, root / name)
    with pytest.raises(ModelLoadFailed) as err:
        _onnx(_config(root)).load()
    assert "needs a single-logit head" in err.value.message and "num_labels=2" in err.value.message
    assert err.value.fields["error_class"] == "CONFIG"


# -- int8 -------------------------------------------------------------------------------


@pytest.mark.slow
def test_int8_passes_its_gate_on_the_distilled_model(
    distilled: tuple[CrossEncoderScorer, Any], cross_encoder_dir: Path
) -> None:
    torch_engine, _ = distilled
    engine = _onnx(_config(cross_encoder_dir), "onnx-int8")
    engine.load()
    q, bounds = engine.int8_quality, ScoreInt8Bounds()
    assert engine.precision == "int8" and engine.graph_path is not None
    assert "int8" in engine.graph_path.name and not engine.gains_from_batching
    assert q.max_diff <= bounds.max_diff and q.min_spearman >= bounds.min_spearman
    assert q.top10_overlap >= bounds.top10_overlap
    got = engine.score(PAIRS, instruction=None, options={})
    want = torch_engine.score(PAIRS, instruction=None, options={})
    spread = max(want) - min(want)
    assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= bounds.max_diff * spread
    for i in range(len(QUERIES)):  # int8's best doc is torch's best, or a near tie of it
        row = slice(i * len(DOCS), (i + 1) * len(DOCS))
        best = want[row][int(np.argmax(got[row]))]
        assert best >= max(want[row]) - bounds.max_diff * spread
    alone = [engine.score([p], instruction=None, options={})[0] for p in PAIRS[:4]]
    assert alone == got[:4]  # one pair per session call: exactly independent of the batch
    engine.unload()


@pytest.mark.slow
def test_int8_is_refused_under_its_bound(cross_encoder_dir: Path, tiny_dir: Path) -> None:
    strict = _config(
        cross_encoder_dir,
        onnx={"adapter_options": {"loadtime": {"int8_min_spearman": 0.99999}}},
    )
    with pytest.raises(ModelLoadFailed) as err:
        _onnx(strict, "onnx-int8").load()
    msg = err.value.message
    assert "int8 quantisation changes the cross-encoder's scores too much" in msg
    assert "(min 0.99999)" in msg and "max score difference" in msg
    assert err.value.fields["error_class"] == "CONFIG" and err.value.fields["permanent"]
    # a random model's logits barely vary: int8 noise reorders them, and it is refused
    with pytest.raises(ModelLoadFailed, match="min Spearman"):
        _onnx(_config(tiny_dir), "onnx-int8").load()


# -- served -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_score_request_is_served_by_the_onnx_profile(
    tmp_path: Path, distilled: tuple[CrossEncoderScorer, Any], cross_encoder_dir: Path
) -> None:
    import httpx

    torch_engine, _ = distilled
    models = tmp_path / "models"
    models.mkdir()
    (models / "reranker.yaml").write_text(
        f"""sie_id: test/cross-encoder
weights_path: {cross_encoder_dir}
tasks: {{score: {{}}}}
max_sequence_length: 256
profiles:
  default:
    adapter_path: {TORCH_ADAPTER}
    max_batch_tokens: 8192
  onnx:
    extends: default
    adapter_path: {ONNX_ADAPTER}
"""
    )
    query = QUERIES[0]
    with run_stack(
        models_dir=str(models),
        preload=("test/cross-encoder:onnx",),
        weights_roots=(str(MODEL_CACHE),),
    ) as stack:
        body = {
            "query": {"id": "q", "text": query},
            "items": [{"id": f"d{i}", "text": d} for i, d in enumerate(DOCS)],
            "options": {"activation": "sigmoid"},
        }
        r = httpx.post(f"{stack.base_url}/v1/score/test/cross-encoder:onnx", json=body, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
    want = torch_engine.score(
        [(query, d) for d in DOCS], instruction=None, options={"activation": "sigmoid"}
    )
    got = {s["item_id"]: s["score"] for s in out["scores"]}
    _close([got[f"d{i}"] for i in range(len(DOCS))], want)
    assert out["scores"][0]["item_id"] == f"d{int(np.argmax(want))}"
    assert [s["rank"] for s in out["scores"]] == list(range(len(DOCS)))
