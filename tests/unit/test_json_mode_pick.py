"""``json_mode.pick`` filters candidates by the bytes the JSON prefix can take next: the
same choice as trying every candidate, without walking a biased-away vocabulary
through the recogniser at every step (tests/hostile found ~175 ms per token)."""

from __future__ import annotations

import random
import time

from sie.engines.generators.json_mode import JsonPrefix, pick


def _state(prefix: bytes) -> JsonPrefix:
    s = JsonPrefix()
    assert s.feed(prefix)
    return s


def _naive(order: list[int], state: JsonPrefix, table: list[bytes], eos: frozenset[int]):
    for tid in order:
        if tid in eos or tid >= len(table) or not table[tid]:
            continue
        nxt = state.copy()
        if nxt.feed(table[tid]):
            return tid
    return None


def test_next_bytes_are_what_the_recogniser_accepts() -> None:
    value = _state(b'{"k": ')
    assert set(b'{["-0123456789tfn \t\n\r') == set(value.next_bytes())
    assert set(_state(b'{"k": tr').next_bytes()) == {ord("u")}
    assert ord("}") in _state(b"{").next_bytes() and ord("a") not in _state(b"{").next_bytes()


def test_pick_agrees_with_trying_every_candidate() -> None:
    rng = random.Random(7)
    pieces = [b"}", b"]", b",", b":", b"a", b"abc", b'"x"', b"1", b"12", b" ", b"true", b"\xc3"]
    table = [rng.choice(pieces) for _ in range(2000)] + [b""]
    eos = frozenset({5, 17})
    for prefix in (b"{", b'{"k"', b'{"k": ', b'{"k": 1', b'{"k": [', b'{"k": "v', b'{"a": t'):
        state = _state(prefix)
        order = list(range(len(table)))
        rng.shuffle(order)
        got = pick(order, state, table, eos)
        want = _naive(order, state, table, eos)
        assert (got[0] if got else None) == want, prefix


def test_a_vocabulary_biased_away_costs_little_per_step() -> None:
    table = [b"}" for _ in range(49_000)] + [b"1"]  # only the last one fits a value
    state = _state(b'{"k": ')
    t0 = time.perf_counter()
    got = pick(range(len(table)), state, table, frozenset())
    took = time.perf_counter() - t0
    assert got is not None and got[0] == len(table) - 1
    assert took < 0.05, f"{took * 1000:.0f} ms for one step"
