"""The transformers generation engine beyond the port contract (which it runs in
tests/contract/test_generation_engines.py): agreement with Hugging Face ``generate``,
chunked prefill and unbatched decode, window and capacity, load failures, on the real
SmolLM2-135M-Instruct (``tests.contract.generation_contract.smollm_engine``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sie.core.config import parse_model_config
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed
from sie.engines.generation import GenerationEngine
from tests.contract.generation_contract import (
    COUNTING,
    FRANCE,
    SMOLLM,
    Result,
    collect,
    request,
    smollm_engine,
)

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


# ---------------------------------------------------------------- transformers engine


@pytest.fixture(scope="module")
def smollm() -> Iterator[Any]:
    with smollm_engine() as engine:
        yield engine


def test_implements_the_port(smollm: Any) -> None:
    assert isinstance(smollm, GenerationEngine)
    assert smollm.weights_dir is not None and (smollm.weights_dir / "config.json").is_file()
    assert (smollm.weights_dir / "sie-source.json").is_file()  # the dequantised cache


async def test_matches_hf_generate(smollm: Any) -> None:
    """The engine's greedy tokens are what ``model.generate`` produces alone."""
    import torch

    tok, model = smollm.tokenizer, smollm._model
    prompt = "The three primary colors are"
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        ref = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :]
    r = await collect(smollm, request(prompt, max_tokens=8))
    assert r.text == tok.decode(ref, skip_special_tokens=True)


async def test_chunked_prefill_and_unbatched_decode_give_the_same_tokens(smollm: Any) -> None:
    """A prompt prefilled in 4-token chunks, and decoding without the shared padded
    batch (the fallback for non-plain caches), produce the default path's output."""
    prompts = ["The three primary colors are", "Water boils at a temperature of"]
    want = [(await collect(smollm, request(p, max_tokens=6))).text for p in prompts]
    chunk, batched = smollm.prefill_chunk_tokens, smollm._batched
    try:
        smollm.prefill_chunk_tokens = 4
        smollm._batched = False
        got: dict[int, str] = {}

        async def one(i: int) -> None:
            got[i] = (await collect(smollm, request(prompts[i], max_tokens=6))).text

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    finally:
        smollm.prefill_chunk_tokens, smollm._batched = chunk, batched
    assert [got[i] for i in range(len(prompts))] == want


def small_window_engine(**loadtime: Any) -> Any:
    from sie.engines.generators.transformers_gen import TransformersGenerator

    cfg = parse_model_config(
        {
            "sie_id": "test/smollm-window-44",
            "hf_id": SMOLLM,
            "max_sequence_length": 44,
            "tasks": {},
            "profiles": {
                "default": {
                    "adapter_path": "sie.engines.generators.transformers_gen:TransformersGenerator",
                    "max_batch_tokens": 8192,
                    "adapter_options": {"loadtime": loadtime},
                }
            },
        }
    )
    return TransformersGenerator(cfg, cfg.resolve_profile(), "cpu")


async def test_window_capacity_and_unload(smollm: Any) -> None:
    """max_sequence_length caps the window ("length" when full; a prompt that fills it
    is refused); kv_capacity_tokens makes a request wait; unload fails in-flight ones."""
    from sie.core.errors import ShuttingDown

    eng = small_window_engine(kv_capacity_tokens=60)
    await anyio.to_thread.run_sync(eng.load)
    try:
        assert eng.window == 44 and eng.state().kv_capacity_tokens == 60
        r = await collect(eng, request(messages=FRANCE))  # 37 + 8 tokens do not fit 44
        assert r.final.finish_reason == "length"
        assert r.final.prompt_tokens + r.final.completion_tokens == 44
        with pytest.raises(InvalidInput) as info:
            await collect(eng, request("word " * 60))
        assert info.value.fields["field"] == "prompt"

        # two 37-token prompts do not fit 60 KV tokens together: the second waits
        results: list[Result] = []
        seen: list[tuple[int, int]] = []

        async def one() -> None:
            results.append(await collect(eng, request(messages=FRANCE, max_tokens=4)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
            while len(results) < 2:
                st = eng.state()
                seen.append((st.running, st.waiting))
                await anyio.sleep(0.005)
        assert (1, 1) in seen and not any(run > 1 for run, _ in seen)
        assert all(r.final.completion_tokens == 4 for r in results)

        # unload with a request in flight: its stream ends with ShuttingDown
        it = eng.generate(request(COUNTING))
        await it.__anext__()
        await anyio.to_thread.run_sync(eng.unload)
        with pytest.raises(ShuttingDown):
            async for _ in it:
                pass
        with pytest.raises(InferenceError):
            await collect(eng, request("x"))
    finally:
        eng.unload()


def test_load_failures_name_what_was_tried(tmp_path: Path) -> None:
    from sie.engines.generators.transformers_gen import TransformersGenerator

    def engine(**doc: Any) -> TransformersGenerator:
        cfg = parse_model_config(
            {
                "sie_id": "test/gen",
                "tasks": {},
                "profiles": {
                    "default": {
                        "adapter_path": "sie.engines.generators.transformers_gen:TransformersGenerator",
                        "max_batch_tokens": 1024,
                    }
                },
                **doc,
            }
        )
        return TransformersGenerator(cfg, cfg.resolve_profile(), "cpu")

    with pytest.raises(ModelLoadFailed) as info:
        engine(weights_path=str(tmp_path / "missing")).load()
    assert info.value.fields["error_class"] == "NOT_FOUND"
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ModelLoadFailed) as info:
        engine(weights_path=str(tmp_path)).load()
    assert info.value.fields["error_class"] == "CONFIG"
    assert "gguf_file" in info.value.message


async def test_generate_before_load_fails() -> None:
    eng = small_window_engine()
    with pytest.raises(InferenceError):
        await collect(eng, request("x"))
