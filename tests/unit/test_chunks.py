"""result_chunk_v1 split and reassembly (sie.core.chunks; docs/api.md §12): order and
duplicates tolerated, every conflict, bad length or digest, layout and budget refused."""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

import pytest

from sie.core.chunks import (
    CHUNK_KIND,
    ITEM_OVERHEAD_BYTES,
    MAX_CHUNKS,
    MAX_ITEM_BYTES,
    ChunkBudget,
    ChunkError,
    Reassembly,
    is_chunk,
    split_result,
)

RID = "req-1"


def chunks(data: bytes, size: int = 1000, index: int = 0) -> list[dict[str, Any]]:
    return split_result(
        data, request_id=RID, work_item_id=f"{RID}.{index}", item_index=index, max_chunk_bytes=size
    )


def test_split_covers_the_bytes_with_a_digest() -> None:
    data = os.urandom(2500)
    env = chunks(data)
    assert [e["chunk_index"] for e in env] == [0, 1, 2]
    assert all(is_chunk(e) and e["kind"] == CHUNK_KIND and e["chunk_count"] == 3 for e in env)
    assert b"".join(e["data"] for e in env) == data
    assert env[0]["digest"] == hashlib.sha256(data).hexdigest()
    assert not is_chunk({"kind": "result_chunk_v2"}) and not is_chunk([CHUNK_KIND])


def test_split_refuses_what_the_limits_cannot_carry() -> None:
    with pytest.raises(ChunkError) as exc:
        chunks(b"x" * (MAX_CHUNKS * 10 + 1), size=10)
    assert exc.value.reason == "too_large"
    with pytest.raises(ChunkError):
        split_result(
            b"x" * (MAX_ITEM_BYTES + 1),
            request_id=RID,
            work_item_id="w",
            item_index=0,
            max_chunk_bytes=MAX_ITEM_BYTES,
        )


def test_out_of_order_and_duplicates_reassemble_once() -> None:
    data = os.urandom(5000)
    env = chunks(data, 700)
    shuffled = env + env[:3]  # byte-identical duplicates
    random.Random(7).shuffle(shuffled)
    budget = ChunkBudget()
    r = Reassembly(RID, 2, budget)
    out = [r.add(dict(e)) for e in shuffled]
    done = [o for o in out if o is not None]
    assert done == [data]
    assert r.reserved_bytes == budget.reserved_bytes == 3 * len(data) + ITEM_OVERHEAD_BYTES
    r.close()
    assert budget.reserved_bytes == 0
    r.close()  # idempotent
    assert budget.reserved_bytes == 0


def _mutate(env: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {**env, **kw}


@pytest.mark.parametrize(
    ("mutation", "reason"),
    [
        ({"request_id": "another"}, "identity"),
        ({"item_index": 5}, "identity"),
        ({"item_index": -1}, "identity"),
        ({"digest": "ZZ"}, "malformed"),
        ({"digest": "A" * 64}, "malformed"),
        ({"chunk_count": MAX_CHUNKS + 1}, "too_large"),
        ({"chunk_count": 0}, "too_large"),
        ({"total_bytes": MAX_ITEM_BYTES + 1}, "too_large"),
        ({"chunk_index": 9}, "malformed"),
        ({"data": "text"}, "malformed"),
        ({"data": b""}, "malformed"),
        ({"item_index": True}, "malformed"),
        ({"total_bytes": "12"}, "malformed"),
        ({"work_item_id": None}, "malformed"),
    ],
)
def test_malformed_envelopes_fail_closed(mutation: dict[str, Any], reason: str) -> None:
    env = chunks(os.urandom(3000))
    with pytest.raises(ChunkError) as exc:
        Reassembly(RID, 2, ChunkBudget()).add(_mutate(env[0], **mutation))
    assert exc.value.reason == reason


def test_a_differing_duplicate_is_a_conflict() -> None:
    env = chunks(os.urandom(3000))
    r = Reassembly(RID, 1, ChunkBudget())
    r.add(env[0])
    with pytest.raises(ChunkError) as exc:
        r.add(_mutate(env[0], data=os.urandom(1000)))
    assert exc.value.reason == "conflict"


def test_metadata_conflict_within_one_digest() -> None:
    env = chunks(os.urandom(3000))
    r = Reassembly(RID, 1, ChunkBudget())
    r.add(env[0])
    with pytest.raises(ChunkError) as exc:
        r.add(_mutate(env[1], total_bytes=2999))
    assert exc.value.reason == "conflict"


def test_a_wrong_digest_or_length_is_refused_when_complete() -> None:
    data = os.urandom(3000)
    env = chunks(data)
    bad = [_mutate(e, digest=hashlib.sha256(b"other").hexdigest()) for e in env]
    r = Reassembly(RID, 1, ChunkBudget())
    r.add(bad[0])
    r.add(bad[1])
    with pytest.raises(ChunkError) as exc:
        r.add(bad[2])
    assert exc.value.reason == "digest"
    short = [_mutate(e, total_bytes=3500) for e in env]  # parts sum to 3000
    r = Reassembly(RID, 1, ChunkBudget())
    r.add(short[0])
    r.add(short[1])
    with pytest.raises(ChunkError) as exc:
        r.add(short[2])
    assert exc.value.reason == "length"
    over = [_mutate(e, total_bytes=2500) for e in env]
    r = Reassembly(RID, 1, ChunkBudget())
    r.add(over[0])
    r.add(over[1])
    with pytest.raises(ChunkError) as exc:
        r.add(over[2])
    assert exc.value.reason == "length"


def test_chunk_zero_of_a_new_attempt_replaces_the_old_and_late_fragments_are_ignored() -> None:
    first, second = os.urandom(3000), os.urandom(2000)
    a, b = chunks(first), chunks(second)
    budget = ChunkBudget()
    r = Reassembly(RID, 1, budget)
    assert r.add(a[0]) is None
    assert r.add(b[1]) is None  # an unknown retry's non-zero fragment: ignored
    assert r.add(b[0]) is None  # chunk zero of a new digest: replaces attempt a
    assert budget.reserved_bytes == 3 * len(second) + ITEM_OVERHEAD_BYTES
    assert r.add(a[1]) is None  # late fragment of the abandoned attempt
    assert r.add(a[2]) is None
    assert r.add(b[1]) == second
    # the same digest restarted with another chunk count is a new layout
    r2 = Reassembly(RID, 1, ChunkBudget())
    c3, c2 = chunks(first, 1000), chunks(first, 1500)
    r2.add(c3[0])
    r2.add(c2[0])
    assert r2.add(c3[1]) is None  # tombstoned layout
    assert r2.add(c2[1]) == first


def test_budgets_per_request_and_per_process() -> None:
    data = os.urandom(4000)
    budget = ChunkBudget(limit_bytes=3 * 4000 + ITEM_OVERHEAD_BYTES)
    r1 = Reassembly(RID, 2, budget)
    r1.add(chunks(data, index=0)[0])
    r2 = Reassembly("req-2", 1, budget)
    env = split_result(
        data, request_id="req-2", work_item_id="w", item_index=0, max_chunk_bytes=1000
    )
    with pytest.raises(ChunkError) as exc:
        r2.add(env[0])
    assert exc.value.reason == "global_budget"
    r1.close()
    assert r2.add(env[0]) is None  # room again
    r3 = Reassembly("req-3", 2, ChunkBudget(), request_limit_bytes=2 * 3 * 4000)
    for index in (0, 1):
        e = split_result(
            data,
            request_id="req-3",
            work_item_id=f"w{index}",
            item_index=index,
            max_chunk_bytes=1000,
        )
        if index == 0:
            r3.add(e[0])
        else:
            with pytest.raises(ChunkError) as exc:
                r3.add(e[0])
            assert exc.value.reason == "request_budget"


def test_chunks_after_completion_are_ignored() -> None:
    data = os.urandom(1500)
    env = chunks(data)
    r = Reassembly(RID, 1, ChunkBudget())
    r.add(env[0])
    assert r.add(env[1]) == data
    assert r.add(env[0]) is None and r.add(env[1]) is None  # a redelivery's copy
