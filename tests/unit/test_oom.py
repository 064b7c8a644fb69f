"""Out of memory in an engine call (sie.engines.runtime.oom; architecture §2): the batch
is halved until it fits; one item that does not fit alone is RESOURCE_EXHAUSTED."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import pytest

from sie.core.errors import ResourceExhausted
from sie.engines.runtime.oom import is_out_of_memory, split_on_oom


class OutOfMemoryError(RuntimeError):  # the name torch gives its allocator's error
    pass


def engine(limit: int, calls: list[int], exc: type[BaseException] = OutOfMemoryError) -> Any:
    def run(key: Hashable, payloads: Sequence[Any]) -> list[Any]:
        calls.append(len(payloads))
        if len(payloads) > limit:
            raise exc("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [p * 10 for p in payloads]

    return run


def test_a_batch_that_does_not_fit_is_served_in_smaller_batches() -> None:
    calls: list[int] = []
    run = split_on_oom(engine(3, calls))
    assert run("k", list(range(10))) == [i * 10 for i in range(10)]  # order kept
    assert calls[0] == 10 and max(calls[1:]) <= 5 and sum(c for c in calls if c <= 3) == 10


def test_one_item_that_does_not_fit_is_resource_exhausted() -> None:
    run = split_on_oom(engine(0, [], MemoryError))
    with pytest.raises(ResourceExhausted) as exc:
        run("k", [1, 2])
    assert exc.value.status == 503 and exc.value.retry_after_s == 5


def test_other_errors_pass_through_unsplit() -> None:
    calls: list[int] = []

    def broken(key: Hashable, payloads: Sequence[Any]) -> list[Any]:
        calls.append(len(payloads))
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        split_on_oom(broken)("k", [1, 2, 3, 4])
    assert calls == [4]


@pytest.mark.parametrize(
    ("exc", "oom"),
    [
        (MemoryError(), True),
        (OutOfMemoryError("x"), True),
        (RuntimeError("CUDA out of memory"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_what_counts_as_out_of_memory(exc: BaseException, oom: bool) -> None:
    assert is_out_of_memory(exc) is oom
