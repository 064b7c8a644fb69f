"""The gateway's result inbox (sie.roles.gateway.inbox; docs/api.md §12): whole and
chunked results fill their slots; an invalid transfer ends the request at once with
503 TRANSPORT_FAILURE, a static message, and its reservations released."""

from __future__ import annotations

from sie.core.chunks import ChunkBudget, split_result
from sie.core.errors import TransportFailure
from sie.core.wire import WorkResult, packb
from sie.roles.gateway.collect import Collector
from sie.roles.gateway.inbox import TRANSPORT_FAILURE_MESSAGE, ResultInbox
from sie.telemetry import Metrics


def result(i: int, payload: bytes = b"x") -> WorkResult:
    return WorkResult(
        work_item_id=f"r.{i}",
        request_id="r",
        item_index=i,
        success=True,
        result_msgpack=packb({"blob": payload}),
        worker_id="w1",
    )


def setup(n: int = 2) -> tuple[ResultInbox, Collector, Metrics, list[str]]:
    metrics, seen = Metrics(), []
    inbox = ResultInbox(metrics, seen.append, ChunkBudget())
    col = Collector(n, [None] * n, n)
    inbox.pending["r"] = col
    return inbox, col, metrics, seen


def test_whole_and_chunked_results_complete_the_request() -> None:
    inbox, col, metrics, seen = setup()
    inbox.deliver("r", result(0).to_bytes())
    big = result(1, b"y" * 50_000).to_bytes()
    envelopes = split_result(
        big, request_id="r", work_item_id="r.1", item_index=1, max_chunk_bytes=8000
    )
    for e in reversed(envelopes):
        inbox.deliver("r", packb(e))
    assert col.done.is_set() and col.failure is None
    assert col.results[1] is not None and col.results[1].result()["blob"] == b"y" * 50_000
    assert seen == ["w1", "w1"]
    assert metrics.chunk_reserved_bytes._value.get() > 0  # held until the request ends
    inbox.close("r")
    assert inbox.budget.reserved_bytes == 0 and metrics.chunk_reserved_bytes._value.get() == 0
    inbox.deliver("r", result(0).to_bytes())
    assert inbox.late_results == 1


def test_a_forged_chunk_fails_the_request_closed() -> None:
    inbox, col, metrics, _ = setup()
    envelopes = split_result(
        result(0, b"z" * 30_000).to_bytes(),
        request_id="r",
        work_item_id="r.0",
        item_index=0,
        max_chunk_bytes=8000,
    )
    inbox.deliver("r", packb(envelopes[0]))
    inbox.deliver("r", packb({**envelopes[0], "data": b"secret-forged-bytes"}))
    assert col.done.is_set()
    assert isinstance(col.failure, TransportFailure)
    assert col.failure.status == 503 and col.failure.retry_after_s is None
    assert col.failure.message == TRANSPORT_FAILURE_MESSAGE  # nothing of what was sent
    assert metrics.chunk_rejections.labels("conflict")._value.get() == 1
    inbox.deliver("r", result(1).to_bytes())  # the request is over: later results ignored
    assert col.results[1] is None


def test_chunks_that_decode_to_another_item_are_refused() -> None:
    inbox, col, _, _ = setup()
    other = result(1).to_bytes()  # claims item 1, sent as item 0's chunks
    for e in split_result(
        other, request_id="r", work_item_id="r.0", item_index=0, max_chunk_bytes=50
    ):
        inbox.deliver("r", packb(e))
    assert isinstance(col.failure, TransportFailure)
    not_a_result = packb([1, 2, 3])
    inbox2, col2, _, _ = setup()
    for e in split_result(
        not_a_result, request_id="r", work_item_id="r.0", item_index=0, max_chunk_bytes=4
    ):
        inbox2.deliver("r", packb(e))
    assert isinstance(col2.failure, TransportFailure)


def failed(i: int, code: str, details: object = None) -> WorkResult:
    return WorkResult(
        work_item_id=f"r.{i}",
        request_id="r",
        item_index=i,
        success=False,
        error=f"item {i} failed",
        error_code=code,
        error_details=details,  # type: ignore[arg-type]
    )


def test_how_failed_items_become_one_error() -> None:
    import pytest

    from sie.core.errors import (
        AllItemsFailed,
        InferenceError,
        InvalidInput,
        LoraLoading,
        ModelLoadFailed,
        ModelLoading,
    )
    from sie.roles.gateway.collect import raise_failures

    raise_failures([result(0), result(1)])  # nothing failed
    with pytest.raises(ModelLoading) as loading:
        raise_failures([failed(0, "MODEL_LOADING"), failed(1, "MODEL_LOADING")])
    assert loading.value.status == 503 and loading.value.retry_after_s == 5
    with pytest.raises(LoraLoading) as lora:  # recognised on the wire (architecture §2)
        raise_failures([failed(0, "LORA_LOADING")])
    assert lora.value.status == 503 and lora.value.retry_after_s == 1
    with pytest.raises(AllItemsFailed) as mixed:
        raise_failures([failed(0, "MODEL_LOADING"), failed(1, "RESOURCE_EXHAUSTED")])
    assert mixed.value.status == 500 and mixed.value.code == "ALL_ITEMS_FAILED"
    assert [d["code"] for d in mixed.value.fields["details"]] == [
        "MODEL_LOADING",
        "RESOURCE_EXHAUSTED",
    ]
    with pytest.raises(InferenceError) as partial:
        raise_failures([result(0), failed(1, "INFERENCE_ERROR")])
    assert type(partial.value) is InferenceError
    assert partial.value.fields["details"][0]["item_index"] == 1
    # a client error on some items only: the request is at fault (4xx naming the item)
    bad = failed(1, "INVALID_INPUT")
    bad.error_field = "items[1].text"
    with pytest.raises(InvalidInput) as client:
        raise_failures([result(0), bad, result(2)])
    assert client.value.status == 400 and client.value.fields["field"] == "items[1].text"
    assert [d["item_index"] for d in client.value.fields["details"]] == [1]
    with pytest.raises(InferenceError):  # a server-side code on some items stays a 500
        raise_failures([result(0), failed(1, "MODEL_LOADING")])
    # MODEL_LOAD_FAILED carries its body; a worker's odd values get the conservative ones
    with pytest.raises(ModelLoadFailed) as load:
        raise_failures([failed(0, "MODEL_LOAD_FAILED", {"error_class": "OOM", "attempts": 3})])
    assert (load.value.fields["error_class"], load.value.fields["attempts"]) == ("OOM", 3)
    assert load.value.fields["permanent"] is True
    with pytest.raises(ModelLoadFailed) as odd:
        raise_failures(
            [
                failed(
                    0, "MODEL_LOAD_FAILED", {"error_class": 7, "attempts": True, "permanent": "no"}
                )
            ]
        )
    assert (odd.value.fields["error_class"], odd.value.fields["attempts"]) == ("UNKNOWN", 1)
    assert odd.value.fields["permanent"] is True and odd.value.retry_after_s is None


def test_results_past_the_reply_bound_end_the_request_with_413() -> None:
    from sie.core.errors import PayloadTooLarge

    metrics = Metrics()
    inbox = ResultInbox(metrics, lambda _: None, ChunkBudget(), max_result_bytes=30_000)
    col = Collector(3, [None] * 3, 3)
    inbox.pending["r"] = col
    inbox.deliver("r", result(0, b"a" * 20_000).to_bytes())
    assert not col.done.is_set()
    inbox.deliver("r", result(1, b"b" * 20_000).to_bytes())
    assert col.done.is_set() and isinstance(col.failure, PayloadTooLarge)
    assert col.failure.status == 413 and "SIE_MAX_RESPONSE_BYTES" in col.failure.message
    assert col.results[1] is None  # not kept
