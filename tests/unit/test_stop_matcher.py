"""StopMatcher and request validation (sie.engines.generation): pure, no model."""

from __future__ import annotations

import itertools
import random

import pytest

from sie.core.errors import InvalidInput
from sie.engines.generation import (
    GenerationRequest,
    SamplingParams,
    StopMatcher,
    validate_request,
)


def run(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    """Feed ``pieces``; return every emitted chunk (the flush last) and ``stopped``."""
    m = StopMatcher(stops)
    out = [m.feed(p) for p in pieces]
    if not m.stopped:
        out.append(m.flush())
    return out, m.stopped


def reference(stops: list[str], text: str) -> tuple[str, bool]:
    """What the whole stream should yield: cut before the earliest stop occurrence."""
    hits = [i for i in (text.find(s) for s in stops if s) if i != -1]
    return (text[: min(hits)], True) if hits else (text, False)


def test_no_stops_passes_through() -> None:
    out, stopped = run([], ["Hel", "lo"])
    assert out == ["Hel", "lo", ""]
    assert not stopped


def test_stop_inside_one_piece() -> None:
    out, stopped = run(["\n\n"], ["Paris.\n\nThe answer"])
    assert "".join(out) == "Paris."
    assert stopped


def test_stop_split_across_pieces_never_leaks_a_prefix() -> None:
    m = StopMatcher(["of Fr"])
    assert m.feed("The capital o") == "The capital "  # "o" could start the stop
    assert m.held == "o"
    assert m.feed("f") == ""  # "of" still could
    assert m.feed(" Fr") == ""  # matched: nothing of it is emitted
    assert m.stopped
    assert m.feed("ance") == ""
    assert m.flush() == ""


def test_held_prefix_released_when_it_does_not_match() -> None:
    m = StopMatcher(["Parisian"])
    assert m.feed("It is Par") == "It is "
    assert m.feed("is") == ""
    assert m.feed(".") == "Paris."
    assert not m.stopped
    assert m.flush() == ""


def test_flush_returns_held_text_when_stream_ends_otherwise() -> None:
    m = StopMatcher(["</end>"])
    assert m.feed("answer </e") == "answer "
    assert m.flush() == "</e"
    assert m.flush() == ""


def test_earliest_stop_wins() -> None:
    out, stopped = run(["world", "lo w"], ["hel", "lo wor", "ld"])
    assert "".join(out) == "hel"
    assert stopped


def test_overlapping_stop_prefix_inside_held_text() -> None:
    # "aab" must stop at index 1 even though the held text started at 0
    out, stopped = run(["ab"], ["a", "a", "b", "c"])
    assert "".join(out) == "a"
    assert stopped


def test_empty_stop_strings_are_ignored() -> None:
    out, stopped = run(["", "x"], ["abc"])
    assert "".join(out) == "abc"
    assert not stopped


def test_stopped_matcher_emits_nothing_more() -> None:
    m = StopMatcher(["."])
    assert m.feed("a.b") == "a"
    assert m.feed("more") == ""
    assert m.flush() == ""


def test_randomised_against_reference() -> None:
    """Any split of any text: the concatenated output is the text up to the earliest
    stop; no chunk ever carries a character past that point."""
    rng = random.Random(7)
    alphabet = "ab c."
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        ]
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 5))))
        pieces = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
        out, stopped = run(stops, pieces)
        want, want_stopped = reference(stops, text)
        assert "".join(out) == want, (text, stops, pieces, out)
        assert stopped == want_stopped


# ---------------------------------------------------------------- validation


def req(**kw: object) -> GenerationRequest:
    sampling = {k: kw.pop(k) for k in list(kw) if k in SamplingParams.__dataclass_fields__}
    base: dict[str, object] = {"request_id": "r1", "prompt": "hi"}
    base.update(kw)
    return GenerationRequest(sampling=SamplingParams(**sampling), **base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"seed": 2**64}, "seed"),
        ({"seed": "1"}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop": "x"}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}]}, "prompt"),  # both
        ({"prompt": None}, "messages"),  # neither
        ({"prompt": None, "messages": []}, "messages"),
        ({"prompt": None, "messages": [{"content": "x"}]}, "messages[0]"),
        ({"prompt": None, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"request_id": ""}, "request_id"),
    ],
)
def test_validation_names_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        validate_request(req(**kw))
    assert info.value.fields["field"] == field
    assert field.split("[")[0] in info.value.message


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"max_tokens": None},
        {"max_tokens": 1, "temperature": 0, "top_p": 1.0, "seed": 0, "stop": ["\n"]},
        {"temperature": 2.0, "top_p": 0.01, "seed": -5},
        {"prompt": None, "messages": [{"role": "user", "content": "x"}]},
    ],
)
def test_valid_requests_pass(kw: dict[str, object]) -> None:
    validate_request(req(**kw))
