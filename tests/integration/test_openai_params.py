"""Every documented OpenAI parameter is honoured or refused, never ignored (docs/api.md
§5.1; issue 17 item 5): one case per parameter of the installed ``openai`` package's
request types for ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``.
A case either shows the parameter's effect in the answer or gets a 400 whose ``param``
names it (some do both: an honoured value and a refused one). The case tables must
cover exactly the documented parameters, so a new ``openai`` release that documents
another fails here until it is classified.

Live stack: the real SmolLM2-135M-Instruct (greedy unless a case samples) and MiniLM.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import completion_create_params as chat_create_params
from tokenizers import Tokenizer

from tests.conftest import CONFIGS, MINILM, MODEL_CACHE, Stack, run_stack

pytestmark = pytest.mark.slow

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
#: greedy, SmolLM2 repeats itself here within a few tokens (penalties change it)
REPEAT = [{"role": "user", "content": "Write the word 'la' twenty times."}]
REPEAT_PROMPT = "one one one one"
#: greedy and constrained, SmolLM2 closes this object in 17 tokens
JSON_ASK = 'Reply in JSON with the key "capital": what is the capital of France?'


def documented(*typed: type) -> set[str]:
    """The body parameters of OpenAI's request TypedDicts (``extra_*`` are the client's
    own keyword arguments, not body fields)."""
    names: set[str] = set()
    for t in typed:
        names |= set(t.__required_keys__) | set(t.__optional_keys__)  # type: ignore[attr-defined]
    return names


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with run_stack(preload=(LLM, MINILM)) as s:
        yield s


@pytest.fixture(scope="module")
def c(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    from sie.control.seed import load_models
    from sie.engines.generators.gguf import locate_weights

    cfg = next(m for m in load_models(str(CONFIGS)) if m.sie_id == LLM)
    path, _ = locate_weights(cfg, cfg.resolve_profile().loadtime, MODEL_CACHE / "sie-models")
    return Tokenizer.from_file(str(path / "tokenizer.json"))


_MEMO: dict[str, Any] = {}


def chat(c: httpx.Client, **extra: Any) -> httpx.Response:
    body = {"model": LLM, "messages": FRANCE, "temperature": 0, "max_tokens": 10, **extra}
    return c.post("/v1/chat/completions", json={k: v for k, v in body.items() if v is not ...})


def complete(c: httpx.Client, **extra: Any) -> httpx.Response:
    body = {"model": LLM, "prompt": PROMPT, "temperature": 0, "max_tokens": 6, **extra}
    return c.post("/v1/completions", json={k: v for k, v in body.items() if v is not ...})


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def content(r: httpx.Response) -> str:
    text = ok(r)["choices"][0]
    return str(text["message"]["content"] if "message" in text else text["text"])


def refused(r: httpx.Response, param: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert err["message"].startswith(param), err


def greedy_chat(c: httpx.Client) -> str:
    if "chat" not in _MEMO:
        _MEMO["chat"] = content(chat(c))
    assert "Paris" in _MEMO["chat"]
    return str(_MEMO["chat"])


def greedy_completion(c: httpx.Client) -> str:
    if "completion" not in _MEMO:
        _MEMO["completion"] = content(complete(c))
    return str(_MEMO["completion"])


def events(c: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    with c.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ---------------------------------------------------------------- chat


def _penalty(c: httpx.Client, name: str, route: str) -> None:
    if route == "chat":
        plain = content(chat(c, messages=REPEAT, max_tokens=16))
        pen = content(chat(c, messages=REPEAT, max_tokens=16, **{name: 2.0}))
        refused(chat(c, **{name: 2.5}), name)
    else:
        plain = content(complete(c, prompt=REPEAT_PROMPT, max_tokens=10))
        pen = content(complete(c, prompt=REPEAT_PROMPT, max_tokens=10, **{name: 2.0}))
        refused(complete(c, **{name: -3}), name)
    assert pen != plain, (plain, pen)


def _logit_bias(c: httpx.Client, tok: Tokenizer, route: str) -> None:
    paris = tok.encode(" Paris", add_special_tokens=False).ids[0]
    call = chat if route == "chat" else complete
    assert "Paris" in (greedy_chat(c) if route == "chat" else greedy_completion(c))
    banned = content(call(c, logit_bias={str(paris): -100}))
    assert "Paris" not in banned
    refused(call(c, logit_bias={str(tok.get_vocab_size()): 5}), "logit_bias")
    refused(call(c, logit_bias={str(paris): 101}), "logit_bias")
    refused(call(c, logit_bias={"Paris": 1}), "logit_bias")


def _chat_logprobs(c: httpx.Client) -> None:
    body = ok(chat(c, logprobs=True))
    lp = body["choices"][0]["logprobs"]["content"]
    text = body["choices"][0]["message"]["content"]
    assert bytes(b for e in lp for b in e["bytes"]).decode() == text
    assert all(e["logprob"] <= 0 and e["top_logprobs"] == [] for e in lp)
    assert ok(chat(c))["choices"][0]["logprobs"] is None  # not asked: null


def _top_logprobs(c: httpx.Client) -> None:
    body = ok(chat(c, logprobs=True, top_logprobs=3))
    for e in body["choices"][0]["logprobs"]["content"]:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert e["top_logprobs"][0]["token"] == e["token"]  # greedy: the most likely
    refused(chat(c, top_logprobs=2), "top_logprobs")  # needs logprobs: true
    refused(chat(c, logprobs=True, top_logprobs=21), "top_logprobs")


def _response_format(c: httpx.Client) -> None:
    r = chat(
        c,
        messages=[{"role": "user", "content": JSON_ASK}],
        max_tokens=48,
        response_format={"type": "json_object"},
    )
    body = ok(r)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(body["choices"][0]["message"]["content"]), dict)
    assert content(chat(c, response_format={"type": "text"})) == greedy_chat(c)
    schema = {"name": "x", "schema": {"type": "object"}}
    refused(
        chat(c, response_format={"type": "json_schema", "json_schema": schema}), "response_format"
    )


def _seed(c: httpx.Client, route: str) -> None:
    call = chat if route == "chat" else complete
    a = content(call(c, temperature=1.0, seed=7))
    b = content(call(c, temperature=1.0, seed=7))
    assert a == b
    assert any(content(call(c, temperature=1.0, seed=s)) != a for s in (8, 9, 10))


def _stop(c: httpx.Client, route: str) -> None:
    call = chat if route == "chat" else complete
    r = call(c, stop=["Paris"])
    assert "Paris" not in content(r) and r.json()["choices"][0]["finish_reason"] == "stop"


def _stream_options(c: httpx.Client, route: str) -> None:
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    base: dict[str, Any] = {"model": LLM, "temperature": 0, "max_tokens": 4, "stream": True}
    base |= {"messages": FRANCE} if route == "chat" else {"prompt": PROMPT}
    evs = events(c, path, {**base, "stream_options": {"include_usage": True}})
    assert evs[-1] == "[DONE]" and evs[-2]["choices"] == [] and evs[-2]["usage"]["total_tokens"]
    assert all(ch["usage"] is None for ch in evs[:-2])  # every other chunk: usage null
    obf = events(c, path, {**base, "stream_options": {"include_obfuscation": True}})
    assert all(1 <= len(ch["obfuscation"]) <= 32 for ch in obf[:-1])
    call = chat if route == "chat" else complete
    refused(call(c, stream_options={"include_usage": True}), "stream_options")  # no stream


def _stream(c: httpx.Client, route: str) -> None:
    if route == "chat":
        evs = events(
            c,
            "/v1/chat/completions",
            {"model": LLM, "messages": FRANCE, "temperature": 0, "max_tokens": 10, "stream": True},
        )
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in evs[:-1])
        assert text == greedy_chat(c)
    else:
        evs = events(
            c,
            "/v1/completions",
            {"model": LLM, "prompt": PROMPT, "temperature": 0, "max_tokens": 6, "stream": True},
        )
        assert "".join(e["choices"][0]["text"] for e in evs[:-1]) == greedy_completion(c)


def _temperature(c: httpx.Client, route: str) -> None:
    call = chat if route == "chat" else complete
    greedy = greedy_chat(c) if route == "chat" else greedy_completion(c)
    assert content(call(c, temperature=0)) == greedy
    assert any(content(call(c, temperature=2.0, seed=s)) != greedy for s in (1, 2, 3))
    refused(call(c, temperature=2.5), "temperature")


def _top_p(c: httpx.Client, route: str) -> None:
    call = chat if route == "chat" else complete
    greedy = greedy_chat(c) if route == "chat" else greedy_completion(c)
    # a nucleus of one token is greedy, at any temperature
    assert content(call(c, temperature=1.5, top_p=1e-9, seed=3)) == greedy
    refused(call(c, top_p=0), "top_p")


def _max_tokens(c: httpx.Client, name: str, route: str) -> None:
    call = chat if route == "chat" else complete
    body = ok(call(c, **{"max_tokens": ..., name: 3}))
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


def _n(c: httpx.Client, route: str) -> None:
    call = chat if route == "chat" else complete
    assert len(ok(call(c, n=1))["choices"]) == 1
    refused(call(c, n=2), "n")


def _accepted(value: Any, *, route: str = "chat", param: str) -> Callable[..., None]:
    def case(c: httpx.Client, tok: Tokenizer) -> None:
        call = chat if route == "chat" else complete
        greedy = greedy_chat(c) if route == "chat" else greedy_completion(c)
        assert content(call(c, **{param: value})) == greedy

    return case


def _refused(
    value: Any, *, route: str = "chat", param: str, also_ok: Any = ...
) -> Callable[..., None]:
    """A parameter refused for ``value``; ``also_ok``: a value that means "not used"."""

    def case(c: httpx.Client, tok: Tokenizer) -> None:
        call = chat if route == "chat" else complete
        refused(call(c, **{param: value}), param)
        if also_ok is not ...:
            ok(call(c, **{param: also_ok}))

    return case


Case = Callable[[httpx.Client, Tokenizer], None]

CHAT: dict[str, Case] = {
    "messages": lambda c, t: greedy_chat(c) and None,
    "model": lambda c, t: None if ok(chat(c))["model"] == LLM else pytest.fail("model"),
    "audio": _refused({"voice": "alloy", "format": "wav"}, param="audio"),
    "frequency_penalty": lambda c, t: _penalty(c, "frequency_penalty", "chat"),
    "function_call": _refused({"name": "f"}, param="function_call", also_ok="none"),
    "functions": _refused([{"name": "f", "parameters": {}}], param="functions"),
    "logit_bias": lambda c, t: _logit_bias(c, t, "chat"),
    "logprobs": lambda c, t: _chat_logprobs(c),
    "max_completion_tokens": lambda c, t: _max_tokens(c, "max_completion_tokens", "chat"),
    "max_tokens": lambda c, t: _max_tokens(c, "max_tokens", "chat"),
    "metadata": _refused({"k": "v"}, param="metadata"),
    "modalities": _refused(["text", "audio"], param="modalities", also_ok=["text"]),
    "moderation": _refused({"model": "omni-moderation-latest"}, param="moderation"),
    "n": lambda c, t: _n(c, "chat"),
    "parallel_tool_calls": _refused(False, param="parallel_tool_calls"),
    "prediction": _refused({"type": "content", "content": "x"}, param="prediction"),
    "presence_penalty": lambda c, t: _penalty(c, "presence_penalty", "chat"),
    "prompt_cache_key": _refused("k", param="prompt_cache_key"),
    "prompt_cache_options": _refused({"mode": "explicit"}, param="prompt_cache_options"),
    "prompt_cache_retention": _refused("24h", param="prompt_cache_retention"),
    "reasoning_effort": _refused("low", param="reasoning_effort", also_ok="none"),
    "response_format": lambda c, t: _response_format(c),
    "safety_identifier": _accepted("user-1", param="safety_identifier"),
    "seed": lambda c, t: _seed(c, "chat"),
    "service_tier": _refused("flex", param="service_tier", also_ok="auto"),
    "stop": lambda c, t: _stop(c, "chat"),
    "store": _refused(True, param="store", also_ok=False),
    "stream": lambda c, t: _stream(c, "chat"),
    "stream_options": lambda c, t: _stream_options(c, "chat"),
    "temperature": lambda c, t: _temperature(c, "chat"),
    "tool_choice": _refused("auto", param="tool_choice", also_ok="none"),
    "tools": _refused([{"type": "function", "function": {"name": "f"}}], param="tools"),
    "top_logprobs": lambda c, t: _top_logprobs(c),
    "top_p": lambda c, t: _top_p(c, "chat"),
    "user": _accepted("user-1", param="user"),
    "verbosity": _refused("low", param="verbosity"),
    "web_search_options": _refused({}, param="web_search_options"),
}


# ---------------------------------------------------------------- completions


def _echo(c: httpx.Client) -> None:
    text = content(complete(c, echo=True))
    assert text == PROMPT + greedy_completion(c)
    assert content(complete(c, echo=False)) == greedy_completion(c)
    refused(complete(c, echo=True, logprobs=1), "echo")


def _completion_logprobs(c: httpx.Client) -> None:
    body = ok(complete(c, logprobs=2))
    lp = body["choices"][0]["logprobs"]
    text = body["choices"][0]["text"]
    assert "".join(lp["tokens"]) == text
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(lp["top_logprobs"])
    assert all(
        2 <= len(t) <= 3 and tok in t
        for t, tok in zip(lp["top_logprobs"], lp["tokens"], strict=True)
    )
    offsets = [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    assert lp["text_offset"] == offsets
    assert ok(complete(c))["choices"][0]["logprobs"] is None
    refused(complete(c, logprobs=21), "logprobs")


def _prompt(c: httpx.Client) -> None:
    assert content(complete(c, prompt=[PROMPT])) == greedy_completion(c)
    refused(complete(c, prompt=[1, 2, 3]), "prompt")
    refused(complete(c, prompt=["a", "b"]), "prompt")


COMPLETIONS: dict[str, Case] = {
    "model": lambda c, t: None if ok(complete(c))["model"] == LLM else pytest.fail("model"),
    "prompt": lambda c, t: _prompt(c),
    "best_of": _refused(2, route="completions", param="best_of", also_ok=1),
    "echo": lambda c, t: _echo(c),
    "frequency_penalty": lambda c, t: _penalty(c, "frequency_penalty", "completions"),
    "logit_bias": lambda c, t: _logit_bias(c, t, "completions"),
    "logprobs": lambda c, t: _completion_logprobs(c),
    "max_tokens": lambda c, t: _max_tokens(c, "max_tokens", "completions"),
    "n": lambda c, t: _n(c, "completions"),
    "presence_penalty": lambda c, t: _penalty(c, "presence_penalty", "completions"),
    "seed": lambda c, t: _seed(c, "completions"),
    "stop": lambda c, t: _stop(c, "completions"),
    "stream": lambda c, t: _stream(c, "completions"),
    "stream_options": lambda c, t: _stream_options(c, "completions"),
    "suffix": _refused(" and that is all.", route="completions", param="suffix"),
    "temperature": lambda c, t: _temperature(c, "completions"),
    "top_p": lambda c, t: _top_p(c, "completions"),
    "user": _accepted("user-1", route="completions", param="user"),
}


# ---------------------------------------------------------------- embeddings


def embed(c: httpx.Client, **extra: Any) -> httpx.Response:
    return c.post("/v1/embeddings", json={"model": MINILM, "input": ["hello world"], **extra})


def _encoding_format(c: httpx.Client) -> None:
    floats = np.asarray(ok(embed(c))["data"][0]["embedding"], dtype=np.float32)
    b64 = ok(embed(c, encoding_format="base64"))["data"][0]["embedding"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(b64), dtype="<f4"), floats)
    refused(embed(c, encoding_format="hex"), "encoding_format")


def _dimensions(c: httpx.Client) -> None:
    assert len(ok(embed(c, dimensions=384))["data"][0]["embedding"]) == 384
    refused(embed(c, dimensions=128), "dimensions")  # MiniLM is not matryoshka


def _input(c: httpx.Client) -> None:
    assert len(ok(embed(c, input=["a", "b", "c"]))["data"]) == 3
    refused(embed(c, input=["a", 5]), "input[1]")


def _model(c: httpx.Client) -> None:
    assert ok(embed(c))["model"] == MINILM
    refused(embed(c, model=""), "model")  # OpenAI's 400, not a 404


EMBEDDINGS: dict[str, Case] = {
    "input": lambda c, t: _input(c),
    "model": lambda c, t: _model(c),
    "dimensions": lambda c, t: _dimensions(c),
    "encoding_format": lambda c, t: _encoding_format(c),
    "user": lambda c, t: ok(embed(c, user="user-1")) and None,
}


# ---------------------------------------------------------------- the tests


def test_the_tables_cover_exactly_the_documented_parameters() -> None:
    chat_doc = documented(
        chat_create_params.CompletionCreateParamsNonStreaming,
        chat_create_params.CompletionCreateParamsStreaming,
    )
    completion_doc = documented(
        completion_create_params.CompletionCreateParamsNonStreaming,
        completion_create_params.CompletionCreateParamsStreaming,
    )
    embedding_doc = documented(embedding_create_params.EmbeddingCreateParams)
    assert set(CHAT) == chat_doc
    assert set(COMPLETIONS) == completion_doc
    assert set(EMBEDDINGS) == embedding_doc


@pytest.mark.parametrize("param", sorted(CHAT))
def test_chat_parameter(c: httpx.Client, tok: Tokenizer, param: str) -> None:
    CHAT[param](c, tok)


@pytest.mark.parametrize("param", sorted(COMPLETIONS))
def test_completions_parameter(c: httpx.Client, tok: Tokenizer, param: str) -> None:
    COMPLETIONS[param](c, tok)


@pytest.mark.parametrize("param", sorted(EMBEDDINGS))
def test_embeddings_parameter(c: httpx.Client, tok: Tokenizer, param: str) -> None:
    EMBEDDINGS[param](c, tok)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"model": LLM, "messages": FRANCE, "top_k": 5}, "top_k"),
        ("/v1/completions", {"model": LLM, "prompt": PROMPT, "guided_json": {}}, "guided_json"),
        ("/v1/embeddings", {"model": MINILM, "input": "x", "input_type": "query"}, "input_type"),
        (f"/v1/generate/{LLM}", {"prompt": PROMPT, "model": LLM}, "model"),  # in the path
    ],
)
def test_unknown_parameters_are_refused_by_name(
    c: httpx.Client, path: str, body: dict, param: str
) -> None:
    r = c.post(path, json=body)
    refused(r, param)
    assert "unknown parameter" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "hi", "tool_call_id": "x"}, "messages[1].tool_call_id"),
        ({"role": "tool", "content": "42"}, "messages[1].role"),
        ({"role": "user", "content": "hi", "colour": "red"}, "messages[1].colour"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "messages[1].content[0].type",
        ),
    ],
)
def test_message_fields_name_the_element(c: httpx.Client, message: dict, param: str) -> None:
    r = chat(c, messages=[FRANCE[0], message])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_message_name_and_null_fields_are_accepted(c: httpx.Client) -> None:
    """What a client sends back from a previous answer (``refusal: null`` ...) works."""
    history = [
        FRANCE[0],
        {"role": "assistant", "content": "Paris.", "refusal": None, "tool_calls": None},
        {"role": "user", "content": "And of Italy?", "name": "ada"},
    ]
    assert ok(chat(c, messages=history, max_tokens=4))["choices"][0]["message"]["content"]


# ---------------------------------------------------------------- the client libraries


def test_openai_client_logprobs_logit_bias_and_json(stack: Stack, tok: Tokenizer) -> None:
    """The official client parses what SIE answers, and reads its refusals' ``param``."""
    import openai

    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="none", max_retries=0)
    resp = client.chat.completions.create(
        model=LLM, messages=FRANCE, temperature=0, max_tokens=10, logprobs=True, top_logprobs=2
    )
    lp = resp.choices[0].logprobs
    assert lp is not None and lp.content
    assert "".join(e.token for e in lp.content) == resp.choices[0].message.content
    assert all(len(e.top_logprobs) == 2 for e in lp.content)
    paris = tok.encode(" Paris", add_special_tokens=False).ids[0]
    banned = client.chat.completions.create(
        model=LLM, messages=FRANCE, temperature=0, max_tokens=10, logit_bias={str(paris): -100}
    )
    assert "Paris" not in (banned.choices[0].message.content or "")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=LLM, messages=FRANCE, logit_bias={str(tok.get_vocab_size() + 5): 1}
        )
    assert info.value.param == "logit_bias" and info.value.code == "invalid_input"
    js = client.chat.completions.create(
        model=LLM,
        messages=[{"role": "user", "content": JSON_ASK}],
        temperature=0,
        max_tokens=48,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(js.choices[0].message.content or ""), dict)
    comp = client.completions.create(
        model=LLM, prompt=PROMPT, temperature=0, max_tokens=5, logprobs=1
    )
    clp = comp.choices[0].logprobs
    assert clp is not None and clp.tokens and "".join(clp.tokens) == comp.choices[0].text
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=LLM, messages=FRANCE, tools=[{"type": "function", "function": {"name": "f"}}]
        )
    assert info.value.param == "tools"
    stream = client.chat.completions.create(
        model=LLM, messages=FRANCE, temperature=0, max_tokens=10, stream=True, logprobs=True
    )
    streamed: list[str] = []
    for ch in stream:
        if ch.choices and ch.choices[0].logprobs is not None:
            streamed += [e.token for e in ch.choices[0].logprobs.content or []]
    assert "".join(streamed) == resp.choices[0].message.content


def test_langchain_chat_openai_defaults_and_options(stack: Stack) -> None:
    """What ``ChatOpenAI`` sends by default is accepted; its ``logprobs`` and
    ``response_format`` options are honoured."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=LLM, base_url=f"{stack.base_url}/v1", api_key="none", temperature=0, max_tokens=10
    )  # type: ignore[arg-type]
    assert "Paris" in str(llm.invoke("What is the capital of France?").content)
    assert "".join(str(ch.content) for ch in llm.stream("What is the capital of France?"))
    assert len(llm.batch(["Hi", "Hello"])) == 2
    with_lp = llm.bind(logprobs=True).invoke("What is the capital of France?")
    assert with_lp.response_metadata["logprobs"]["content"]
    js = ChatOpenAI(
        model=LLM,
        base_url=f"{stack.base_url}/v1",
        api_key="none",  # type: ignore[arg-type]
        temperature=0,
        max_tokens=48,
        model_kwargs={"response_format": {"type": "json_object"}},
    ).invoke(JSON_ASK)
    assert isinstance(json.loads(str(js.content)), dict)


def test_a_refusal_is_a_plain_400_even_when_streaming(c: httpx.Client, tok: Tokenizer) -> None:
    """Refused before the worker accepts: no event stream was started."""
    bad = {str(tok.get_vocab_size()): 1}
    r = c.post(
        "/v1/chat/completions",
        json={"model": LLM, "messages": FRANCE, "stream": True, "logit_bias": bad},
    )
    assert r.headers["content-type"].startswith("application/json")
    refused(r, "logit_bias")
