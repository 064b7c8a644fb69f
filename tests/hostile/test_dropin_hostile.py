"""Hostile requests to the drop-in routes and the strict OpenAI parsing (issue 17), found
by a hostile trial against a live server: each was a 500 (or, for the first, killed
the whole process), or named no field / the wrong one. Every role in one process,
MiniLM and SmolLM2 preloaded, real HTTP (docs/api.md §5.1, §6, §11, §15)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import msgpack
import pytest

from tests.conftest import MINILM, run_stack

pytestmark = pytest.mark.slow

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
MSGPACK = {"Content-Type": "application/msgpack"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with (
        run_stack(preload=(MINILM, LLM)) as s,
        httpx.Client(base_url=s.base_url, timeout=60) as c,
    ):
        yield c


def _lone(body: object) -> bytes:
    """``body`` as JSON with each ``"@"`` string a lone surrogate (``"\\ud800"``), which
    JSON escapes can carry and UTF-8 cannot."""
    return json.dumps(body).replace('"@"', '"\\ud800"').encode()


def _chat_ok(c: httpx.Client) -> None:
    r = c.post(
        "/v1/chat/completions",
        json={"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 200, r.text[:300]


def test_a_logit_bias_too_big_for_a_float_is_a_400_and_the_server_lives(
    client: httpx.Client,
) -> None:
    # was: OverflowError formatting the bias on the worker, uncaught: the process died
    for bias in (10**400, -(10**400)):
        r = client.post(
            "/v1/chat/completions",
            json={
                "model": LLM,
                "messages": [{"role": "user", "content": "hi"}],
                "logit_bias": {"1": bias},
            },
        )
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["param"] == "logit_bias" and "outside [-100, 100]" in err["message"]
        assert len(err["message"]) < 200
    _chat_ok(client)


def test_an_unknown_parameter_with_a_lone_surrogate_is_named(client: httpx.Client) -> None:
    # was: the error chunk naming the key could not be encoded: a 400 naming nothing
    body = _lone({"model": LLM, "messages": [{"role": "user", "content": "x"}], "@": 1})
    r = client.post("/v1/chat/completions", content=body, headers=JSON)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == "invalid_input" and err["param"] == "\\ud800"
    assert "unknown parameter" in err["message"]
    _chat_ok(client)


def test_a_chat_for_an_unknown_model_names_the_model_param(client: httpx.Client) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={"model": "SmolLM2-135M", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert err["suggestions"][0] == LLM


@pytest.mark.parametrize(
    "document",
    [{"text": "a", "blob": b"\xff\x00"}, {"text": "a", "deep": {"x": [b"\xfe"]}}],
)
def test_rerank_documents_that_cannot_come_back_as_json_are_a_400(
    client: httpx.Client, document: dict[str, object]
) -> None:
    # was: 500 INTERNAL_ERROR (PydanticSerializationError) rendering return_documents
    body = {"model": MINILM, "query": "q", "documents": ["x", document]}
    for path in ("/v1/rerank", "/v2/rerank"):
        r = client.post(
            path, content=msgpack.packb({**body, "return_documents": True}), headers=MSGPACK
        )
        assert r.status_code == 400, r.text[:300]
        assert r.json()["detail"]["field"] == "documents[1]"
        # not echoed: the same documents are fine
        r = client.post(path, content=msgpack.packb(body), headers=MSGPACK)
        assert r.status_code == 200, r.text[:300]


def test_rerank_lone_surrogates_in_object_documents_are_named(client: httpx.Client) -> None:
    text = _lone({"model": MINILM, "query": "q", "documents": [{"text": "@"}]})
    r = client.post("/v1/rerank", content=text, headers=JSON)
    assert r.status_code == 400  # was: 400 naming "options"
    assert r.json()["detail"]["field"] == "documents[0].text"
    extra = _lone(
        {
            "model": MINILM,
            "query": "q",
            "return_documents": True,
            "documents": [{"text": "a", "note": "@"}],
        }
    )
    r = client.post("/v1/rerank", content=extra, headers=JSON)
    assert r.status_code == 400, r.text[:300]  # was: 500
    assert r.json()["detail"]["field"] == "documents[0]"


def test_truncate_prompt_tokens_beyond_the_wire_is_named(client: httpx.Client) -> None:
    # was: 400 naming "params.options" ("Integer exceeds 64-bit range")
    for k in (10**400, 2**64, 2**31):
        r = client.post(
            "/v1/embeddings", json={"model": MINILM, "input": "x", "truncate_prompt_tokens": k}
        )
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["param"] == "truncate_prompt_tokens" and len(err["message"]) < 200


def test_body_model_routes_name_the_body_of_malformed_msgpack(client: httpx.Client) -> None:
    for path in ("/v1/encode", "/v1/score", "/v1/extract"):
        for raw in (b"\xc1", msgpack.packb({"model": MINILM})[:-3]):
            r = client.post(path, content=raw, headers=MSGPACK)
            assert r.status_code == 400, r.text[:300]
            detail = r.json()["detail"]
            assert detail["code"] == "INVALID_PAYLOAD" and detail["field"] == "body"


@pytest.mark.parametrize("bad", [1.5, True, None, {"text": "a"}])
def test_tei_embed_names_the_bad_element(client: httpx.Client, bad: object) -> None:
    r = client.post("/embed", json={"model": MINILM, "inputs": ["ok", bad]})
    assert r.status_code == 400, r.text[:300]
    body = r.json()
    assert body["error_type"] == "Validation" and body["field"] == "inputs[1]"
