"""Wire codec (architecture §8.4; reference §1.2, §2.10) incl. msgpack_numpy interop."""

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from sie.core.admission import EngineState
from sie.core.errors import WireError
from sie.core.wire import Heartbeat, ModelStatus, WorkItem, WorkResult, packb, unpackb


def test_work_item_round_trip() -> None:
    wi = WorkItem(
        work_item_id="r.0",
        request_id="r",
        item_index=0,
        total_items=2,
        operation="encode",
        model_id="BAAI/bge-m3",
        profile_id="default",
        pool_name="default",
        router_id="gw-1",
        reply_subject="_INBOX.gw-1.r",
        item={"id": "a", "text": "héllo"},
        output_types=["dense"],
        options={"normalize": True},
        is_query=True,
    )
    raw = wi.to_bytes()
    # a plain msgpack map with named fields (reference §2.10); None fields omitted
    as_map = msgpack.unpackb(raw, raw=False)
    assert as_map["work_item_id"] == "r.0" and as_map["item"] == {"id": "a", "text": "héllo"}
    assert "instruction" not in as_map
    assert WorkItem.from_bytes(raw) == wi


def test_work_result_round_trip_with_numpy_blob() -> None:
    vec = np.linspace(-1, 1, 384, dtype=np.float32)
    blob = packb({"dense": {"dims": 384, "dtype": "float32", "values": vec}})
    res = WorkResult(
        work_item_id="r.0",
        request_id="r",
        item_index=0,
        success=True,
        result_msgpack=blob,
        inference_ms=1.5,
    )
    back = WorkResult.from_bytes(res.to_bytes())
    assert back.inference_ms == 1.5
    out = back.result()["dense"]["values"]
    assert out.dtype == np.float32 and np.array_equal(out, vec)


@pytest.mark.parametrize("dtype", ["<f4", "<f2", "|i1", "|u1", "<i4", "<i8", "<f8"])
def test_numpy_interop_both_directions(dtype: str) -> None:
    arr = (np.arange(12).reshape(3, 4) - 5).astype(np.dtype(dtype))
    ours = packb({"v": arr})
    # a msgpack + msgpack_numpy client decodes our bytes (bin-type keys, reference §1.2)
    theirs = msgpack.unpackb(ours, object_hook=msgpack_numpy.decode, raw=False)
    assert theirs["v"].dtype == arr.dtype and np.array_equal(theirs["v"], arr)
    # and we decode theirs
    encoded = msgpack.packb({"v": arr}, default=msgpack_numpy.encode, use_bin_type=True)
    assert np.array_equal(unpackb(encoded)["v"], arr)


def test_nd_map_uses_bin_keys() -> None:
    m = msgpack.unpackb(packb(np.zeros(2, dtype=np.float32)), raw=False, strict_map_key=False)
    assert set(m) == {b"nd", b"type", b"kind", b"shape", b"data"}
    assert m[b"nd"] is True and m[b"type"] == "<f4" and m[b"kind"] == b"" and m[b"shape"] == [2]


def test_str_keyed_nd_maps_decode_too() -> None:
    arr = np.arange(3, dtype=np.float32)
    raw = msgpack.packb(
        {"nd": True, "type": "<f4", "kind": b"", "shape": [3], "data": arr.tobytes()}
    )
    assert np.array_equal(unpackb(raw), arr)


def test_numpy_scalar_round_trip() -> None:
    x = unpackb(packb({"s": np.float32(1.5), "a": np.ones(2, dtype=np.float32)}))
    assert x["s"] == np.float32(1.5) and np.array_equal(x["a"], np.ones(2, dtype=np.float32))


def test_malformed_payloads_raise_wire_error() -> None:
    with pytest.raises(WireError):
        unpackb(b"\xc1")  # never-used byte
    with pytest.raises(WireError):
        WorkItem.from_bytes(packb({"work_item_id": "x"}))  # required fields missing
    with pytest.raises(WireError):
        WorkItem.from_bytes(packb([1, 2, 3]))
    bad = WorkItem(
        "r.0", "r", 0, 1, "encode", "m", "default", "default", "gw", "_INBOX.gw.r"
    ).to_map()
    bad["item_index"] = "zero"
    with pytest.raises(WireError, match="item_index"):
        WorkItem.from_bytes(packb(bad))
    with pytest.raises(WireError):
        WorkResult(work_item_id="a", request_id="a", item_index=0, success=True).result()


def test_heartbeat_round_trip() -> None:
    hb = Heartbeat(
        worker_id="w",
        pool="default",
        machine_profile="l4",
        bundle="default",
        ready=True,
        models=[
            ModelStatus(name="m", state="loaded"),
            ModelStatus(name="fast", state="loaded", engine="onnx-int8"),
            ModelStatus(
                name="llm",
                state="loaded",
                loads=2,
                bytes=5,
                engine_state=EngineState(running=1, waiting=2, kv_usage=0.5, max_num_seqs=4),
            ),
            ModelStatus(name="bad", state="failed", last_error={"code": "X", "message": "no"}),
        ],
    )
    assert Heartbeat.from_bytes(hb.to_bytes()) == hb


@pytest.mark.parametrize(
    ("models", "needle"),
    [
        ("nope", "Heartbeat.models"),
        (["m"], "expected a map"),
        ([{"state": "loaded"}], "ModelStatus.name"),
        ([{"name": "m", "state": "exploded"}], "unknown state"),
        ([{"name": "m", "loads": -1}], "integers"),
        ([{"name": "m", "bytes": True}], "integers"),
        ([{"name": "m", "engine_state": {"running": -1, "waiting": 0}}], "engine_state"),
        ([{"name": "m", "engine_state": {"running": 1}}], "engine_state"),
        ([{"name": "m", "engine_state": [1, 2]}], "engine_state"),
        ([{"name": "m", "last_error": "boom"}], "last_error"),
        ([{"name": "m", "engine": 8}], "ModelStatus.engine"),
        ([{"name": "m", "engine": ""}], "ModelStatus.engine"),
        ([{"name": "m", "engine": "x" * 65}], "ModelStatus.engine"),
    ],
)
def test_heartbeat_with_a_malformed_model_entry_is_refused(models: object, needle: str) -> None:
    base = Heartbeat(
        worker_id="w", pool="default", machine_profile="l4", bundle="default", ready=True
    ).to_map()
    with pytest.raises(WireError, match=needle):
        Heartbeat.from_bytes(packb({**base, "models": models}))


def test_generation_chunk_roundtrip() -> None:
    from sie.core.wire import GenerationChunk

    last = GenerationChunk(
        request_id="r",
        seq=7,
        text="Paris.",
        done=True,
        finish_reason="stop",
        prompt_tokens=31,
        completion_tokens=8,
        worker_id="w",
    )
    back = GenerationChunk.from_bytes(last.to_bytes())
    assert back == last and back.generation is True
    with pytest.raises(WireError):
        GenerationChunk.from_bytes(GenerationChunk(request_id="r", seq=0).to_bytes()[:-2])
