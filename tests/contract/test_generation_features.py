"""The optional generation features (``sie.engines.generation.FEATURES``; docs/api.md
§5.1) through the engine port, the same checks for every engine that implements them:

- the transformers engine on the real SmolLM2-135M-Instruct;
- the vLLM engine with ``FakeAsyncLLM`` (tests/fakes/fake_vllm.py), with vLLM >= 0.11's
  ``StructuredOutputsParams`` and the older ``GuidedDecodingParams``; plus what it hands
  vLLM (``SamplingParams``) and what vLLM's validation says.

And the upstream proxy, which implements none, refuses each by its OpenAI name.

Checks: log probabilities (one entry per completion token, EOS excluded, their bytes
spelling the text, ``k`` alternatives in order, the greedy pick the most likely), none
when not asked; ``logit_bias`` (-100 bans a token, +100 forces one, an id outside the
vocabulary refused naming ``logit_bias`` before anything runs); ``json_object`` (one
JSON object, finish ``stop``); penalties accepted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sie.core.errors import InvalidInput
from sie.engines.generation import GenerationEngine
from sie.engines.generators.openai_upstream import OpenAIUpstreamGenerator
from sie.engines.generators.vllm_engine import VllmGenerator
from tests.contract.generation_contract import FRANCE, collect, request, smollm_engine
from tests.contract.test_generation_engines import UPSTREAM_MODEL, upstream_engine, vllm_engine
from tests.fakes.fake_vllm import (
    VOCAB_SIZE,
    FakeAsyncLLM,
    FakeTokenizer,
    FakeVllm,
    FakeVllmServer,
    serve,
)

pytestmark = pytest.mark.anyio


@dataclass
class Features:
    """An engine and what the checks need of its tokenizer."""

    engine: GenerationEngine
    encode: Callable[[str], list[int]]  # text -> token ids (no special tokens)
    vocab_size: int
    eos_ends: bool = True  # the France answer ends on EOS


async def check_logprobs(f: Features) -> None:
    r = await collect(f.engine, request(messages=FRANCE, logprobs=3))
    entries = [e for d in r.deltas for e in (d.logprobs or [])]
    assert all(d.logprobs is not None for d in r.deltas)  # every delta, maybe empty
    assert r.final.finish_reason == "stop" and r.final.completion_tokens is not None
    assert len(entries) == r.final.completion_tokens - (1 if f.eos_ends else 0)  # no EOS
    assert bytes(b for e in entries for b in e["bytes"]).decode() == r.text
    for e in entries:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert e["logprob"] <= 0 and e["top_logprobs"][0]["token"] == e["token"]  # greedy
        assert e["logprob"] == pytest.approx(e["top_logprobs"][0]["logprob"])
    plain = await collect(f.engine, request(messages=FRANCE))
    assert plain.text == r.text and all(d.logprobs is None for d in plain.deltas)
    zero = await collect(f.engine, request(messages=FRANCE, logprobs=0))
    assert all(e["top_logprobs"] == [] for d in zero.deltas for e in d.logprobs or [])


async def check_logit_bias(f: Features) -> None:
    greedy = (await collect(f.engine, request(messages=FRANCE))).text
    assert "Paris" in greedy
    paris = f.encode(" Paris")[0]
    banned = await collect(f.engine, request(messages=FRANCE, logit_bias={paris: -100.0}))
    assert "Paris" not in banned.text and banned.text.startswith(greedy.split(" Paris")[0])
    green = f.encode(" green")
    forced = await collect(
        f.engine, request(prompt="Hello", max_tokens=1, logit_bias={green[0]: 100.0})
    )
    assert f.encode(forced.text)[:1] == green[:1], forced.text
    for bad in (f.vocab_size, f.vocab_size + 10**6):
        req = request(messages=FRANCE, logit_bias={bad: 1.0})
        with pytest.raises(InvalidInput) as info:
            f.engine.check_request(req)
        assert info.value.fields["field"] == "logit_bias" and str(bad) in info.value.message
        with pytest.raises(InvalidInput):
            await collect(f.engine, req)


async def check_json_object(f: Features) -> None:
    ask = [
        {
            "role": "user",
            "content": 'Reply in JSON with the key "capital": what is the capital of France?',
        }
    ]
    r = await collect(f.engine, request(messages=ask, max_tokens=48, response_format="json_object"))
    assert r.final.finish_reason == "stop", r.text
    assert isinstance(json.loads(r.text), dict)


async def check_penalties(f: Features) -> None:
    r = await collect(
        f.engine,
        request(
            prompt="one one one one", max_tokens=6, presence_penalty=1.0, frequency_penalty=-1.0
        ),
    )
    assert r.final.finish_reason is not None


FEATURE_CONTRACT = [check_logprobs, check_logit_bias, check_json_object, check_penalties]
IDS = [c.__name__.removeprefix("check_") for c in FEATURE_CONTRACT]


# ---------------------------------------------------------------- vLLM with its fake

TOK = FakeTokenizer()


@pytest.fixture(scope="module", params=[False, True], ids=["structured_outputs", "guided_decoding"])
def vllm_features(request: pytest.FixtureRequest) -> Iterator[Features]:
    eng = vllm_engine(FakeVllm(registry=CollectorRegistry(), legacy_guided=request.param))
    eng.load()
    try:
        yield Features(eng, lambda t: TOK.encode(t, add_special_tokens=False), VOCAB_SIZE)
    finally:
        eng.unload()


@pytest.mark.parametrize("check", FEATURE_CONTRACT, ids=IDS)
async def test_vllm_fake_features(
    vllm_features: Features, check: Callable[[Features], Any]
) -> None:
    await check(vllm_features)


async def test_vllm_sampling_params_mapping(vllm_features: Features) -> None:
    eng = vllm_features.engine
    assert isinstance(eng, VllmGenerator)
    fake = eng._engine
    assert isinstance(fake, FakeAsyncLLM)
    await collect(
        eng,
        request(
            messages=FRANCE,
            logprobs=2,
            logit_bias={5: -3.5},
            presence_penalty=0.5,
            frequency_penalty=-0.25,
            response_format="json_object",
        ),
    )
    sp = fake.requests[-1].params
    assert (sp.logprobs, sp.logit_bias) == (2, {5: -3.5})
    assert (sp.presence_penalty, sp.frequency_penalty) == (0.5, -0.25)
    so = sp.structured_outputs or sp.guided_decoding
    assert so is not None and so.json_object is True
    await collect(eng, request(messages=FRANCE))
    plain = fake.requests[-1].params  # the optional fields only when asked for
    assert plain.logprobs is None and plain.logit_bias is None and plain.structured_outputs is None
    assert plain.guided_decoding is None and plain.presence_penalty == 0.0


def test_the_fake_validates_as_vllm_does() -> None:
    from tests.fakes.fake_vllm import SamplingParams, StructuredOutputsParams

    for kw in ({"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"logprobs": -2}):
        with pytest.raises(ValueError):
            SamplingParams(**kw)
    with pytest.raises(ValueError):
        StructuredOutputsParams(json_object=True, regex="x")
    with pytest.raises(TypeError):
        SamplingParams(best_of=2)  # type: ignore[call-arg]
    assert SamplingParams(logit_bias={"7": 250}).logit_bias == {7: 100.0}  # vLLM clamps


async def test_vllm_refuses_beyond_max_logprobs_as_vllm(vllm_features: Features) -> None:
    """SIE's own bound (20) is vLLM's default ``max_logprobs``: the request never reaches
    vLLM's refusal; the fake still plays it for a direct call."""
    eng = vllm_features.engine
    with pytest.raises(InvalidInput) as info:
        await collect(eng, request(messages=FRANCE, logprobs=21))
    assert info.value.fields["field"] == "logprobs"
    fake = eng._engine  # type: ignore[attr-defined]
    from tests.fakes.fake_vllm import SamplingParams

    with pytest.raises(ValueError, match="max allowed: 20"):
        async for _ in fake.generate(
            {"prompt_token_ids": [5, 6]}, SamplingParams(logprobs=21), "x"
        ):
            pass


# ---------------------------------------------------------------- upstream: none of them


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIUpstreamGenerator]:
    fake = FakeAsyncLLM(model=UPSTREAM_MODEL)
    with serve(FakeVllmServer(fake)) as server:
        eng = upstream_engine(server.base_url)
        eng.load()
        try:
            yield eng
        finally:
            eng.unload()
    fake.shutdown()


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        ({"logprobs": 0}, "logprobs"),
        ({"logit_bias": {5: 1.0}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"response_format": "json_object"}, "response_format"),
    ],
)
async def test_upstream_refuses_every_optional_feature(
    upstream: OpenAIUpstreamGenerator, sampling: dict[str, Any], param: str
) -> None:
    req = request(messages=FRANCE, **sampling)
    with pytest.raises(InvalidInput) as info:
        upstream.check_request(req)
    assert info.value.fields["field"] == param and "openai_upstream" in info.value.message
    with pytest.raises(InvalidInput):
        await collect(upstream, req)
    assert (await collect(upstream, request(messages=FRANCE))).text


# ---------------------------------------------------------------- transformers, real model


@pytest.fixture(scope="module")
def transformers_features() -> Iterator[Features]:
    with smollm_engine() as engine:
        tok = engine.tokenizer
        yield Features(engine, lambda t: tok.encode(t, add_special_tokens=False), len(tok))


@pytest.mark.slow
@pytest.mark.parametrize("check", FEATURE_CONTRACT, ids=IDS)
async def test_transformers_features(
    transformers_features: Features, check: Callable[[Features], Any]
) -> None:
    await check(transformers_features)


@pytest.mark.slow
async def test_transformers_penalties_change_a_repetitive_completion(
    transformers_features: Features,
) -> None:
    eng = transformers_features.engine
    plain = await collect(eng, request(prompt="one one one one", max_tokens=10))
    for kw in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        pen = await collect(eng, request(prompt="one one one one", max_tokens=10, **kw))
        assert pen.text != plain.text, kw
