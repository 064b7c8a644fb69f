"""sie.engines.onnx.token_scales: per-token activation scales in a dynamically
quantised graph (a token's result no longer depends on the rest of its tensor)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from sie.engines.onnx.quantize import INT8_FILE, INT8_TOKEN_FILE, int8_file, quantize_int8
from sie.engines.onnx.token_scales import TOKEN_SCALES_TAG, per_token_scales

K, N = 32, 16


def _float_graph(path: Path) -> np.ndarray:
    """``Y = X @ W + X @ W2`` (X float32 ``[batch, seq, K]``): two MatMuls share one
    quantiser, as the attention's Q/K/V do; returns ``W + W2``."""
    rng = np.random.default_rng(7)
    w = rng.normal(size=(K, N)).astype(np.float32)
    w2 = rng.normal(size=(K, N)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["A"]),
        helper.make_node("MatMul", ["X", "W2"], ["B"]),
        helper.make_node("Add", ["A", "B"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", "s", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", "s", N])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(w2, "W2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return w + w2


def _int8(tmp_path: Path) -> onnx.ModelProto:
    """The graph as SIE quantises it with per-tensor scales (``quantize_int8``)."""
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    _float_graph(src)
    quantize_int8(src, dst)
    return onnx.load(str(dst))


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"X": x})[0])


def test_each_token_is_quantised_alone(tmp_path: Path) -> None:
    model = _int8(tmp_path)
    rng = np.random.default_rng(3)
    small = rng.normal(size=(1, 5, K)).astype(np.float32)
    loud = (rng.normal(size=(1, 5, K)) * 1000).astype(np.float32)  # a neighbour 1000x louder
    batch = np.concatenate([small, loud])
    # per tensor (as quantize_dynamic writes it) the loud neighbour changes the result
    assert not np.array_equal(_run(model, batch)[:1], _run(model, small))
    assert per_token_scales(model) == 1  # one quantiser feeds both MatMuls
    onnx.checker.check_model(model)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["sie.activation_scales"] == TOKEN_SCALES_TAG
    alone = _run(model, small)
    np.testing.assert_array_equal(_run(model, batch)[:1], alone)  # now it changes nothing
    np.testing.assert_array_equal(_run(model, small[:, 2:3]), alone[:, 2:3])  # a token alone


def test_per_token_results_stay_close_to_float32(tmp_path: Path) -> None:
    w = _float_graph(tmp_path / "ref.onnx")
    model = _int8(tmp_path)
    per_token_scales(model)
    x = np.random.default_rng(5).normal(size=(3, 7, K)).astype(np.float32)
    x[0] *= 100  # one loud text: with one scale per tensor the others would lose precision
    got, want = _run(model, x), x @ w
    cos = (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))
    assert float(cos.min()) > 0.999


def test_an_all_zero_token_stays_zero(tmp_path: Path) -> None:
    model = _int8(tmp_path)
    per_token_scales(model)
    x = np.zeros((1, 2, K), dtype=np.float32)
    x[0, 1] = 1.0
    out = _run(model, x)
    assert np.isfinite(out).all() and not out[0, 0].any()


def test_a_graph_without_quantisers_is_left_alone(tmp_path: Path) -> None:
    _float_graph(tmp_path / "f.onnx")
    model = onnx.load(str(tmp_path / "f.onnx"))
    before = model.SerializeToString()
    assert per_token_scales(model) == 0
    assert model.SerializeToString() == before


def test_an_unknown_use_of_a_scale_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    model = _int8(tmp_path)
    scale = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLinear").output[1]
    model.graph.node.append(helper.make_node("Identity", [scale], ["leak"]))
    before = model.SerializeToString()
    with pytest.raises(ValueError, match="used by Identity"):
        per_token_scales(model)
    assert model.SerializeToString() == before


def test_quantize_int8_writes_either_kind(tmp_path: Path) -> None:
    _float_graph(tmp_path / "f.onnx")
    assert int8_file("tensor") == INT8_FILE and int8_file("token") == INT8_TOKEN_FILE
    quantize_int8(tmp_path / "f.onnx", tmp_path / INT8_FILE)
    quantize_int8(tmp_path / "f.onnx", tmp_path / INT8_TOKEN_FILE, token_scales=True)
    plain, token = onnx.load(str(tmp_path / INT8_FILE)), onnx.load(str(tmp_path / INT8_TOKEN_FILE))
    assert any(n.op_type == "DynamicQuantizeLinear" for n in plain.graph.node)
    assert not any(n.op_type == "DynamicQuantizeLinear" for n in token.graph.node)
    assert {p.key: p.value for p in token.metadata_props}["sie.activation_scales"] == "per-token"
