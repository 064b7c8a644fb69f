"""``sie.engines.scorers.cross_encoder.CrossEncoderScorer`` on real, offline weights.

Two models are built per module (``tests.distill``): MiniLM distilled into a
cross-encoder (real ordering, tens of seconds on 2 cores) and a tiny random BERT
(plumbing). Held-out queries and documents below share no topic and no text with
the distillation set, so ranking them right shows learned relevance, not recall.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from sie.core.config import ModelConfig, parse_model_config
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed
from sie.engines.base import ScoreEngine, load_engine_class, memory_bytes
from sie.engines.scorers.cross_encoder import CrossEncoderScorer
from tests.distill import (
    TRAIN_TEXTS,
    TRAIN_TOPICS,
    build_tiny_random_cross_encoder,
)

pytestmark = pytest.mark.slow

MODULE = "sie.engines.scorers.cross_encoder"
ADAPTER = f"{MODULE}:CrossEncoderScorer"

#: Held-out topic → (query, relevant document). Topics and texts are not in TRAIN_TOPICS.
HELD_OUT: dict[str, tuple[str, str]] = {
    "dog training": (
        "how can I train my dog to obey commands",
        "Reward your puppy with a treat every time it sits when told.",
    ),
    "volcanoes": (
        "why do volcanoes erupt",
        "Molten lava erupted from the crater and flowed down the mountainside.",
    ),
    "car maintenance": (
        "how often should I service my car engine",
        "Change the engine oil and filter every five thousand miles.",
    ),
    "chess": (
        "what is a good opening strategy in chess",
        "Control the centre of the board and develop your knights and bishops early.",
    ),
    "coffee": (
        "how do I make french press coffee",
        "Grind the beans coarsely and steep them in hot water for four minutes.",
    ),
    "photography": (
        "which camera settings give a blurry background",
        "A wide aperture blurs the background and lets in more light.",
    ),
}
TOPICS = list(HELD_OUT)
DOCS = [HELD_OUT[t][1] for t in TOPICS]


def model_config(weights: Path | str, *, max_sequence_length: int | None = None) -> ModelConfig:
    msl = f"max_sequence_length: {max_sequence_length}\n" if max_sequence_length else ""
    return parse_model_config(
        f"""
sie_id: test/cross-encoder
weights_path: {str(weights)!r}
tasks:
  score: {{}}
{msl}profiles:
  default:
    adapter_path: {ADAPTER}
    max_batch_tokens: 8192
    adapter_options:
      loadtime:
        trust_remote_code: false
"""
    )


def make_scorer(weights: Path | str, **kw: Any) -> CrossEncoderScorer:
    config = model_config(weights, **kw)
    return CrossEncoderScorer(config, config.resolve_profile(), "cpu")


@pytest.fixture(scope="module")
def distilled_dir(cross_encoder_dir: Path) -> Path:
    return cross_encoder_dir  # tests/conftest.py: built once, cached across runs


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_random_cross_encoder(tmp_path_factory.mktemp("ce") / "tiny")


@pytest.fixture(scope="module")
def scorer(distilled_dir: Path) -> Any:
    engine = make_scorer(distilled_dir)
    engine.load()
    yield engine
    engine.unload()


def test_held_out_texts_are_disjoint_from_training() -> None:
    seen = {t.lower() for t in TRAIN_TEXTS}
    assert not {t.lower() for pair in HELD_OUT.values() for t in pair} & seen
    assert not set(HELD_OUT) & set(TRAIN_TOPICS)


def test_is_a_score_engine_loadable_by_adapter_path(scorer: CrossEncoderScorer) -> None:
    assert isinstance(scorer, ScoreEngine)
    assert load_engine_class(ADAPTER, [MODULE]) is CrossEncoderScorer
    assert memory_bytes(scorer) > 10_000_000  # MiniLM: ~22.7 M fp32 parameters


def test_relevant_held_out_doc_ranks_first(scorer: CrossEncoderScorer) -> None:
    report = {}
    for topic in TOPICS:
        query, relevant = HELD_OUT[topic]
        scores = scorer.score([(query, d) for d in DOCS], instruction=None, options={})
        report[topic] = [round(s, 3) for s in scores]
        best = max(range(len(DOCS)), key=scores.__getitem__)
        assert DOCS[best] == relevant, f"{topic}: {report[topic]}"
    print("held-out scores (rows: query topic, cols: doc topic)", TOPICS, report)


def test_scores_in_input_order_and_independent_of_batch(scorer: CrossEncoderScorer) -> None:
    pairs = [(HELD_OUT[t][0], d) for t in TOPICS for d in DOCS]
    alone = [scorer.score([p], instruction=None, options={})[0] for p in pairs]
    together = scorer.score(pairs, instruction=None, options={})
    assert all(isinstance(s, float) for s in together)
    assert together == pytest.approx(alone, abs=1e-5)
    shuffled = list(range(len(pairs)))
    random.Random(7).shuffle(shuffled)
    mixed = scorer.score([pairs[i] for i in shuffled], instruction=None, options={})
    assert mixed == pytest.approx([alone[i] for i in shuffled], abs=1e-5)
    # a pair next to a very long neighbour (lots of padding) scores the same
    long_doc = " ".join(TRAIN_TEXTS)
    padded = scorer.score([pairs[0], (pairs[0][0], long_doc)], instruction=None, options={})
    assert padded[0] == pytest.approx(alone[0], abs=1e-5)


def test_instruction_is_prepended_to_the_query(scorer: CrossEncoderScorer) -> None:
    query, doc = HELD_OUT["coffee"]
    plain = scorer.score([(query, doc)], instruction=None, options={})
    instructed = scorer.score([(query, doc)], instruction="Judge relevance:", options={})
    by_hand = scorer.score([(f"Judge relevance: {query}", doc)], instruction=None, options={})
    assert abs(plain[0] - instructed[0]) > 1e-4
    assert instructed == pytest.approx(by_hand, abs=1e-6)


def test_sigmoid_activation_maps_into_unit_interval_keeping_order(
    scorer: CrossEncoderScorer,
) -> None:
    query = HELD_OUT["volcanoes"][0]
    pairs = [(query, d) for d in DOCS]
    raw = scorer.score(pairs, instruction=None, options={})
    assert raw == pytest.approx(
        scorer.score(pairs, instruction=None, options={"activation": "none"})
    )
    squashed = scorer.score(pairs, instruction=None, options={"activation": "sigmoid"})
    assert all(0.0 < s < 1.0 for s in squashed)
    assert squashed == pytest.approx([1 / (1 + math.exp(-r)) for r in raw], abs=1e-6)
    assert sorted(range(len(raw)), key=raw.__getitem__) == sorted(
        range(len(squashed)), key=squashed.__getitem__
    )


@pytest.mark.parametrize("bad", ["softmax", "Sigmoid", "", 1, True])
def test_bad_activation_is_invalid_input(scorer: CrossEncoderScorer, bad: Any) -> None:
    with pytest.raises(InvalidInput) as err:
        scorer.score([("q", "d")], instruction=None, options={"activation": bad})
    assert "params.options.activation" in err.value.message
    assert err.value.fields["field"] == "params.options.activation"


def test_empty_batch_scores_nothing(scorer: CrossEncoderScorer) -> None:
    assert scorer.score([], instruction=None, options={}) == []


def test_tiny_random_model_loads_and_scores_each_pair(tiny_dir: Path) -> None:
    engine = make_scorer(tiny_dir, max_sequence_length=16)
    with pytest.raises(InferenceError):
        engine.score([("q", "d")], instruction=None, options={})
    engine.load()
    assert engine._model.max_seq_length == 16
    pairs = [("a query", "a doc"), ("another query", " ".join(TRAIN_TEXTS)), ("x", "y")]
    scores = engine.score(pairs, instruction="Find:", options={"activation": "sigmoid"})
    assert len(scores) == len(pairs)
    assert all(isinstance(s, float) and 0.0 < s < 1.0 for s in scores)
    assert 0 < engine.memory_bytes() < 5_000_000
    engine.unload()
    engine.unload()  # idempotent
    assert engine.memory_bytes() == 0


def test_missing_weights_dir_is_model_load_failed(tmp_path: Path) -> None:
    engine = make_scorer(tmp_path / "nowhere")
    with pytest.raises(ModelLoadFailed) as err:
        engine.load()
    assert err.value.fields["error_class"] == "NOT_FOUND"
    assert err.value.fields["permanent"] is True


def test_unloadable_weights_dir_is_model_load_failed(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    engine = make_scorer(tmp_path)
    with pytest.raises(ModelLoadFailed) as err:
        engine.load()
    assert err.value.fields["permanent"] is True
    assert str(tmp_path) in err.value.message
