"""``/v1/embeddings`` truncation and the embedding clients' default requests (docs/api.md
§5.1, §6; issue 17 item 5): truncation stays the default; ``truncate: false`` (TEI's name)
refuses an over-long input with its token count and the limit, naming ``input[i]``;
``truncate_prompt_tokens`` (vLLM's) reads at most k tokens; ``usage`` counts the tokens
read. LangChain's ``OpenAIEmbeddings`` with its defaults sends tiktoken ids (refused,
naming the fix), LlamaIndex's ``OpenAIEmbedding`` and LangChain with
``check_embedding_ctx_length=False`` work. MiniLM reads at most 256 tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import MINILM, Stack

pytestmark = pytest.mark.slow

WINDOW = 256
LONG = "the quick brown fox jumps over the lazy dog " * 40  # ~362 tokens with specials


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def embed(client: httpx.Client, inp: Any, **extra: Any) -> httpx.Response:
    return client.post("/v1/embeddings", json={"model": MINILM, "input": inp, **extra})


def vectors(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def tokens(st_model: Any, text: str) -> int:
    return len(st_model.tokenizer(text)["input_ids"])


def test_truncation_is_the_default_and_usage_counts_what_was_read(
    client: httpx.Client, st_model: Any
) -> None:
    assert tokens(st_model, LONG) > WINDOW
    default = embed(client, [LONG, "short text"])
    explicit = embed(client, [LONG, "short text"], truncate=True, truncate_prompt_tokens=-1)
    np.testing.assert_array_equal(vectors(default), vectors(explicit))
    read = WINDOW + tokens(st_model, "short text")
    assert default.json()["usage"] == {"prompt_tokens": read, "total_tokens": read}
    np.testing.assert_allclose(vectors(default)[0], st_model.encode([LONG])[0], atol=1e-5)


@pytest.mark.parametrize("inputs", [[LONG], ["fits", LONG]])
def test_truncate_false_refuses_an_over_long_input(
    client: httpx.Client, st_model: Any, inputs: list[str]
) -> None:
    r = embed(client, inputs, truncate=False)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    i = inputs.index(LONG)
    assert err["param"] == f"input[{i}]" and err["type"] == "invalid_request_error"
    n = tokens(st_model, LONG)
    assert err["message"].startswith(f"input[{i}]: ")
    assert f"{n} tokens" in err["message"] and f"{WINDOW}" in err["message"], err


def test_truncate_false_keeps_what_fits(client: httpx.Client) -> None:
    plain = embed(client, ["a sentence that fits"])
    strict = embed(client, ["a sentence that fits"], truncate=False)
    np.testing.assert_array_equal(vectors(plain), vectors(strict))
    assert strict.json()["usage"] == plain.json()["usage"]


def test_truncate_prompt_tokens_reads_at_most_k(client: httpx.Client, st_model: Any) -> None:
    k = 8
    r = embed(client, [LONG, "tiny"], truncate_prompt_tokens=k)
    got = vectors(r)
    # the same as the model reading only the first k tokens (special tokens included)
    ids = [*st_model.tokenizer(LONG)["input_ids"][: k - 1], st_model.tokenizer.sep_token_id]
    cut = st_model.tokenizer.decode(ids, skip_special_tokens=True)
    np.testing.assert_allclose(got[0], st_model.encode([cut])[0], atol=1e-5)
    np.testing.assert_allclose(got[1], st_model.encode(["tiny"])[0], atol=1e-5)
    read = k + tokens(st_model, "tiny")
    assert r.json()["usage"]["prompt_tokens"] == read
    # with truncate: false it is the limit an input must fit
    strict = embed(client, ["tiny", LONG], truncate=False, truncate_prompt_tokens=k)
    assert strict.status_code == 400 and strict.json()["error"]["param"] == "input[1]"


@pytest.mark.parametrize(
    ("extra", "param", "needle"),
    [
        ({"truncate_prompt_tokens": 1000}, "truncate_prompt_tokens", str(WINDOW)),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "-1"),
        ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens", ""),
        ({"truncate": "no"}, "truncate", ""),
    ],
)
def test_bad_truncation_values(
    client: httpx.Client, extra: dict[str, Any], param: str, needle: str
) -> None:
    r = embed(client, ["x"], **extra)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err


def test_native_encode_takes_the_same_options(client: httpx.Client, st_model: Any) -> None:
    """``options.truncate`` / ``max_input_tokens`` on ``/v1/encode`` (docs/api.md §2)."""
    url = f"/v1/encode/{MINILM}"
    r = client.post(
        url, json={"items": [{"text": LONG}], "params": {"options": {"truncate": False}}}
    )
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert detail["field"] == "items[0].text" and str(tokens(st_model, LONG)) in detail["message"]
    # among items that fit, the over-long one still makes the request a 400 naming it
    items = [{"text": "short"}, {"text": LONG}, {"text": "x"}]
    r = client.post(url, json={"items": items, "params": {"options": {"truncate": False}}})
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert detail["code"] == "INVALID_INPUT" and detail["field"] == "items[1].text"
    assert [d["item_index"] for d in detail["details"]] == [1]


# ---------------------------------------------------------------- client libraries


def test_langchain_openai_embeddings_default_names_the_fix(stack: Stack) -> None:
    """LangChain's default tokenises with tiktoken, whose files come from the internet: offline
    it fails before sending anything; online it sends token ids, which SIE refuses naming
    ``check_embedding_ctx_length=False``. Either way the request it sends is refused so."""
    from langchain_openai import OpenAIEmbeddings

    lc = OpenAIEmbeddings(model=MINILM, base_url=f"{stack.base_url}/v1", api_key="none")
    try:
        lc.embed_documents(["hello world"])
    except openai.BadRequestError as exc:  # online: tiktoken ids reached SIE
        assert "check_embedding_ctx_length=False" in str(exc)
    except Exception as exc:  # offline: tiktoken could not fetch its encoding
        assert "tiktoken" in repr(exc) or "openaipublic" in repr(exc), repr(exc)
    else:
        pytest.fail("token ids were accepted")
    # the request LangChain sends with tiktoken (a list of token-id lists), as its client sends it
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=MINILM, input=[[15339, 1917]])
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "input[0]"
    assert "check_embedding_ctx_length=False" in body["message"]


def test_langchain_with_the_fix_and_llamaindex_work(stack: Stack, st_model: Any) -> None:
    from langchain_openai import OpenAIEmbeddings
    from llama_index.embeddings.openai import OpenAIEmbedding

    texts = ["hello world", "embeddings map text to vectors"]
    want = st_model.encode(texts)
    lc = OpenAIEmbeddings(
        model=MINILM,
        base_url=f"{stack.base_url}/v1",
        api_key="none",
        check_embedding_ctx_length=False,
    )
    np.testing.assert_allclose(np.asarray(lc.embed_documents(texts)), want, atol=1e-5)
    li = OpenAIEmbedding(model_name=MINILM, api_base=f"{stack.base_url}/v1", api_key="none")
    np.testing.assert_allclose(np.asarray(li.get_text_embedding_batch(texts)), want, atol=1e-5)
