"""How ``sie.engines.onnx.runtime.Sessions`` spends its cores (docs/performance.md
"Threads per session run", "Passes on the calling thread"), on MiniLM's real float32
graph: big passes on intra-op threads, small passes on 1-thread sessions in one group
per core of the call's share (a lone call spreads over every core, concurrent calls
run their passes on their own threads, never more groups at once than cores), and the
same outputs whichever way a pass ran; and on the real int8 graph, the graph rewrite
int8 leaves off."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.core.errors import InferenceError
from sie.engines.onnx.runtime import INT8_DISABLED_OPTIMIZERS, Sessions, TextInputs
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
        self.together: threading.Barrier | None = None  # the first passes meet here
        self.meet_tokens: set[int] | None = None  # only passes of these sizes meet
        self.meet_left = 0
        self._count = threading.Lock()
        self.running = 0
        self.most = 0  # most passes running at once

    def _run(self, session: Any, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        threads = next(t for t, s in self._by_threads.items() if s is session)
        with self._count:
            self.ran.append((int(feeds["input_ids"].size), threads, threading.get_ident()))
            self.running += 1
            self.most = max(self.most, self.running)
            first = len(self.ran) == 1
            tokens = int(feeds["input_ids"].size)
            meet = (
                self.together is not None
                and self.meet_left > 0
                and (self.meet_tokens is None or tokens in self.meet_tokens)
            )
            self.meet_left -= int(meet)
        try:
            if meet:
                assert self.together is not None
                try:
                    self.together.wait(timeout=10)
                except threading.BrokenBarrierError:
                    pass
            if self.hold is not None and first:
                self.entered.set()
                self.hold.wait(timeout=10)
            return super()._run(session, feeds)
        finally:
            with self._count:
                self.running -= 1


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


def test_a_lone_calls_small_passes_spread_over_every_core_in_order(loaded: Any) -> None:
    inputs, path = loaded
    s = Spy(path, "cpu", max_threads=2, parallel_min_tokens=10_000)
    s.together, s.meet_left = threading.Barrier(2), 2  # the first two passes run at once
    passes = [_pass(inputs, n) for n in (3, 8, 5, 12, 4, 9)]
    got = s.run_all(passes)
    assert not s.together.broken
    assert {n for _, n, _ in s.ran} == {1}
    assert len({tid for _, _, tid in s.ran}) == 2 and s.most == 2  # both cores, no more
    mine = [t for t, _, tid in s.ran if tid == threading.get_ident()]
    sizes = [int(p["input_ids"].size) for p in passes]
    assert mine == sizes[:3]  # the first group of consecutive passes: the calling thread
    s.together = None
    alone = [s.run(p) for p in passes]
    for a, b in zip(got, alone, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)  # results stay with their pass
    s.close()


def test_a_lone_calls_lone_small_pass_runs_on_the_calling_thread(loaded: Any) -> None:
    inputs, path = loaded
    s = Spy(path, "cpu", max_threads=2, parallel_min_tokens=10_000)
    s.run(_pass(inputs, 3))
    assert [tid for _, _, tid in s.ran] == [threading.get_ident()]  # no hand-off
    s.close()


def test_concurrent_calls_run_their_passes_on_their_own_threads(loaded: Any) -> None:
    """With as many calls in flight as cores, each call runs all of its small passes
    on its own thread (no hand-off to the pool), and the calls run at once."""
    inputs, path = loaded
    s = Spy(path, "cpu", max_threads=2, parallel_min_tokens=10_000)
    s.hold = threading.Event()
    first_passes = [_pass(inputs, 3), _pass(inputs, 4)]
    first = threading.Thread(target=s.run_all, args=(first_passes,))
    first.start()
    assert s.entered.wait(10)  # the first call holds one core, two calls in flight
    second_passes = [_pass(inputs, n) for n in (5, 6, 7, 8, 9, 10)]
    done: list[list[np.ndarray]] = []
    second = threading.Thread(target=lambda: done.append(s.run_all(second_passes)))
    second.start()
    second.join(10)  # runs to its end while the first call still holds its core
    assert not second.is_alive() and len(done[0]) == 6
    s.hold.set()
    first.join(10)
    assert not first.is_alive()
    tokens = {int(p["input_ids"].size) for p in second_passes}
    assert len({tid for t, _, tid in s.ran if t in tokens}) == 1  # one thread: its own
    assert s.most <= 2 and len(s.ran) == 8
    assert s._calls == 0
    s.close()


def test_a_call_past_the_cores_waits_for_a_core(loaded: Any) -> None:
    """Never more groups of small passes at once than cores: a third call waits until
    one of two running calls has ended its passes, then runs at once."""
    inputs, path = loaded
    s = Spy(path, "cpu", max_threads=2, parallel_min_tokens=10_000)
    running = threading.Barrier(3)  # the first two calls' passes and this test
    release = threading.Event()
    run = s._run

    def held(session: Any, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        if int(feeds["input_ids"].size) in (5, 6):  # the first two calls wait here
            running.wait(timeout=10)
            release.wait(timeout=10)
        return run(session, feeds)

    s._run = held  # type: ignore[method-assign]
    calls = [threading.Thread(target=s.run_all, args=([_pass(inputs, n)],)) for n in (3, 4, 6)]
    sizes = [int(_pass(inputs, n)["input_ids"].size) for n in (3, 4, 6)]
    assert sizes[:2] == [5, 6]
    for t in calls[:2]:
        t.start()
    running.wait(timeout=10)  # both hold a core now
    calls[2].start()
    calls[2].join(0.3)
    assert calls[2].is_alive()  # no core free: it waits
    assert sizes[2] not in [t for t, _, _ in s.ran]
    release.set()
    for t in calls:
        t.join(10)
        assert not t.is_alive()
    assert s.most <= 2 and len(s.ran) == 3
    s.close()


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


def test_a_call_with_a_failed_pass_waits_for_its_other_passes(loaded: Any) -> None:
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
        s.run_all([*good[:2], bad, *good[2:]])  # the calling thread's group fails
    # the pool's group (the last three passes) ended before the call did
    assert finished.count(threading.get_ident()) == 2 and len(finished) == 5
    assert s._calls == 0
    s.close()


def test_int8_sessions_leave_the_skip_layer_norm_fusion_off(tmp_path: Path) -> None:
    """On MiniLM's real int8 graph: ONNX Runtime's optimised graph holds the fused
    ``SkipLayerNormalization`` with every rewrite on and none with the int8 setting,
    and the int8 engine's sessions are built with it."""
    import onnx
    import onnxruntime as ort

    engine = _engine(_minilm(), "onnx-int8")
    engine.load()
    try:
        _, sessions = engine._loaded()
        assert sessions.disabled_optimizers == INT8_DISABLED_OPTIMIZERS
        assert "SkipLayerNormFusion" in INT8_DISABLED_OPTIMIZERS
        path = sessions.path
    finally:
        engine.unload()

    def fused_ops(disabled: tuple[str, ...]) -> set[str]:
        out = tmp_path / f"opt{len(disabled)}.onnx"
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.optimized_model_filepath = str(out)
        ort.InferenceSession(
            str(path), opts, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled)
        )
        return {n.op_type for n in onnx.load(str(out)).graph.node}

    assert "SkipLayerNormalization" in fused_ops(())
    assert "SkipLayerNormalization" not in fused_ops(INT8_DISABLED_OPTIMIZERS)


def test_a_counted_text_is_tokenised_once_for_its_pass(loaded: Any) -> None:
    """``counts`` keeps the calling thread's encodings for its next ``passes``: the same
    feeds as a fresh tokenisation, with one tokenizer call for both."""
    inputs, _ = loaded
    texts = ["A short one.", " ".join(WORDS * 40), "Another, longer text of a few more words."]
    chunks = [[i] for i in range(len(texts))]
    fresh = inputs.passes(texts, chunks)
    calls: list[int] = []
    real = inputs._single

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def encode_batch(self, batch: list[str]) -> Any:
            calls.append(len(batch))
            return real.encode_batch(batch)

    inputs._single = Counting()
    try:
        counts = inputs.counts(texts)
        again = inputs.passes(texts, chunks)
        assert calls == [3]  # counts tokenised; passes reused its encodings
        assert counts == [int(f["input_ids"].size) for f in fresh]
        assert counts[1] == inputs.window  # truncated to the window, as before
        for a, b in zip(fresh, again, strict=True):
            assert a.keys() == b.keys()
            assert all(np.array_equal(a[k], b[k]) for k in a)
        inputs.passes(texts, chunks)  # used once: the next call tokenises again
        assert calls == [3, 3]
    finally:
        inputs._single = real
