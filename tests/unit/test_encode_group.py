"""The worker's encode batch call (sie.roles.worker.tasks, docs/performance.md):
preparation runs per instruction inside the engine call, and a text the preparation
refuses fails its own item only."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sie.core.errors import InvalidInput
from sie.engines.runtime.batching import ItemFailure
from sie.roles.worker.tasks import Encoded, engine_batch_fn


class FakeEncoder:
    """Records prepare/encode calls; refuses any text that starts with ``LONG``."""

    outputs = ("dense",)

    def __init__(self) -> None:
        self.prepared: list[tuple[str | None, list[str]]] = []
        self.encoded: list[list[str]] = []

    def load(self) -> None: ...

    def unload(self) -> None: ...

    def prepare(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None,
        is_query: bool,
        options: Mapping[str, Any],
    ) -> tuple[list[str], list[int]]:
        self.prepared.append((instruction, list(texts)))
        if any(t.startswith("LONG") for t in texts):
            raise InvalidInput("too long", field="text")
        rendered = [f"{instruction or ''}{'q:' if is_query else ''}{t}" for t in texts]
        return rendered, [len(t.split()) + 2 for t in texts]

    def encode(
        self,
        texts: Sequence[str],
        *,
        output_types: Sequence[str],
        options: Mapping[str, Any],
        lengths: Sequence[int] | None = None,
    ) -> dict[str, list[Any]]:
        self.encoded.append(list(texts))
        return {"dense": [np.full(2, float(len(t)), dtype=np.float32) for t in texts]}


def run(engine: FakeEncoder, payloads: list[tuple[str, dict[str, Any], str | None]]) -> list[Any]:
    fn = engine_batch_fn(engine)  # type: ignore[arg-type]
    return fn(("encode", ("dense",), ()), payloads)


def test_one_prepare_per_instruction_and_one_encode_call() -> None:
    eng = FakeEncoder()
    opts = {"is_query": True}
    out = run(eng, [("a b", opts, None), ("c", opts, "I:"), ("d e f", opts, None)])
    assert sorted(eng.prepared, key=lambda p: str(p[0])) == [
        ("I:", ["c"]),
        (None, ["a b", "d e f"]),
    ]
    assert len(eng.encoded) == 1
    assert sorted(eng.encoded[0]) == ["I:q:c", "q:a b", "q:d e f"]
    assert [type(r) for r in out] == [Encoded] * 3
    assert [r.tokens for r in out] == [4, 3, 5]
    assert out[1].outputs["dense"][0] == len("I:q:c")  # results map back to their items
    assert all(r.prepare_s >= 0.0 for r in out)


def test_a_refused_text_fails_only_its_own_item() -> None:
    eng = FakeEncoder()
    opts: dict[str, Any] = {}
    out = run(eng, [("ok one", opts, None), ("LONG text", opts, None), ("ok two", opts, None)])
    assert isinstance(out[1], ItemFailure) and isinstance(out[1].error, InvalidInput)
    assert isinstance(out[0], Encoded) and isinstance(out[2], Encoded)
    assert eng.encoded == [["ok one", "ok two"]]  # the refused text never reaches the model
    assert out[2].outputs["dense"][0] == len("ok two")


def test_a_group_of_refused_texts_makes_no_engine_call() -> None:
    eng = FakeEncoder()
    out = run(eng, [("LONG a", {}, None), ("LONG b", {}, "I:")])
    assert all(isinstance(r, ItemFailure) for r in out)
    assert eng.encoded == []
