"""The sentence-transformers engine and weight resolution, on the real MiniLM."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from sie.core.config import parse_model_config
from sie.core.errors import ModelLoadFailed
from sie.engines.encoders.sentence_transformers import DenseEncoder
from sie.engines.weights import resolve_weights
from tests.conftest import CONFIGS

pytestmark = pytest.mark.slow

NO_TEMPLATE: dict = {"instruction": None, "is_query": False, "options": {}}


@pytest.fixture(scope="module")
def engine() -> DenseEncoder:
    cfg = parse_model_config((CONFIGS / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text())
    e = DenseEncoder(cfg, cfg.resolve_profile(), "cpu")
    e.load()
    return e


def test_vector_does_not_depend_on_batch(engine: DenseEncoder) -> None:
    target = "The same text, alone or in company."
    others = [
        "a",
        "medium length sentence with some words",
        "x " * 120,
        "another one of a different length entirely, much longer than the rest " * 3,
    ]
    kw = {
        "output_types": ["dense"],
        "options": {"normalize": True},
    }
    alone = engine.encode([target], **kw)["dense"][0]
    mixed = engine.encode([others[0], target, *others[1:]], **kw)["dense"][1]
    np.testing.assert_allclose(alone, mixed, atol=1e-5)


def test_shapes_tokens_and_truncation(engine: DenseEncoder) -> None:
    out = engine.encode(["a", "b c"], output_types=["dense"], options={})
    assert out["dense"].shape == (2, 384) and out["dense"].dtype == np.float32
    texts, counts = engine.prepare(["hello", "word " * 5000], **NO_TEMPLATE)
    assert counts == [3, 256]  # [CLS] hello [SEP]; truncated at max_sequence_length
    assert texts[0] == "hello" and len(texts[1]) < 10_000  # clipped to a bounded prefix


@pytest.mark.parametrize(
    "text",
    [
        "word " * 200_000,
        ("Long documents mix punctuation, numbers (1,234.5) and\nnew lines\twith tabs. " * 5000),
        "x" * 50_000,  # one giant word: nothing to clip at, encoded whole
        "日本語の文書には空白がありません" * 4000,  # CJK: no spaces, one token per character
        "." * 50_000,  # punctuation only
        "short text stays as it is",
    ],
    ids=["many-words", "mixed", "one-giant-word", "cjk", "dots", "short"],
)
def test_clipping_is_exact(engine: DenseEncoder, st_model: object, text: str) -> None:
    (clipped,), (tokens,) = engine.prepare([text], **NO_TEMPLATE)
    assert text.startswith(clipped) and 1 <= tokens <= 256
    kw = {
        "output_types": ["dense"],
        "options": {"normalize": True},
    }
    got = engine.encode([clipped], **kw)["dense"][0]
    np.testing.assert_allclose(got, st_model.encode([text])[0], atol=1e-5)  # type: ignore[attr-defined]


def test_prepare_is_safe_during_encode(engine: DenseEncoder) -> None:
    """Counting on another thread must not disturb the inference tokenizer (a race a trial found)."""
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []

    def count() -> None:
        while not stop.is_set():
            try:
                engine.prepare(["a b c " * 50, "x"], **NO_TEMPLATE)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=count)]
    for t in threads:
        t.start()
    try:
        kw = {"output_types": ["dense"], "options": {}}
        for i in range(15):
            out = engine.encode([f"text {i} " * (1 + i % 40), "y", "z " * 300], **kw)["dense"]
            assert out.shape == (3, 384)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []


def test_weights_from_package(minilm_path: Path) -> None:
    cfg = parse_model_config((CONFIGS / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text())
    assert resolve_weights(cfg) == minilm_path


def test_weights_path_wins(tmp_path: Path) -> None:
    cfg = parse_model_config(
        {
            "sie_id": "x/y",
            "weights_path": str(tmp_path),
            "tasks": {},
            "profiles": {"default": {"adapter_path": "a:B", "max_batch_tokens": 1}},
        }
    )
    assert resolve_weights(cfg) == tmp_path


def test_missing_weights_fail_fast_naming_what_was_tried(tmp_path: Path) -> None:
    cfg = parse_model_config(
        {
            "sie_id": "nobody/nothing",
            "hf_id": "nobody/nothing",
            "weights_path": str(tmp_path / "absent"),
            "tasks": {"encode": {"dense": {"dim": 4}}},
            "profiles": {
                "default": {
                    "adapter_path": "sie.engines.encoders.sentence_transformers:DenseEncoder",
                    "max_batch_tokens": 1,
                }
            },
        }
    )
    t0 = time.monotonic()
    with pytest.raises(ModelLoadFailed) as exc:
        DenseEncoder(cfg, cfg.resolve_profile(), "cpu").load()
    assert time.monotonic() - t0 < 10
    msg = exc.value.message
    assert "absent" in msg and "Hugging Face cache" in msg
    assert exc.value.status == 502 and exc.value.fields["permanent"] is True


def test_load_failure_is_a_502_over_http(tmp_path: Path) -> None:
    import httpx

    from tests.conftest import run_stack

    (tmp_path / "ghost.yaml").write_text(
        "sie_id: ghost/model\nhf_id: ghost/model\ntasks: {encode: {dense: {dim: 4}}}\n"
        "profiles: {default: {adapter_path: 'sie.engines.encoders.sentence_transformers:DenseEncoder', max_batch_tokens: 64}}\n"
    )
    with (
        run_stack(models_dir=str(tmp_path)) as s,
        httpx.Client(base_url=s.base_url, timeout=30) as c,
    ):
        r = c.post("/v1/encode/ghost/model", json={"items": [{"text": "a"}, {"text": "b"}]})
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["code"] == "MODEL_LOAD_FAILED" and "retry-after" not in r.headers
        # the SDK's terminal model-load contract (architecture §2)
        assert (err["error_class"], err["attempts"], err["permanent"]) == ("NOT_FOUND", 1, True), (
            err
        )
        info = c.get("/v1/models/ghost/model").json()
        deadline = time.monotonic() + 5
        while info["state"] != "failed" and time.monotonic() < deadline:
            time.sleep(0.1)
            info = c.get("/v1/models/ghost/model").json()
        assert info["state"] == "failed" and info["last_error"]["code"] == "MODEL_LOAD_FAILED"
        # the worker is alive: a second request gets the same sticky error, fast
        assert c.post("/v1/encode/ghost/model", json={"items": [{"text": "c"}]}).status_code == 502


def test_length_bucketed_batches_match_sentence_transformers(
    engine: DenseEncoder, st_model: object
) -> None:
    texts = [
        ("short " * (1 + i % 3)) if i % 2 else ("a much longer sentence " * (5 + i))
        for i in range(24)
    ]
    kw = {
        "output_types": ["dense"],
        "options": {"normalize": True},
    }
    assert len(engine._chunks(texts)) > 1  # the split really happens
    got = engine.encode(texts, **kw)["dense"]
    np.testing.assert_allclose(got, st_model.encode(texts), atol=1e-5)  # type: ignore[attr-defined]


def test_declared_dim_must_match_the_weights() -> None:
    doc = (CONFIGS / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text()
    cfg = parse_model_config(doc.replace("dim: 384", "dim: 123"))
    e = DenseEncoder(cfg, cfg.resolve_profile(), "cpu")
    with pytest.raises(ModelLoadFailed, match=r"dim is 123 but the weights produce 384"):
        e.load()


MIXED = [
    "hello",
    "a much longer sentence that needs padding next to the short ones " * 2,
    "word " * 700,  # truncated at the window
    "日本語の文書",
    "mid length text with a few words",
]


def test_cpu_engine_uses_the_trace_and_it_equals_eager(engine: DenseEncoder) -> None:
    """sie.engines.encoders.torchscript: one GIL-free call per forward pass, same numbers."""
    assert engine._traced is not None
    kw = {"output_types": ["dense", "multivector"], "options": {"normalize": True}}
    traced = engine.encode(MIXED, **kw)
    saved, engine._traced = engine._traced, None
    try:
        eager = engine.encode(MIXED, **kw)
    finally:
        engine._traced = saved
    np.testing.assert_allclose(traced["dense"], eager["dense"], atol=1e-6)
    for t, e in zip(traced["multivector"], eager["multivector"], strict=True):
        assert t.shape == e.shape
        np.testing.assert_allclose(t, e, atol=1e-6)


def test_a_trace_that_differs_from_eager_is_not_used(
    st_model: object, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from sie.engines.encoders import torchscript

    assert torchscript.trace_st_encoder(st_model) is not None
    monkeypatch.setattr(torchscript, "TOLERANCE", -1.0)  # nothing can match now
    with caplog.at_level("WARNING", logger="sie.engines.encoders.torchscript"):
        assert torchscript.trace_st_encoder(st_model) is None
    assert "eager kept" in caplog.text


def test_other_pipelines_are_not_traced() -> None:
    """SPLADE's first module is an MLM head, not the plain encoder the trace covers."""
    from sie.engines.encoders.sentence_transformers import SparseEncoder
    from sie.engines.encoders.torchscript import trace_st_encoder

    cfg = parse_model_config((CONFIGS / "rasyosef__splade-tiny.yaml").read_text())
    sparse = SparseEncoder(cfg, cfg.resolve_profile(), "cpu")
    sparse.load()
    assert trace_st_encoder(sparse._model) is None


def test_concurrent_engine_calls_equal_sequential_ones(engine: DenseEncoder) -> None:
    """DenseEncoder.concurrent_calls: two threads encoding at once get the same vectors."""
    import threading

    batches = [[f"text {i} " * (1 + (i * j) % 30) for i in range(1 + j % 7)] for j in range(24)]
    kw = {"output_types": ["dense"], "options": {"normalize": True}}
    want = [engine.encode(b, **kw)["dense"] for b in batches]
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def run(part: int) -> None:
        try:
            for j in range(part, len(batches), 2):
                got[j] = engine.encode(batches[j], **kw)["dense"]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for j, w in enumerate(want):
        np.testing.assert_allclose(got[j], w, atol=1e-6)
