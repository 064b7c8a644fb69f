"""Strict parsing of the OpenAI generation bodies (``sie.engines.openai_params``;
docs/api.md §5.1), the JSON-object recogniser of JSON mode, the response shapes of log
probabilities, the gateway's scan of ``user`` / ``stream_options``, and the encode
truncation options (``sie.engines.truncation``) on MiniLM's real tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sie.core.errors import InvalidInput
from sie.engines.generation import SamplingParams, check_features, logprob_entry
from sie.engines.generators.json_mode import JsonPrefix, pick
from sie.engines.openai_params import REFUSED, parse_generation
from sie.engines.truncation import apply_truncation, read_truncation
from sie.http.generation import scan_routing_fields
from sie.http.generation_format import GenerationFormat

MSG = [{"role": "user", "content": "hi"}]


def parse(route: str = "chat", **body: Any) -> Any:
    base: dict[str, Any] = {
        "chat": {"model": "m", "messages": MSG},
        "completions": {"model": "m", "prompt": "p"},
    }.get(route, {})
    return parse_generation(route, json.dumps({**base, **body}).encode(), "r1")


def refused(param: str, route: str = "chat", **body: Any) -> str:
    with pytest.raises(InvalidInput) as info:
        parse(route, **body)
    assert info.value.fields["field"] == param, info.value.message
    return info.value.message


def test_nulls_mean_not_sent() -> None:
    nulls = {k: None for k in REFUSED if k != "suffix"}
    sp = parse(
        **nulls,
        logprobs=None,
        top_logprobs=None,
        logit_bias=None,
        seed=None,
        stop=None,
        temperature=None,
        top_p=None,
        n=None,
        stream=None,
        response_format=None,
        user=None,
        max_tokens=None,
        max_completion_tokens=None,
        presence_penalty=None,
    ).request.sampling
    assert sp == SamplingParams()


@pytest.mark.parametrize("param", sorted(REFUSED))
def test_each_refused_parameter_names_itself(param: str) -> None:
    route = "completions" if param == "suffix" else "chat"
    message = refused(param, route, **{param: {"x": 1}})
    assert message.startswith(f"{param}: ") and "docs/api.md §5.1" in message
    for allowed in REFUSED[param][0]:
        parse(route, **{param: allowed})


def test_the_allowed_values_must_match_in_type_too() -> None:
    refused("store", store=0)  # false, not 0
    refused("modalities", modalities=["text", "audio"])
    assert parse(modalities=["text"], store=False, tool_choice="none", service_tier="auto")


def test_unknown_parameters_are_named() -> None:
    assert "unknown parameter" in refused("top_k", top_k=3)
    refused("model", "native", prompt="x", model="m")  # the path names the model
    refused("messages[0].colour", messages=[{"role": "user", "content": "x", "colour": 1}])
    refused("stream_options.extra", stream=True, stream_options={"extra": True})


def test_logprobs_rules() -> None:
    assert parse(logprobs=True).request.sampling.logprobs == 0
    assert parse(logprobs=True, top_logprobs=5).request.sampling.logprobs == 5
    assert parse(logprobs=False).request.sampling.logprobs is None
    refused("top_logprobs", top_logprobs=1)
    refused("top_logprobs", logprobs=False, top_logprobs=1)
    refused("top_logprobs", logprobs=True, top_logprobs=21)
    assert parse("completions", logprobs=3).request.sampling.logprobs == 3
    refused("logprobs", "completions", logprobs=True)  # an integer there
    refused("logprobs", "completions", logprobs=21)
    refused("logprobs", "native", prompt="x", logprobs=1)  # the native answer has no place


@pytest.mark.parametrize(
    ("bias", "ok"),
    [
        ({"42": 5}, True),
        ({"42": -100, "7": 100.0}, True),
        ({"42": 100.5}, False),
        ({"-1": 1}, False),
        ({" 1": 1}, False),
        ({"1.0": 1}, False),
        ({"x": 1}, False),
        ({"1": "5"}, False),
        ({"1": True}, False),
        ({"1" * 13: 1}, False),
    ],
)
def test_logit_bias_keys_and_values(bias: dict[str, Any], ok: bool) -> None:
    if ok:
        got = parse(logit_bias=bias).request.sampling.logit_bias
        assert got == {int(k): float(v) for k, v in bias.items()}
    else:
        refused("logit_bias", logit_bias=bias)


def test_response_format() -> None:
    assert (
        parse(response_format={"type": "json_object"}).request.sampling.response_format
        == "json_object"
    )
    assert parse(response_format={"type": "text"}).request.sampling.response_format == "text"
    refused(
        "response_format", response_format={"type": "json_schema", "json_schema": {"name": "x"}}
    )
    refused("response_format.type", response_format={"type": "yaml"})


def test_sampling_choices() -> None:
    refused("n", n=2)
    refused("best_of", "completions", best_of=3)
    assert parse("completions", best_of=1, n=1)
    refused("stream_options", stream_options={"include_usage": True})
    assert parse(stream=True, stream_options={"include_usage": True, "include_obfuscation": False})
    refused("max_completion_tokens", max_tokens=5, max_completion_tokens=6)
    assert parse(max_tokens=5, max_completion_tokens=5).request.sampling.max_tokens == 5
    refused("temperature", temperature="0.5")
    refused("presence_penalty", presence_penalty=2.5)
    refused("frequency_penalty", frequency_penalty=True)


def test_prompts_and_echo() -> None:
    assert parse("completions", prompt=["one"]).request.prompt == "one"
    refused("prompt", "completions", prompt=["a", "b"])
    assert "token-id" in refused("prompt", "completions", prompt=[1, 2])
    refused("prompt", "completions", prompt=[[1, 2]])
    refused("prompt", "completions", prompt=[])
    got = parse("completions", echo=True)
    assert got.echo == "p" and parse("completions", echo=False).echo is None
    refused("echo", "completions", echo=True, logprobs=0)


def test_messages() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    named = parse(messages=[{"role": "user", "content": parts, "name": "ada"}]).request.messages
    assert named == [{"role": "user", "content": "a\nb", "name": "ada"}]
    history = [*MSG, {"role": "assistant", "content": "x", "refusal": None, "tool_calls": None}]
    assert len(parse(messages=history).request.messages) == 2
    refused(
        "messages[1].tool_calls",
        messages=[*MSG, {"role": "assistant", "content": "x", "tool_calls": []}],
    )
    refused("messages[0].role", messages=[{"role": "tool", "content": "x"}])
    refused(
        "messages[0].content[1].type",
        messages=[{"role": "user", "content": [parts[0], {"type": "input_audio"}]}],
    )
    refused("messages[0].content", messages=[{"role": "user", "content": 5}])


def test_features_are_refused_by_engines_without_them() -> None:
    sp = SamplingParams(frequency_penalty=0.5, logprobs=1)
    with pytest.raises(InvalidInput) as info:
        check_features(sp, frozenset({"penalties"}), "x")
    assert info.value.fields["field"] == "logprobs"
    with pytest.raises(InvalidInput) as info:
        check_features(sp, frozenset({"logprobs"}), "x")
    assert info.value.fields["field"] == "frequency_penalty"
    check_features(sp, frozenset({"logprobs", "penalties"}), "x")


# ---------------------------------------------------------------- JSON mode


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        ' {"a": [1, -2.5e+3, 0, true, false, null, "x\\u00e9\\n\\""]}',
        '{"k": {"l": []}}',
        '{"é": "ü"}',
    ],
)
def test_json_prefix_accepts_objects(text: str) -> None:
    s = JsonPrefix()
    assert s.feed(text.encode()) and s.complete
    json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        "[1]",
        '"x"',
        "{a: 1}",
        '{"a": 01}',
        '{"a": 1,}',
        '{"a" 1}',
        '{"a": 1}}',
        '{"a": "\x01"}',
        '{"a": tru}',
        '{"a": 1.}',
        '{"a": 1e}',
        '{"a": -}',
        "{" + " " * 40 + "}",
        '{"a": NaN}',
    ],
)
def test_json_prefix_refuses_what_is_not_an_object(text: str) -> None:
    s = JsonPrefix()
    assert not (s.feed(text.encode()) and s.complete)


def test_pick_takes_the_first_candidate_that_continues() -> None:
    table = [b"[", b"", b"{", b'{"', b"}"]
    got = pick([0, 1, 3, 2], JsonPrefix(), table, eos=frozenset({3}))
    assert got is not None and got[0] == 2  # "[" is not an object, "" no text, 3 is EOS
    state = got[1]
    assert (
        pick([4], state, table, frozenset()) is not None
        and pick([2], state, table, frozenset()) is None
    )


# ---------------------------------------------------------------- response shapes, scan


def test_completions_logprobs_are_the_legacy_shape() -> None:
    fmt = GenerationFormat("completions", "m", "r-1")
    first = [logprob_entry(b"The", -0.5, [(b"The", -0.5), (b"A", -1.0)])]
    second = [logprob_entry(b" cap", -0.1, [(b" town", -0.05)])]
    a, b = fmt.logprobs(first), fmt.logprobs(second)
    assert a == {
        "tokens": ["The"],
        "token_logprobs": [-0.5],
        "top_logprobs": [{"The": -0.5, "A": -1.0}],
        "text_offset": [0],
    }
    assert b["text_offset"] == [3] and b["top_logprobs"] == [{" town": -0.05, " cap": -0.1}]
    chat = GenerationFormat("chat", "m", "r-1").logprobs(first)
    assert chat == {"content": first, "refusal": None}
    assert GenerationFormat("chat", "m", "r-1").logprobs(None) is None
    assert logprob_entry(b"\xe2\x80", float("-inf"))["logprob"] == -9999.0


def test_stream_chunks_carry_usage_null_and_obfuscation() -> None:
    fmt = GenerationFormat("chat", "m", "r-1", include_usage=True, obfuscate=True)
    chunk = fmt.delta("hi", None)
    assert chunk["usage"] is None and 1 <= len(chunk["obfuscation"]) <= 32
    assert fmt.usage_chunk(3, 4)["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
    }
    plain = GenerationFormat("chat", "m", "r-1").delta("hi", None)
    assert "usage" not in plain and "obfuscation" not in plain


def test_the_gateway_scan_reads_user_and_stream_options() -> None:
    body = {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": True},
        "messages": [{"role": "user", "content": "x", "user": "not-this-one"}],
        "safety_identifier": "s",
    }
    got = scan_routing_fields(json.dumps(body).encode())
    assert (got.model, got.stream, got.include_usage, got.include_obfuscation) == (
        "m",
        True,
        True,
        True,
    )
    assert got.user == "s"
    assert scan_routing_fields(json.dumps({**body, "user": "u"}).encode()).user == "u"
    assert scan_routing_fields(b'{"model": "m", "user": 5}').user is None


# ---------------------------------------------------------------- truncation options


@pytest.fixture(scope="module")
def counter(minilm_path: Path) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def test_truncation_options(counter: Any) -> None:
    text = "the quick brown fox jumps over the lazy dog " * 10
    n = len(counter.encode(text).ids)
    assert n > 64
    assert apply_truncation(counter, [text], [text], {}, 256, "m") == [text]
    with pytest.raises(InvalidInput) as info:
        apply_truncation(counter, [text], [text], {"truncate": False}, 64, "m")
    assert info.value.fields == {"field": "text", "tokens": n, "limit": 64}
    assert f"{n} tokens" in info.value.message
    (cut,) = apply_truncation(counter, [text], [text], {"max_input_tokens": 9}, 256, "m")
    assert len(counter.encode(cut).ids) == 9 and text.startswith(cut)
    (low,) = apply_truncation(
        counter, [text.upper()], [text.upper()], {"max_input_tokens": 9}, 256, "m", lower=True
    )
    assert low == text.upper()[: len(cut)]
    assert read_truncation({"truncate": None}, 256, "m") == (True, 256)
    for bad in (
        {"truncate": "no"},
        {"max_input_tokens": 0},
        {"max_input_tokens": 300},
        {"max_input_tokens": True},
    ):
        with pytest.raises(InvalidInput):
            read_truncation(bad, 256, "m")
    with pytest.raises(InvalidInput):
        apply_truncation(None, [text], [text], {"truncate": False}, 256, "m")  # cannot count
