"""Shape arithmetic folded out of exported graphs (sie.engines.onnx.simplify;
docs/performance.md "Shape arithmetic")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import sie.engines.onnx.export as export
from sie.engines.onnx.simplify import simplify_graph
from tests.unit.test_onnx_engines import _engine, _minilm


def _session(model: Any) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _dynamic_reshape_graph(fill: float = 0.0) -> Any:
    """ids [b, s] -> embeddings [b, s, 8] -> view(b, s, 2, 4) with the target computed
    from Shape(embeddings), then a softmax behind a ``Where(IsNaN(p), fill, p)`` guard,
    as torch exports attention."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 2, 4])
    table = np.random.default_rng(3).standard_normal((100, 8)).astype(np.float32)
    inits = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(np.array(0, np.int64), "i0"),
        numpy_helper.from_array(np.array(1, np.int64), "i1"),
        numpy_helper.from_array(np.array([0], np.int64), "ax"),
        numpy_helper.from_array(np.array([2, 4], np.int64), "tail"),
        numpy_helper.from_array(np.array(fill, np.float32), "fill"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["x"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i0"], ["b0"]),
        helper.make_node("Gather", ["shape", "i1"], ["s0"]),
        helper.make_node("Unsqueeze", ["b0", "ax"], ["b1"]),
        helper.make_node("Unsqueeze", ["s0", "ax"], ["s1"]),
        helper.make_node("Concat", ["b1", "s1", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Softmax", ["r"], ["p"], axis=-1),
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "fill", "p"], ["guarded"]),
        helper.make_node("Identity", ["guarded"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [ids], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_computed_reshape_target_becomes_a_constant_with_the_same_outputs() -> None:
    before = _dynamic_reshape_graph()
    after, removed = simplify_graph(_dynamic_reshape_graph())
    onnx.checker.check_model(after)
    ops = [n.op_type for n in after.graph.node]
    assert ops == ["Gather", "Reshape", "Softmax", "Identity"] and removed == 8
    target = next(i for i in after.graph.initializer if i.name == after.graph.node[1].input[1])
    assert numpy_helper.to_array(target).tolist() == [0, 0, 2, 4]
    rng = np.random.default_rng(0)
    for shape in ((1, 5), (3, 1), (2, 7), (4, 40)):
        ids = rng.integers(0, 100, shape).astype(np.int64)
        want = _session(before).run(None, {"input_ids": ids})[0]
        got = _session(after).run(None, {"input_ids": ids})[0]
        assert np.array_equal(want, got)


def test_a_nan_guard_with_another_fill_stays() -> None:
    after, _ = simplify_graph(_dynamic_reshape_graph(fill=1.0))
    assert [n.op_type for n in after.graph.node][-3:] == ["IsNaN", "Where", "Identity"]


def test_a_graph_the_probes_cannot_run_keeps_its_computed_shapes() -> None:
    model = _dynamic_reshape_graph()
    model.graph.node.append(helper.make_node("NoSuchOp", ["y"], ["z"], domain="example.org"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    model.opset_import.append(helper.make_opsetid("example.org", 1))
    same, _ = simplify_graph(model)
    assert "Concat" in [n.op_type for n in same.graph.node]  # the target is still computed


def test_a_target_no_constant_can_give_stays_computed() -> None:
    """A target with two entries that follow neither a fixed size nor the input's own
    axis (batch and sequence moved to other axes) has no constant form."""
    from sie.engines.onnx.simplify import constant_target

    seen = [((b * s,), (b, 1, 1, s), (b, 1, 1, s)) for b, s in ((2, 7), (3, 13))]
    assert constant_target(seen) is None
    heads = [((b, s, 8), (b, s, 2, 4), (b, s, 2, 4)) for b, s in ((2, 7), (3, 13))]
    assert constant_target(heads) == [0, 0, 2, 4]
    merged = [((b, s, 2, 4), (b, s, 8), (b, s, 8)) for b, s in ((2, 7), (3, 13))]
    assert constant_target(merged) == [0, 0, 8]
    flat = [((b, s, 8), (b * s, 8), (b * s, 8)) for b, s in ((2, 7), (3, 13))]
    assert constant_target(flat) == [-1, 8]
    moved = [((b, 2, s, 4), (b * 2, s, 4), (b * 2, s, 4)) for b, s in ((2, 7), (3, 13))]
    assert constant_target(moved) is None  # the sequence changes axis: two unknowns


@pytest.mark.slow
def test_minilm_exports_without_shape_arithmetic_and_the_same_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real export, simplified, against the same export left as torch wrote it:
    bit for bit the same token embeddings on unpadded, padded and truncated inputs."""
    config = _minilm()
    simplified = _engine(config, "onnx", tmp_path / "a")
    simplified.load()
    monkeypatch.setattr(export, "_simplify_file", lambda path: None)
    raw = _engine(config, "onnx", tmp_path / "b")
    raw.load()
    assert simplified.graph_path is not None and raw.graph_path is not None
    slim, full = onnx.load(str(simplified.graph_path)), onnx.load(str(raw.graph_path))
    assert len(slim.graph.node) < len(full.graph.node) - 200
    assert sum(n.op_type == "IsNaN" for n in full.graph.node) == 6  # one per layer
    assert not any(n.op_type == "IsNaN" for n in slim.graph.node)
    # what is left computed is the attention mask's broadcast, once per graph
    computed = {o for n in slim.graph.node if n.op_type != "Constant" for o in n.output}
    dynamic = [n for n in slim.graph.node if n.op_type == "Reshape" and n.input[1] in computed]
    assert len(dynamic) <= 2
    assert sum(n.op_type == "Reshape" for n in slim.graph.node) >= 30
    rng = np.random.default_rng(1)
    a, b = _session(slim), _session(full)
    for ids, mask in (
        (rng.integers(1000, 9000, (1, 19)), np.ones((1, 19))),
        (
            rng.integers(1000, 9000, (3, 12)),
            np.array([[1] * 12, [1] * 7 + [0] * 5, [1] * 3 + [0] * 9]),
        ),
        (rng.integers(1000, 9000, (2, 256)), np.ones((2, 256))),
    ):
        feeds = {
            "input_ids": ids.astype(np.int64),
            "attention_mask": mask.astype(np.int64),
            "token_type_ids": np.zeros(ids.shape, np.int64),
        }
        assert np.array_equal(a.run(None, feeds)[0], b.run(None, feeds)[0])
    simplified.unload()
    raw.unload()
