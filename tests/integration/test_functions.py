"""The three functions over real HTTP, JSON and msgpack (reference §1.5-§1.7, §4.4-§4.7).

One all-roles stack serves the shipped configs (MiniLM dense + multivector + cosine
score, splade-tiny sparse, Rampart extraction) plus two models the tests build:
MiniLM distilled into a cross-encoder, and an untrained GLiNER (plumbing).
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import msgpack_numpy
import numpy as np
import pytest

from tests.conftest import BUNDLES, CONFIGS, MINILM, MODEL_CACHE, Stack, run_stack
from tests.distill import reranker_config_yaml

pytestmark = pytest.mark.slow

SPLADE = "rasyosef/splade-tiny"
RAMPART = "nationaldesignstudio/rampart"
RERANKER = "test/minilm-cross-encoder"
GLINER = "test/gliner-untrained"
JSON = {"Accept": "application/json"}
MSGPACK = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}


def _extra_configs(models: Path, cross_encoder_dir: Path, gliner_dir: Path) -> None:
    (models / "reranker.yaml").write_text(reranker_config_yaml(RERANKER, cross_encoder_dir))
    (models / "gliner.yaml").write_text(
        f"""sie_id: {GLINER}
weights_path: {gliner_dir}
tasks: {{extract: {{}}}}
profiles:
  default:
    adapter_path: sie.engines.extractors.gliner:GlinerExtractor
    max_batch_tokens: 8192
"""
    )


@pytest.fixture(scope="module")
def fstack(
    tmp_path_factory: pytest.TempPathFactory, cross_encoder_dir: Path, gliner_dir: Path
) -> Iterator[Stack]:
    models = tmp_path_factory.mktemp("models")
    for f in CONFIGS.glob("*.yaml"):
        shutil.copy(f, models / f.name)
    _extra_configs(models, cross_encoder_dir, gliner_dir)
    # the operator lets configs use the models the tests build (docs/security.md)
    with run_stack(
        models_dir=str(models), preload=(MINILM,), weights_roots=(str(MODEL_CACHE),)
    ) as s:
        yield s


@pytest.fixture(scope="module")
def c(fstack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fstack.base_url, timeout=120, headers=JSON) as client:
        yield client


def mp(client: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    r = client.post(path, content=msgpack.packb(body), headers=MSGPACK)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/msgpack"
    return msgpack.unpackb(r.content, object_hook=msgpack_numpy.decode, raw=False)


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def bad(r: httpx.Response, status: int, field: str) -> str:
    assert r.status_code == status, r.text
    detail = r.json().get("detail") or r.json().get("error")
    assert detail["code"] == "INVALID_INPUT" and detail.get("field") == field, detail
    return str(detail["message"])


# -- encode ---------------------------------------------------------------------------


def test_dense_and_multivector_in_one_call(c: httpx.Client, st_model: Any) -> None:
    texts = ["short", "a much longer sentence about dense and late-interaction retrieval"]
    body = {
        "items": [{"text": t} for t in texts],
        "params": {"output_types": ["dense", "multivector"]},
    }
    items = ok(c.post(f"/v1/encode/{MINILM}", json=body))["items"]
    ref_tokens = st_model.encode(texts, output_value="token_embeddings")
    for it, text, ref in zip(items, texts, ref_tokens, strict=True):
        mv = it["multivector"]
        values = np.array(mv["values"], dtype=np.float32)
        # one row per real token ([CLS] ... [SEP]), no padding rows even in a mixed batch
        n = len(st_model.tokenizer(text)["input_ids"])
        assert mv["num_tokens"] == n == values.shape[0] and mv["token_dims"] == 384
        ref = ref.numpy()
        np.testing.assert_allclose(
            values, ref / np.linalg.norm(ref, axis=1, keepdims=True), atol=1e-5
        )
        np.testing.assert_allclose(it["dense"]["values"], st_model.encode(text), atol=1e-5)
    alone = ok(c.post(f"/v1/encode/{MINILM}", json={**body, "items": [{"text": "short"}]}))
    np.testing.assert_allclose(
        alone["items"][0]["multivector"]["values"], items[0]["multivector"]["values"], atol=1e-5
    )


def test_sparse_splade_is_sorted_positive_and_meaningful(c: httpx.Client) -> None:
    def sparse(text: str, is_query: bool) -> dict[int, float]:
        body = {
            "items": [{"text": text}],
            "params": {"output_types": ["sparse"], "is_query": is_query},
        }
        s = ok(c.post(f"/v1/encode/{SPLADE}", json=body))["items"][0]["sparse"]
        assert s["dims"] == 30522 and s["dtype"] == "float32"
        assert s["indices"] == sorted(s["indices"]) and len(set(s["indices"])) == len(s["indices"])
        assert all(v > 0 for v in s["values"]) and len(s["values"]) == len(s["indices"])
        return dict(zip(s["indices"], s["values"], strict=True))

    q = sparse("how do I bake bread", True)
    bread = sparse("Knead the dough and bake the bread at 220C.", False)
    stocks = sparse("The stock market fell sharply on Monday.", False)

    def dot(a: dict[int, float], b: dict[int, float]) -> float:
        return sum(v * b.get(k, 0.0) for k, v in a.items())

    assert dot(q, bread) > 5 * max(dot(q, stocks), 0.1)
    # no output_types: the profile's default (a sparse-only model: sparse), on both engines
    for model in (SPLADE, f"{SPLADE}:onnx"):
        got = ok(c.post(f"/v1/encode/{model}", json={"items": [{"text": "how do I bake bread"}]}))
        assert set(got["items"][0]) >= {"sparse"} and "dense" not in got["items"][0]
        plain = got["items"][0]["sparse"]
        assert plain["dims"] == 30522 and len(plain["indices"]) > 0


def test_unsupported_output_type_names_it(c: httpx.Client) -> None:
    body = {"items": [{"text": "x"}], "params": {"output_types": ["sparse"]}}
    msg = bad(c.post(f"/v1/encode/{MINILM}", json=body), 400, "params.output_types")
    assert "sparse" in msg
    body = {"items": [{"text": "x"}], "params": {"output_types": ["dense"]}}
    assert "dense" in bad(c.post(f"/v1/encode/{SPLADE}", json=body), 400, "params.output_types")


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_output_dtypes(c: httpx.Client, wire: str) -> None:
    text = "quantised vectors keep their shape"
    ref = np.array(
        ok(c.post(f"/v1/encode/{MINILM}", json={"items": [{"text": text}]}))["items"][0]["dense"][
            "values"
        ],
        dtype=np.float32,
    )
    expect = {
        "float32": ("float32", (384,), np.float32),
        "float16": ("float16", (384,), np.float16),
        "int8": ("int8", (384,), np.int8),
        "uint8": ("uint8", (384,), np.uint8),
        "binary": ("binary", (48,), np.uint8),
        "ubinary": ("binary", (48,), np.uint8),
    }
    for dtype, (label, shape, np_type) in expect.items():
        body = {
            "items": [{"text": text}],
            "params": {"output_dtype": dtype, "output_types": ["dense", "multivector"]},
        }
        if wire == "json":
            item = ok(c.post(f"/v1/encode/{MINILM}", json=body))["items"][0]
            values = np.array(item["dense"]["values"])
        else:
            item = mp(c, f"/v1/encode/{MINILM}", body)["items"][0]
            values = item["dense"]["values"]
            assert values.dtype == np_type  # msgpack-numpy carries the real dtype
        d = item["dense"]
        assert d["dtype"] == label and d["dims"] == 384 and values.shape == shape
        mv = item["multivector"]
        assert mv["dtype"] == label and np.asarray(mv["values"]).shape[0] == mv["num_tokens"]
        if dtype == "int8":
            assert np.abs(values).max() == 127
            np.testing.assert_allclose(values / 127, ref / np.abs(ref).max(), atol=0.01)
        if dtype == "uint8":
            assert values.min() == 0 and values.max() == 255
        if dtype in ("binary", "ubinary"):
            bits = np.unpackbits(np.asarray(values, dtype=np.uint8))[:384]
            np.testing.assert_array_equal(bits, (ref > 0).astype(np.uint8))
    # sparse never goes below float16
    for dtype, label in (("int8", "float32"), ("binary", "float32"), ("float16", "float16")):
        body = {
            "items": [{"text": text}],
            "params": {"output_types": ["sparse"], "output_dtype": dtype},
        }
        if wire == "json":
            s = ok(c.post(f"/v1/encode/{SPLADE}", json=body))["items"][0]["sparse"]
        else:
            s = mp(c, f"/v1/encode/{SPLADE}", body)["items"][0]["sparse"]
        assert s["dtype"] == label


def test_embeddings_route_is_for_dense_models_only(c: httpx.Client) -> None:
    r = c.post("/v1/embeddings", json={"model": SPLADE, "input": "x"})
    assert r.status_code == 400 and "dense" in r.json()["error"]["message"]
    r = c.post("/v1/embeddings", json={"model": MINILM, "input": "x"})
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384


def test_concurrent_requests_with_different_options_are_not_mixed(c: httpx.Client) -> None:
    """Batches group by output types and options (reference §4.6): each request gets
    what it asked for, even when they arrive together."""
    import concurrent.futures

    def one(i: int) -> tuple[int, Any]:
        params = [
            {"output_dtype": "uint8", "output_types": ["dense", "multivector"]},
            {"output_dtype": "int8"},
            {"output_types": ["multivector"]},
            {},
        ][i % 4]
        body = {"items": [{"text": f"request {i}"}], "params": params}
        return i, ok(c.post(f"/v1/encode/{MINILM}", json=body))["items"][0]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for i, item in pool.map(one, range(32)):
            kind = i % 4
            if kind == 0:
                assert set(item) == {"dense", "multivector"}
                assert item["dense"]["dtype"] == item["multivector"]["dtype"] == "uint8"
            elif kind == 1:
                assert item["dense"]["dtype"] == "int8"
            elif kind == 2:
                assert set(item) == {"multivector"}
            else:
                assert abs(np.linalg.norm(item["dense"]["values"]) - 1.0) < 1e-4


# -- score ----------------------------------------------------------------------------

HELD_OUT = [
    (
        "which planet has the largest moons",
        "Jupiter's moon Ganymede is bigger than the planet Mercury.",
        [
            "Add a pinch of salt to the boiling water before the spaghetti.",
            "The central bank raised interest rates again this quarter.",
            "The striker scored twice in the second half.",
            "Water the tomato seedlings every morning in summer.",
        ],
    ),
    (
        "how to fix a memory leak in a long running service",
        "A memory leak in a service is found by profiling its heap over time.",
        [
            "The orchestra tuned their violins before the concert.",
            "Pack light when you travel through the mountains by train.",
            "The goalkeeper saved a penalty in extra time.",
            "Preheat the oven and grease the baking tin.",
        ],
    ),
]


@pytest.mark.parametrize("model", [RERANKER, MINILM, SPLADE])
def test_score_ranks_the_relevant_item_first(c: httpx.Client, model: str) -> None:
    for query, relevant, others in HELD_OUT:
        items = [{"text": t} for t in others[:2]] + [{"id": "hit", "text": relevant}]
        items += [{"text": t} for t in others[2:]]
        out = ok(
            c.post(
                f"/v1/score/{model}", json={"query": {"id": "q1", "text": query}, "items": items}
            )
        )
        assert out["model"] == model and out["query_id"] == "q1"
        scores = out["scores"]
        assert [s["rank"] for s in scores] == list(range(len(items)))
        assert sorted(s["item_id"] for s in scores) == sorted(
            ["hit", "item-0", "item-1", "item-3", "item-4"]
        )
        assert scores[0]["item_id"] == "hit", scores
        assert all(a["score"] >= b["score"] for a, b in itertools.pairwise(scores))


def test_score_ties_keep_input_order_and_top_k_is_a_prefix(c: httpx.Client) -> None:
    items = [{"text": "same text"}, {"text": "other words"}, {"text": "same text"}]
    full = ok(c.post(f"/v1/score/{RERANKER}", json={"query": {"text": "same"}, "items": items}))
    ids = [s["item_id"] for s in full["scores"]]
    assert ids.index("item-0") < ids.index("item-2")  # equal scores: input order
    top = ok(
        c.post(
            f"/v1/score/{RERANKER}", json={"query": {"text": "same"}, "items": items, "top_k": 2}
        )
    )
    assert top["scores"] == full["scores"][:2]
    decoded = mp(c, f"/v1/score/{RERANKER}", {"query": {"text": "same"}, "items": items})
    assert [s["item_id"] for s in decoded["scores"]] == ids


def test_score_errors(c: httpx.Client) -> None:
    url = f"/v1/score/{RERANKER}"
    bad(c.post(url, json={"query": {"text": "q"}, "items": []}), 400, "items")
    bad(c.post(url, json={"items": [{"text": "a"}]}), 400, "query")
    bad(c.post(url, json={"query": {"text": "q"}, "items": [{"id": "x"}]}), 400, "items[0].text")
    bad(
        c.post(url, json={"query": {"text": "q"}, "items": [{"text": "a"}], "top_k": 0}),
        400,
        "top_k",
    )
    msg = bad(
        c.post(f"/v1/score/{RAMPART}", json={"query": {"text": "q"}, "items": [{"text": "a"}]}),
        400,
        "model",
    )
    assert "scor" in msg
    r = c.post(
        f"/v1/score/{RERANKER}",
        json={"query": {"text": "q"}, "items": [{"text": "a"}], "options": {"activation": "tanh"}},
    )
    bad(r, 400, "options.activation")


# -- extract --------------------------------------------------------------------------

PII = "😀 東京\tMy name is John Smith and I live at 12 Baker Street, London.\nEmail john.smith@example.com"


@pytest.mark.parametrize("wire", ["json", "msgpack"])
def test_extract_pii_with_exact_offsets(c: httpx.Client, wire: str) -> None:
    texts = [PII, "Ce\u0301line Dubois vit a\u0300 Paris.", "nothing to see here"]
    body = {"items": [{"id": "doc", "text": texts[0]}, {"text": texts[1]}, {"text": texts[2]}]}
    out = (
        ok(c.post(f"/v1/extract/{RAMPART}", json=body))
        if wire == "json"
        else mp(c, f"/v1/extract/{RAMPART}", body)
    )
    items = out["items"]
    assert [it["id"] for it in items] == ["doc", "item-1", "item-2"]
    for it, text in zip(items, texts, strict=True):
        assert set(it) == {"id", "entities", "relations", "classifications", "objects", "data"}
        for e in it["entities"]:
            assert text[e["start"] : e["end"]] == e["text"] and 0 <= e["score"] <= 1
    found = {(e["label"], e["text"]) for e in items[0]["entities"]}
    assert {
        ("GIVEN_NAME", "John"),
        ("SURNAME", "Smith"),
        ("STREET_NAME", "Baker Street"),
        ("CITY", "London"),
        ("EMAIL", "john.smith@example.com"),
    } <= found
    assert items[2]["entities"] == []


def test_extract_labels_filter_and_long_text(c: httpx.Client) -> None:
    body = {"items": [{"text": PII}], "params": {"labels": ["CITY"]}}
    ents = ok(c.post(f"/v1/extract/{RAMPART}", json=body))["items"][0]["entities"]
    assert [(e["label"], e["text"]) for e in ents] == [("CITY", "London")]
    filler = "The weather report mentioned light rain and a mild breeze. " * 80
    text = filler + "Please contact Maria Gonzalez about the invoice."
    ents = ok(c.post(f"/v1/extract/{RAMPART}", json={"items": [{"text": text}]}))["items"][0][
        "entities"
    ]
    names = [e for e in ents if e["label"] in ("GIVEN_NAME", "SURNAME")]
    assert names and all(e["start"] > len(filler) - 1 for e in names)  # past the first window
    assert all(text[e["start"] : e["end"]] == e["text"] for e in ents)


def test_extract_gliner_plumbing(c: httpx.Client) -> None:
    text = "😀 Barack Obama met 李明 in Paris on Monday."
    body = {
        "items": [{"text": text}],
        "params": {"labels": ["person", "location"], "options": {"threshold": 0.0}},
    }
    ents = ok(c.post(f"/v1/extract/{GLINER}", json=body))["items"][0]["entities"]
    assert ents and {e["label"] for e in ents} <= {"person", "location"}
    assert all(text[e["start"] : e["end"]] == e["text"] for e in ents)
    strict = {**body, "params": {**body["params"], "options": {"threshold": 0.99}}}
    assert len(ok(c.post(f"/v1/extract/{GLINER}", json=strict))["items"][0]["entities"]) < len(ents)
    bad(c.post(f"/v1/extract/{GLINER}", json={"items": [{"text": text}]}), 400, "params.labels")
    bad(
        c.post(f"/v1/extract/{GLINER}", json={"items": [{"text": text}], "params": {"labels": []}}),
        400,
        "params.labels",
    )
    bad(
        c.post(
            f"/v1/extract/{GLINER}",
            json={
                "items": [{"text": text}],
                "params": {"labels": ["x"], "options": {"threshold": "high"}},
            },
        ),
        400,
        "params.options.threshold",
    )


def test_extract_errors(c: httpx.Client) -> None:
    bad(c.post(f"/v1/extract/{RAMPART}", json={"items": []}), 400, "items")
    # extract reads a whole text window by window: a huge one is refused before it can
    # hold the model for minutes (found by a new-user trial: 1,000,000 characters)
    t0 = time.monotonic()
    huge = {"items": [{"text": "a"}, {"text": "üüü " * 25_001}]}
    msg = bad(c.post(f"/v1/extract/{RAMPART}", json=huge), 400, "items[1].text")
    assert "100000" in msg and time.monotonic() - t0 < 2
    msg = bad(c.post(f"/v1/extract/{MINILM}", json={"items": [{"text": "a"}]}), 400, "model")
    assert "extract" in msg


# -- multi-model workers ----------------------------------------------------------------


def test_eviction_under_a_budget_that_fits_one_model(tmp_path: Path, st_model: Any) -> None:
    """Two MiniLM-sized models, a budget for one: alternating requests keep answering
    correctly, and /v1/models shows the loads and evictions (reference §4.5)."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(CONFIGS / "sentence-transformers__all-MiniLM-L6-v2.yaml", models / "a.yaml")
    text = (models / "a.yaml").read_text()
    (models / "b.yaml").write_text(
        text.replace("sie_id: sentence-transformers/all-MiniLM-L6-v2", "sie_id: acme/minilm-b")
    )
    with (
        run_stack(
            models_dir=str(models),
            bundles_dir=str(BUNDLES),
            memory_budget_bytes=150_000_000,  # MiniLM is ~91 MB in float32
        ) as s,
        httpx.Client(base_url=s.base_url, timeout=120, headers=JSON) as client,
    ):
        want = st_model.encode(["alternate"])[0]
        for model in [MINILM, "acme/minilm-b"] * 3:
            r = client.post(f"/v1/encode/{model}", json={"items": [{"text": "alternate"}]})
            np.testing.assert_allclose(ok(r)["items"][0]["dense"]["values"], want, atol=1e-5)
        worker = s.running.worker
        assert worker is not None
        assert worker.models.loaded_bytes <= 150_000_000

        def counts() -> dict[str, tuple[int, int]]:
            listing = client.get("/v1/models").json()["models"]
            bases = (MINILM, "acme/minilm-b")  # not the :onnx profile variants
            return {m["name"]: (m["loads"], m["evictions"]) for m in listing if m["name"] in bases}

        import time

        deadline = time.monotonic() + 10  # heartbeats carry the counts
        while counts() != {MINILM: (3, 3), "acme/minilm-b": (3, 2)} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counts() == {MINILM: (3, 3), "acme/minilm-b": (3, 2)}


def test_concurrent_first_requests_load_once_and_failures_stay_local(tmp_path: Path) -> None:
    import concurrent.futures

    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(CONFIGS / "sentence-transformers__all-MiniLM-L6-v2.yaml", models / "a.yaml")
    (models / "broken.yaml").write_text(
        f"""sie_id: acme/broken
weights_path: {tmp_path / "nowhere"}
tasks: {{encode: {{dense: {{dim: 8}}}}}}
profiles:
  default:
    adapter_path: sie.engines.encoders.sentence_transformers:DenseEncoder
    max_batch_tokens: 1024
"""
    )
    with (
        run_stack(
            models_dir=str(models), bundles_dir=str(BUNDLES), weights_roots=(str(tmp_path),)
        ) as s,
        httpx.Client(base_url=s.base_url, timeout=120, headers=JSON) as client,
    ):

        def one(i: int) -> int:
            r = client.post(f"/v1/encode/{MINILM}", json={"items": [{"text": f"t{i}"}]})
            return r.status_code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(8))) == [200] * 8
        worker = s.running.worker
        assert worker is not None
        statuses = {m["name"]: m for m in [st.to_map() for st in worker.models.statuses()]}
        assert statuses[MINILM]["loads"] == 1
        r = client.post("/v1/encode/acme/broken", json={"items": [{"text": "x"}]})
        assert r.status_code == 502 and "retry-after" not in r.headers
        assert r.json()["error"]["code"] == "MODEL_LOAD_FAILED"
        err = {m["name"]: m for m in [st.to_map() for st in worker.models.statuses()]}[
            "acme/broken"
        ]["last_error"]
        assert err["error_class"] == "NOT_FOUND" and err["permanent"] is True
        assert err["attempts"] >= 1
        # the worker and the other model are unaffected
        r = client.post(f"/v1/encode/{MINILM}", json={"items": [{"text": "still here"}]})
        assert r.status_code == 200


def test_large_score_requests_are_chunked_and_errors_stay_4xx(c: httpx.Client) -> None:
    """A score request is one work item, but its candidates reach the batcher in chunks:
    results equal scoring them one by one, and a chunk's error is the request's 400."""
    docs = [
        f"document {i} about {'bread baking' if i % 7 == 0 else 'stock prices'}" for i in range(100)
    ]
    body = {"query": {"text": "baking bread"}, "items": [{"text": d} for d in docs]}
    big = ok(c.post(f"/v1/score/{RERANKER}", json=body))["scores"]
    assert len(big) == 100 and sorted(s["item_id"] for s in big) == sorted(
        f"item-{i}" for i in range(100)
    )
    by_id = {s["item_id"]: s["score"] for s in big}
    for i in (0, 35, 99):  # the same pair alone scores the same
        alone = ok(c.post(f"/v1/score/{RERANKER}", json={**body, "items": [{"text": docs[i]}]}))
        assert abs(alone["scores"][0]["score"] - by_id[f"item-{i}"]) < 1e-4
    r = c.post(f"/v1/score/{RERANKER}", json={**body, "options": {"activation": "tanh"}})
    bad(r, 400, "options.activation")


def test_shared_options_are_type_checked_on_every_function(c: httpx.Client) -> None:
    q = {"query": {"text": "q"}, "items": [{"text": "a"}]}
    bad(
        c.post(f"/v1/score/{MINILM}", json={**q, "options": {"normalize": "yes"}}),
        400,
        "options.normalize",
    )
    bad(
        c.post(
            f"/v1/extract/{RAMPART}",
            json={"items": [{"text": "a"}], "params": {"options": {"is_query": "x"}}},
        ),
        400,
        "params.options.is_query",
    )
    bad(
        c.post(f"/v1/score/{SPLADE}", json={**q, "options": {"max_active_dims": -1}}),
        400,
        "options.max_active_dims",
    )


def test_profile_in_the_id_and_in_options_must_agree(c: httpx.Client) -> None:
    body = {"items": [{"text": "a"}], "params": {"options": {"profile": "other"}}}
    bad(c.post(f"/v1/encode/{MINILM}:default", json=body), 400, "params.options.profile")
    body["params"]["options"]["profile"] = "default"
    ok(c.post(f"/v1/encode/{MINILM}:default", json=body))


def test_unforwardable_values_name_their_field(c: httpx.Client) -> None:
    raw = b'{"items":[{"text":"a"}],"params":{"output_schema":{"k":"\\udfff"}}}'
    r = c.post(f"/v1/extract/{RAMPART}", content=raw, headers={"Content-Type": "application/json"})
    bad(r, 400, "params.output_schema")
    raw = b'{"query":{"text":"q"},"items":[{"text":"a"}],"options":{"x":"\\udfff"}}'
    r = c.post(f"/v1/score/{MINILM}", content=raw, headers={"Content-Type": "application/json"})
    assert bad(r, 400, "options").startswith("options:")
