"""Subjects and wildcard matching (architecture §8, §8.2, §16.2)."""

import pytest

from sie.core.subjects import (
    direct_filter,
    direct_subject,
    inbox_subject,
    inbox_wildcard,
    lane_filter,
    normalize_model_id,
    stream_name,
    stream_subjects,
    subject_matches,
    work_subject,
)


def test_spec_example() -> None:
    # architecture §8.2: exactly this subject, six tokens.
    s = work_subject("default", "rtx6000", "default", "vidore/colqwen2.5-v0.2")
    assert s == "sie.work.default.rtx6000.default.vidore__colqwen2_dot_5-v0_dot_2"
    assert len(s.split(".")) == 6
    assert subject_matches(lane_filter("default", "rtx6000", "default"), s)
    assert subject_matches(stream_subjects("default")[0], s)


def test_bge_example() -> None:
    # architecture §16.2 step 1.
    assert (
        work_subject("default", "default", "default", "BAAI/bge-m3")
        == "sie.work.default.default.default.BAAI__bge-m3"
    )


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("a/b", "a__b"),
        ("a.b", "a_dot_b"),
        ("a*b", "a_b"),
        ("a>b", "a_b"),
        ("a b\tc", "a_b_c"),
        ("plain-id_1", "plain-id_1"),
    ],
)
def test_normalize(raw: str, norm: str) -> None:
    assert normalize_model_id(raw) == norm


def test_inbox_and_stream_names() -> None:
    assert inbox_subject("gw-1", "abc-123") == "_INBOX.gw-1.abc-123"
    assert subject_matches(inbox_wildcard("gw-1"), "_INBOX.gw-1.abc-123")
    assert not subject_matches(inbox_wildcard("gw-1"), "_INBOX.gw-2.abc-123")
    assert stream_name("default") == "WORK_POOL_default"
    assert stream_subjects("default") == ["sie.work.default.*.*.*"]


@pytest.mark.parametrize(
    ("pattern", "subject", "ok"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("*.b", "a.b", True),
        ("a.b", "a.b.c", False),
        ("a.b.c", "a.b", False),
        (">", "x", True),
    ],
)
def test_wildcards(pattern: str, subject: str, ok: bool) -> None:
    assert subject_matches(pattern, subject) is ok


def test_direct_dispatch_subject_does_not_match_pool_stream() -> None:
    # architecture §8.2: the 7-token worker subject is outside sie.work.{pool}.*.*.*
    assert not subject_matches(
        stream_subjects("default")[0], "sie.work.default.l4.default.m.worker-1"
    )


def test_direct_dispatch_subject_escapes_the_pool_stream() -> None:
    # architecture §8.2: one token after the model, so WORK_POOL_{pool} never stores it
    s = direct_subject("default", "l4", "default", "HuggingFaceTB/SmolLM2-135M-Instruct", "w-1")
    assert s == "sie.work.default.l4.default.HuggingFaceTB__SmolLM2-135M-Instruct.w-1"
    assert not subject_matches("sie.work.default.*.*.*", s)
    assert subject_matches(direct_filter("default", "l4", "default", "w-1"), s)
    assert not subject_matches(direct_filter("default", "l4", "default", "w-2"), s)
