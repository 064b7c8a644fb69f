"""Drop-in routes over real HTTP with the clients users call them with (docs/api.md §15):
Cohere's v1 and v2 clients and LlamaIndex's ``CohereRerank`` on ``/v1/rerank`` and
``/v2/rerank``; TEI's ``/embed``, ``/embed_sparse``, ``/rerank`` and ``/info`` (httpx, and
``huggingface_hub``'s ``InferenceClient``); OpenAI ``models.retrieve``; ``/version``;
the native functions with the model in the body; close-match hints on every 404.

``dstack`` serves the shipped configs plus MiniLM distilled into a cross-encoder, with
the three drop-in default models set; the session ``stack`` sets none.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest

import sie
from tests.conftest import CONFIGS, MINILM, MODEL_CACHE, ROOT, Stack, run_stack
from tests.distill import reranker_config_yaml

pytestmark = pytest.mark.slow

SPLADE = "rasyosef/splade-tiny"
RERANKER = "test/minilm-cross-encoder"
QUERY = "how do I bake bread"
DOCS = [
    "The stock market fell sharply on Monday.",
    "Knead the dough, let it rise, then bake the loaf at 220C.",
    "The goalkeeper saved a penalty in extra time.",
]
BREAD = 1  # the relevant document


@pytest.fixture(scope="module")
def dstack(tmp_path_factory: pytest.TempPathFactory, cross_encoder_dir: Path) -> Iterator[Stack]:
    models = tmp_path_factory.mktemp("models")
    for f in CONFIGS.glob("*.yaml"):
        shutil.copy(f, models / f.name)
    (models / "reranker.yaml").write_text(reranker_config_yaml(RERANKER, cross_encoder_dir))
    with run_stack(
        models_dir=str(models),
        preload=(MINILM,),
        weights_roots=(str(MODEL_CACHE),),  # the distilled cross-encoder (docs/security.md)
        default_embed_model=MINILM,
        default_sparse_model=SPLADE,
        default_rerank_model=RERANKER,
    ) as s:
        yield s


@pytest.fixture(scope="module")
def d(dstack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=dstack.base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def plain(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        yield client


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def native_scores(client: httpx.Client, model: str, query: str, docs: list[str]) -> list[float]:
    """The scores ``POST /v1/score`` gives, in document order."""
    body = {"query": {"text": query}, "items": [{"text": t} for t in docs]}
    out = ok(client.post(f"/v1/score/{model}", json=body))["scores"]
    by_index = {int(s["item_id"].removeprefix("item-")): s["score"] for s in out}
    return [by_index[i] for i in range(len(docs))]


def tei_refusal(r: httpx.Response, status: int, field: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert isinstance(body["error"], str) and body["error_type"] == "Validation"
    assert body["field"] == field and r.headers["x-sie-error-code"] == body["code"]
    return body


# ------------------------------------------------------------------ Cohere / Jina rerank


@pytest.mark.parametrize("model", [RERANKER, MINILM])
def test_cohere_v2_client_ranks_as_the_score_route(
    dstack: Stack, d: httpx.Client, model: str
) -> None:
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=dstack.base_url)
    got = client.rerank(model=model, query=QUERY, documents=DOCS, top_n=2)
    native = native_scores(d, model, QUERY, DOCS)
    assert got.results[0].index == BREAD and len(got.results) == 2
    for r in got.results:
        assert r.relevance_score == pytest.approx(native[r.index], abs=1e-6)
    assert got.results[0].relevance_score >= got.results[1].relevance_score
    assert got.id and got.meta is not None and got.meta.api_version is not None
    assert got.meta.api_version.version == "2"
    assert got.meta.tokens is not None and (got.meta.tokens.input_tokens or 0) > 0


def test_cohere_v1_client_objects_default_model_and_documents(
    dstack: Stack, d: httpx.Client
) -> None:
    import cohere

    client = cohere.Client(api_key="unused", base_url=dstack.base_url)
    docs: list[Any] = [DOCS[0], {"text": DOCS[1], "title": "bread"}, DOCS[2]]
    got = client.rerank(query=QUERY, documents=docs, return_documents=True)  # no model
    native = native_scores(d, RERANKER, QUERY, DOCS)  # SIE_DEFAULT_RERANK_MODEL
    assert [r.index for r in got.results] == sorted(range(3), key=lambda i: -native[i])
    top = got.results[0]
    assert top.index == BREAD and top.document is not None
    assert top.document.text == DOCS[1] and top.document.title == "bread"  # type: ignore[attr-defined]
    assert got.results[1].document is not None and got.results[1].document.text in DOCS
    assert got.meta is not None and got.meta.api_version.version == "1"  # type: ignore[union-attr]
    bare = client.rerank(query=QUERY, documents=DOCS, top_n=1)
    assert [r.index for r in bare.results] == [BREAD] and bare.results[0].document is None


def test_llama_index_cohere_rerank_points_at_sie(dstack: Stack) -> None:
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    reranker = CohereRerank(
        model=RERANKER, top_n=2, api_key="unused", base_url=dstack.base_url, max_retries=1
    )
    nodes = [NodeWithScore(node=TextNode(text=t), score=0.0) for t in DOCS]
    out = reranker.postprocess_nodes(nodes, query_str=QUERY)
    assert len(out) == 2 and out[0].node.get_content() == DOCS[BREAD]
    assert out[0].score is not None and out[1].score is not None and out[0].score >= out[1].score


def test_jina_shaped_body_and_usage(d: httpx.Client) -> None:
    body = {
        "model": MINILM,
        "query": QUERY,
        "documents": [{"text": t} for t in DOCS],
        "top_n": 5,  # more than there are: all of them
        "return_documents": True,
    }
    out = ok(d.post("/v1/rerank", json=body))
    assert out["results"][0]["index"] == BREAD and len(out["results"]) == 3
    assert out["results"][0]["document"] == {"text": DOCS[BREAD]}
    assert out["model"] == MINILM and out["usage"]["total_tokens"] > 0
    assert out["meta"]["tokens"]["input_tokens"] == out["usage"]["total_tokens"]


def test_rerank_refuses_what_it_cannot_honour(d: httpx.Client) -> None:
    base = {"model": MINILM, "query": QUERY, "documents": DOCS}

    def refused(extra: dict[str, Any], field: str, status: int = 400) -> str:
        r = d.post("/v1/rerank", json={**base, **extra})
        assert r.status_code == status, r.text
        body = r.json()
        assert body["detail"]["field"] == field and body["message"] == body["detail"]["message"]
        return str(body["message"])

    assert "text field only" in refused({"rank_fields": ["title"]}, "rank_fields")
    assert "chunks" in refused({"max_chunks_per_doc": 4}, "max_chunks_per_doc")
    assert "256" in refused({"max_tokens_per_doc": 100}, "max_tokens_per_doc")
    refused({"documents": [{"title": "no text"}]}, "documents[0].text")
    refused({"documents": []}, "documents")
    refused({"top_n": 0}, "top_n")
    refused({"documents": ["x" * 1_000_001]}, "documents[0]")
    # harmless ones are accepted: the same ranking
    same = {"rank_fields": ["text"], "max_chunks_per_doc": 1, "max_tokens_per_doc": 4096}
    a = ok(d.post("/v1/rerank", json=base))["results"]
    b = ok(d.post("/v2/rerank", json={**base, **same, "priority": 3}))["results"]
    assert a == b
    miss = d.post("/v2/rerank", json={**base, "model": "all-MiniLM-L6-v2"})
    assert miss.status_code == 404 and MINILM in miss.json()["detail"]["suggestions"]


def test_rerank_without_a_model_or_default_names_the_setting(plain: httpx.Client) -> None:
    r = plain.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
    assert r.status_code == 400
    detail = r.json()["detail"]
    assert detail["field"] == "model" and "SIE_DEFAULT_RERANK_MODEL" in detail["message"]


# ------------------------------------------------------------------------------- TEI


def test_tei_embed_matches_sentence_transformers(d: httpx.Client, st_model: Any) -> None:
    out = ok(d.post("/embed", json={"inputs": DOCS}))  # SIE_DEFAULT_EMBED_MODEL
    assert isinstance(out, list) and all(isinstance(v, list) and len(v) == 384 for v in out)
    np.testing.assert_allclose(np.asarray(out, dtype=np.float32), st_model.encode(DOCS), atol=1e-5)
    one = ok(d.post("/embed", json={"inputs": DOCS[0], "model": MINILM, "truncate": True}))
    np.testing.assert_allclose(one[0], out[0], atol=1e-6)
    raw = ok(d.post("/embed", json={"inputs": DOCS[:1], "normalize": False}))
    want = st_model.encode(DOCS[:1], normalize_embeddings=False)
    np.testing.assert_allclose(np.asarray(raw, dtype=np.float32), want, atol=1e-4)
    # (MiniLM's own pipeline ends in a Normalize module, so its vectors stay unit length)
    query = ok(d.post("/embed", json={"inputs": DOCS[:1], "prompt_name": "query"}))
    np.testing.assert_allclose(query[0], out[0], atol=1e-6)  # MiniLM has no query prompt


def test_tei_embed_refusals(d: httpx.Client) -> None:
    long = "word " * 600
    body = tei_refusal(
        d.post("/embed", json={"inputs": ["short", long], "truncate": False}), 400, "inputs[1]"
    )
    assert body["code"] == "INVALID_INPUT" and body["limit"] == 256 and "256" in body["error"]
    ok(d.post("/embed", json={"inputs": ["short", long]}))  # truncation is the default
    ok(d.post("/embed", json={"inputs": ["short"], "truncate": False}))
    wrapped = {"inputs": [long], "parameters": {"truncate": False}}  # the Inference API's shape
    tei_refusal(d.post("/embed", json=wrapped), 400, "inputs[0]")
    twice = {"inputs": "x", "truncate": True, "parameters": {"truncate": True}}
    tei_refusal(d.post("/embed", json=twice), 400, "parameters.truncate")
    tei_refusal(
        d.post("/embed", json={"inputs": [long], "truncation_direction": "Left"}),
        400,
        "inputs[0]",
    )
    tei_refusal(d.post("/embed", json={"inputs": [[101, 102]]}), 400, "inputs")
    tei_refusal(d.post("/embed", json={"inputs": "x", "prompt_name": "nope"}), 400, "prompt_name")
    tei_refusal(d.post("/embed", json={"inputs": "x", "dimensions": 128}), 400, "dimensions")
    tei_refusal(d.post("/embed", json={"inputs": "x", "model": SPLADE}), 400, "model")
    tei_refusal(d.post("/embed", json={"inputs": []}), 400, "inputs")
    miss = d.post("/embed", json={"inputs": "x", "model": "all-minilm-l6-v2"})
    assert miss.status_code == 404
    err = miss.json()
    assert err["code"] == "MODEL_NOT_FOUND" and err["suggestions"][0] == MINILM
    assert "did you mean" in err["error"] and err["error_type"] == "Validation"


def test_tei_embed_with_huggingface_hub_client(
    dstack: Stack, st_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import InferenceClient, constants

    # the tests run offline (HF_HUB_OFFLINE), which makes the client refuse any URL,
    # this local one included; the models it would not fetch are loaded already
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(model=f"{dstack.base_url}/embed", token="unused")
    got = client.feature_extraction(DOCS[0], normalize=True, truncate=True)
    np.testing.assert_allclose(
        np.asarray(got, dtype=np.float32).reshape(1, -1), st_model.encode(DOCS[:1]), atol=1e-5
    )


def test_tei_embed_sparse_is_the_encode_output(d: httpx.Client) -> None:
    out = ok(d.post("/embed_sparse", json={"inputs": DOCS[:2]}))  # SIE_DEFAULT_SPARSE_MODEL
    native = ok(
        d.post(
            f"/v1/encode/{SPLADE}",
            json={"items": [{"text": t} for t in DOCS[:2]], "params": {"output_types": ["sparse"]}},
        )
    )["items"]
    for got, want in zip(out, native, strict=True):
        assert [p["index"] for p in got] == want["sparse"]["indices"]
        np.testing.assert_allclose([p["value"] for p in got], want["sparse"]["values"], rtol=1e-6)
        assert all(set(p) == {"index", "value"} and p["value"] > 0 for p in got)
    query = ok(d.post("/embed_sparse", json={"inputs": QUERY, "prompt_name": "query"}))
    as_query = ok(
        d.post(
            f"/v1/encode/{SPLADE}",
            json={
                "items": [{"text": QUERY}],
                "params": {"output_types": ["sparse"], "is_query": True},
            },
        )
    )["items"][0]["sparse"]
    assert [p["index"] for p in query[0]] == as_query["indices"]
    tei_refusal(d.post("/embed_sparse", json={"inputs": "x", "model": MINILM}), 400, "model")


def test_tei_rerank_shape_and_raw_scores(d: httpx.Client) -> None:
    raw = native_scores(d, RERANKER, QUERY, DOCS)  # activation none: logits
    out = ok(d.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}))
    assert [r["index"] for r in out] == sorted(range(3), key=lambda i: -raw[i])
    for r in out:
        assert set(r) == {"index", "score", "text"} and r["text"] == DOCS[r["index"]]
        assert r["score"] == pytest.approx(1 / (1 + math.exp(-raw[r["index"]])), abs=1e-5)
    logits = ok(d.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}))
    assert all(set(r) == {"index", "score"} for r in logits)
    assert {r["index"]: r["score"] for r in logits} == pytest.approx(dict(enumerate(raw)), abs=1e-5)
    cosine = ok(d.post("/rerank", json={"model": MINILM, "query": QUERY, "texts": DOCS}))
    want = native_scores(d, MINILM, QUERY, DOCS)  # a bi-encoder's score is unchanged
    assert {r["index"]: r["score"] for r in cosine} == pytest.approx(
        dict(enumerate(want)), abs=1e-6
    )
    tei_refusal(
        d.post("/rerank", json={"query": QUERY, "texts": DOCS, "truncate": False}), 400, "truncate"
    )
    tei_refusal(d.post("/rerank", json={"query": QUERY, "texts": []}), 400, "texts")
    tei_refusal(
        d.post("/rerank", json={"query": QUERY, "texts": ["x" * 1_000_001]}), 400, "texts[0]"
    )


def test_tei_info_and_defaults(d: httpx.Client, plain: httpx.Client) -> None:
    info = ok(d.get("/info"))
    assert info["model_id"] == MINILM and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["auto_truncate"] is True
    assert info["version"] == sie.__version__ and isinstance(info["max_client_batch_size"], int)
    rr = ok(d.get("/info", params={"model": RERANKER}))
    assert rr["model_id"] == RERANKER and "reranker" in rr["model_type"]
    assert (
        ok(d.get("/info", params={"model": SPLADE}))["model_type"]["embedding"]["pooling"]
        == "splade"
    )
    for path, setting in (
        ("/embed", "SIE_DEFAULT_EMBED_MODEL"),
        ("/embed_sparse", "SIE_DEFAULT_SPARSE_MODEL"),
    ):
        body = tei_refusal(plain.post(path, json={"inputs": "x"}), 400, "model")
        assert body["setting"] == setting and setting in body["error"]
    body = tei_refusal(plain.post("/rerank", json={"query": "q", "texts": ["a"]}), 400, "model")
    assert body["setting"] == "SIE_DEFAULT_RERANK_MODEL"
    tei_refusal(plain.get("/info"), 400, "model")


# ------------------------------------------------------- OpenAI model lookup, hints, version


def test_openai_models_retrieve_returns_the_id(stack: Stack) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0)
    model = client.models.retrieve(MINILM)
    assert model.id == MINILM and model.object == "model" and model.owned_by == "sie"
    assert model.model_extra is not None and model.model_extra["dims"] == {
        "dense": 384,
        "multivector": 384,
    }
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("sentence-transformers/all-MiniLM-L6-v3")
    assert "did you mean" in str(caught.value) and MINILM in str(caught.value)
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_found"
    assert body["param"] == "model" and body["type"] == "invalid_request_error"
    assert body["suggestions"][0] == MINILM


def test_model_404_envelopes_carry_suggestions(plain: httpx.Client) -> None:
    r = plain.get("/v1/models/all-MiniLM-L6-v2")
    assert r.status_code == 404
    body = r.json()
    assert set(body) == {"error", "detail"}
    assert set(body["error"]) == {"message", "type", "param", "code", "suggestions"}
    assert (
        body["detail"]["code"] == "MODEL_NOT_FOUND" and body["detail"]["suggestions"][0] == MINILM
    )
    native = plain.post("/v1/encode/all-MiniLM-L6-v2", json={"items": [{"text": "x"}]})
    assert native.status_code == 404
    detail = native.json()["detail"]
    assert (
        detail["suggestions"][0] == MINILM
        and f"did you mean one of {MINILM!r}" in detail["message"]
    )
    embeddings = plain.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "x"})
    assert embeddings.status_code == 404
    err = embeddings.json()["error"]
    assert MINILM in err["message"] and err["suggestions"][0] == MINILM
    far = plain.get("/v1/models/nope/nothing").json()
    assert far["detail"]["suggestions"] == [] and "did you mean" not in far["error"]["message"]
    config = plain.get("/v1/configs/models/sentence-transformers/all-MiniLM-L6-v3")
    assert config.status_code == 404 and config.json()["detail"]["suggestions"][0] == MINILM


def test_functions_take_the_model_from_the_body(plain: httpx.Client) -> None:
    body = {"query": {"text": QUERY}, "items": [{"text": t} for t in DOCS]}
    by_path = ok(plain.post(f"/v1/score/{MINILM}", json=body))
    in_body = plain.post("/v1/score", json={**body, "model": MINILM}, follow_redirects=False)
    assert ok(in_body) == by_path and in_body.headers["x-sie-request-id"]
    enc = ok(plain.post("/v1/encode", json={"model": MINILM, "items": [{"text": "hi"}]}))
    assert enc["model"] == MINILM and len(enc["items"][0]["dense"]["values"]) == 384
    packed = plain.post(
        "/v1/encode",
        content=msgpack.packb({"model": MINILM, "items": [{"text": "hi"}]}),
        headers={"Content-Type": "application/msgpack"},
    )
    assert ok(packed)["model"] == MINILM
    for path in ("/v1/score", "/v1/encode", "/v1/extract"):
        r = plain.post(path, json={"items": [{"text": "x"}]}, follow_redirects=False)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["detail"]["field"] == "model"
    miss = plain.post("/v1/score", json={**body, "model": "all-MiniLM-L6-v2"})
    assert miss.status_code == 404 and miss.json()["detail"]["suggestions"][0] == MINILM


def test_version(plain: httpx.Client) -> None:
    def head() -> str | None:
        git = ["git", "-C", str(ROOT), "rev-parse", "HEAD"]
        done = subprocess.run(git, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    before = head()
    out = ok(plain.get("/version"))
    assert out["version"] == sie.__version__
    assert {"sie", "openai", "cohere_rerank", "tei"} <= set(out["api"])
    if before is not None:  # a checkout: its commit (read once, so any commit since then)
        assert isinstance(out["git_sha"], str) and len(out["git_sha"]) == 40
        done = subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-t", out["git_sha"]],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.stdout.strip() == "commit"
