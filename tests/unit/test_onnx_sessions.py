"""How ``sie.engines.onnx.runtime.Sessions`` spends its cores (docs/performance.md
"Threads per session run"), on MiniLM's real float32 graph: big passes on intra-op
threads, small passes on 1-thread sessions spread over lanes, the share split among
concurrent calls, and the same outputs whichever way a pass ran."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from sie.core.errors import InferenceError
from sie.engines.onnx.runtime import Sessions, TextInputs
from tests.unit.test_onnx_engines import _engine, _minilm

WORDS = "the quick brown fox jumps over the lazy dog while the cat watches".split()


@pytest.fixture(scope="module")
def loaded() -> Iterator[tuple[TextInputs, Any]]:
    engine = _engine(_minilm(), "onnx")
    engine.load()
    inputs, sessions = engine._loaded()
    yield inputs, sessions.path
    engine.unload()


class Spy(Sessions):
    """Records the thread count of each session a pass ran on and the OS thread that
    ran it (the real sessions run the pass)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran: list[tuple[int, int, int]] = []  # (tokens, session threads, thread id)
        self.hold: threading.Event | None = None  # the first pass waits for it
        self.entered = threading.Event()

    def _run(self, session: Any, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        threads = next(t for t, s in self._by_threads.items() if s is session)
        self.ran.append((int(feeds["input_ids"].size), threads, threading.get_ident()))
        if self.hold is not None and not self.entered.is_set():
            self.entered.set()
            self.hold.wait(timeout=10)
        return super()._run(session, feeds)


def _pass(inputs: TextInputs, words: int, rows: int = 1) -> dict[str, np.ndarray]:
    text = " ".join((WORDS * 20)[:words])
    return inputs.features([text] * rows)


def test_a_big_pass_runs_on_every_core_a_small_one_on_one(loaded: Any) -> None:
    inputs, path = loaded
    s = Spy(path, "cpu", max_threads=2, parallel_min_tokens=24)
    big, small = _pass(inputs, 30, rows=4), _pass(inputs, 3)
    assert big["input_ids"].size >= 24 > small["input_ids"].size
    s.run(big)
    s.run(small)
    assert [(t, n) for t, n, _ in s.ran] == [
        (big["input_ids"].size, 2),
        (small["input_ids"].size, 1),
    ]


def test_small_passes_are_spread_over_the_calls_cores_in_order(loaded: Any) -> None:
    inputs, path = loaded
    s = Spy(path, "cpu", max_threads=2, parallel_min_tokens=10_000)
    passes = [_pass(inputs, n) for n in (3, 8, 5, 12, 4, 9)]
    got = s.run_all(passes)
    assert {n for _, n, _ in s.ran} == {1}
    assert len({tid for _, _, tid in s.ran}) == 2  # two lanes
    alone = [s.run(p) for p in passes]
    for a, b in zip(got, alone, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)  # results stay with their pass


def test_concurrent_calls_split_the_cores(loaded: Any) -> None:
    inputs, path = loaded
    s = Spy(path, "cpu", max_threads=2, parallel_min_tokens=24)
    s.hold = threading.Event()
    small, big = _pass(inputs, 3), _pass(inputs, 30, rows=4)
    first = threading.Thread(target=s.run, args=(small,))
    first.start()  # in flight, held inside its pass
    assert s.entered.wait(10)
    s.run(big)  # the second call in flight: a share of one core
    s.hold.set()
    first.join()
    ran = {tokens: n for tokens, n, _ in s.ran}
    assert ran[big["input_ids"].size] == 1
    s.run(big)  # alone again: both cores
    assert s.ran[-1][1] == 2


def test_a_failed_pass_is_an_inference_error(loaded: Any) -> None:
    inputs, path = loaded
    s = Sessions(path, "cpu", max_threads=2, parallel_min_tokens=10_000)
    bad = {k: v.astype(np.int32) for k, v in _pass(inputs, 3).items()}  # graph wants int64
    with pytest.raises(InferenceError):
        s.run_all([_pass(inputs, 3), bad])
    s.close()


def test_one_text_passes_are_tokenised_together_as_features_would(loaded: Any) -> None:
    inputs, _ = loaded
    texts = ["a", "a longer text of several words", " ".join(WORDS * 80), "mid size text"]
    singles = inputs.passes(texts, [[i] for i in range(len(texts))])
    for text, got in zip(texts, singles, strict=True):
        want = inputs.features([text])
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
            assert got[name].dtype == np.int64
    assert singles[2]["input_ids"].shape[1] == inputs.window  # truncated to the window
    chunked = inputs.passes(texts, [[0, 1], [2, 3]])
    np.testing.assert_array_equal(chunked[1]["input_ids"], inputs.features(texts[2:])["input_ids"])


def test_a_call_whose_own_lane_fails_waits_for_its_other_lanes(loaded: Any) -> None:
    inputs, path = loaded
    s = Spy(path, "cpu", max_threads=2, parallel_min_tokens=10_000)
    finished: list[int] = []
    run = s._run

    def timed(session: Any, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        out = run(session, feeds)
        finished.append(threading.get_ident())
        return out

    s._run = timed  # type: ignore[method-assign]
    bad = {k: v.astype(np.int32) for k, v in _pass(inputs, 3).items()}
    good = [_pass(inputs, n) for n in (4, 5, 6, 7, 8)]
    with pytest.raises(InferenceError):
        s.run_all([bad, *good])  # lane 0 (the caller) fails on its first pass
    assert len(finished) == 3  # the other lane ran all of its passes before the call ended
    assert s._calls == 0
    s.close()
