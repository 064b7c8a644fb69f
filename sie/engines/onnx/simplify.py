"""Shape arithmetic out of an exported graph (docs/performance.md "Shape arithmetic").

``torch.onnx.export`` with dynamic batch and sequence axes writes every head split and
merge of the attention (``view(batch, seq, heads, head_dim)``) as a ``Reshape`` whose
target shape is computed at run time: ``Shape`` → ``Gather`` → ``Unsqueeze`` →
``Concat``, a few times per layer. ONNX Runtime cannot fold them (the axes are
dynamic), so a one-text pass of all-MiniLM-L6-v2 ran 314 nodes, about 110 of them
shape arithmetic on tensors of one to four numbers, each paying the executor's
per-node cost. ``simplify_graph`` rewrites such a ``Reshape``'s target as a constant
that ONNX's ``Reshape`` reads the same way: an entry that stays the same whatever the
batch and sequence stays, one that is always the input's size on the same axis becomes
``0`` (copy), and at most one other becomes ``-1`` (the rest); the arithmetic that fed
it is then dead and removed. Which entry is which comes from running the graph on two
probe batches of different sizes (2 x 7 and 3 x 13 tokens) with every computed target
as an extra output, and the constant target must give both probes' shapes. It also
drops the ``Where(IsNaN(p), 0, p)`` the exporter puts after each attention softmax:
``p`` is NaN only for a row whose every key is masked, which no tokenised text has
(``[CLS]`` is never masked).

The outputs are bit for bit those of the graph before (MiniLM: 314 → 199 nodes after
ONNX Runtime's own rewrites, a one-text int8 pass 975 → 914 µs on one thread), and the
engine still checks the result against torch at every load (``sie.engines.onnx.checks``).
A graph the probes cannot run (inputs other than int64 ``[batch, sequence]``) is left as
it was.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PROBES", "constant_target", "simplify_graph"]

log = logging.getLogger(__name__)

#: (batch, sequence) of the probe runs: different, and unlike any fixed size of a model.
PROBES = ((2, 7), (3, 13))


def simplify_graph(model: Any) -> tuple[Any, int]:
    """Constant ``Reshape`` targets and no NaN guard after softmax, in place.

    Args:
        model: an ``onnx.ModelProto`` (float32 encoder, cross-encoder or masked-LM graph)
            whose inputs are int64 ``[batch, sequence]`` (token ids, masks, type ids).

    Returns:
        ``(model, nodes removed)``; ``(model, 0)`` unchanged when the probes cannot run
        or nothing applies.
    """
    from onnx import AttributeProto, numpy_helper

    graph = model.graph
    subgraphs = (AttributeProto.GRAPH, AttributeProto.GRAPHS)
    if any(a.type in subgraphs for n in graph.node for a in n.attribute):
        return model, 0  # names used inside a subgraph would defeat the pruning below
    constants = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    computed = [
        n
        for n in graph.node
        if n.op_type == "Reshape"
        and n.input[1] not in constants
        and not any(a.name == "allowzero" and a.i for a in n.attribute)
    ]
    before = len(graph.node)
    if computed:
        try:
            seen = _probe(model, computed)
        except Exception as exc:  # an input the probes cannot feed, an op ORT refuses
            log.info("graph shapes left as exported: the probe run failed (%s)", exc)
            seen = {}
        for node in computed:
            if node.output[0] not in seen:
                continue
            target = constant_target(seen[node.output[0]])
            if target is None:
                continue
            name = f"{node.output[0]}__sie_shape"
            graph.initializer.append(numpy_helper.from_array(np.array(target, np.int64), name))
            node.input[1] = name
    _drop_softmax_nan_guards(graph)
    _prune(graph)
    return model, before - len(graph.node)


#: One probe's view of a Reshape: (input shape, computed target, output shape).
Seen = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _probe(model: Any, reshapes: Sequence[Any]) -> dict[str, list[Seen]]:
    """Run ``model`` on ``PROBES`` with each Reshape's input shape, target and output
    shape as extra outputs; per Reshape (by output name), one ``Seen`` per probe."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    g = probe.graph
    wanted: list[tuple[str, str, str, str]] = []
    for i, node in enumerate(reshapes):
        src, out = f"__sie_probe_{i}_in", f"__sie_probe_{i}_out"
        g.node.append(helper.make_node("Shape", [node.input[0]], [src]))
        g.node.append(helper.make_node("Shape", [node.output[0]], [out]))
        wanted.append((node.output[0], src, node.input[1], out))
        for name in (src, node.input[1], out):
            g.output.append(helper.make_tensor_value_info(name, TensorProto.INT64, None))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(
        probe.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    inputs = session.get_inputs()
    if any(i.type != "tensor(int64)" or len(i.shape) != 2 for i in inputs):
        raise ValueError("inputs are not int64 [batch, sequence]")
    names = [name for _, *rest in wanted for name in rest]
    seen: dict[str, list[Seen]] = {key: [] for key, *_ in wanted}
    for batch, seq in PROBES:
        feeds = {
            i.name: (np.ones if "mask" in i.name else np.zeros)((batch, seq), np.int64)
            for i in inputs
        }
        values = dict(zip(names, session.run(names, feeds), strict=True))
        for key, src, target, out in wanted:
            a, b, c = (tuple(int(v) for v in values[n].reshape(-1)) for n in (src, target, out))
            seen[key].append((a, b, c))
    return seen


def constant_target(seen: Sequence[Seen]) -> list[int] | None:
    """The constant ``Reshape`` target that gives every probe's output shape, or None.

    ``seen``: per probe, (input shape, computed target, output shape). An entry the same
    in every probe stays; one equal to the input's size on its axis in every probe is
    ``0``; at most one other is ``-1``."""
    targets = {len(t) for _, t, _ in seen}
    if len(targets) != 1:
        return None
    target: list[int] = []
    for j in range(targets.pop()):
        values = {t[j] for _, t, _ in seen}
        if len(values) == 1:
            target.append(values.pop())  # fixed (or already 0 / -1)
        elif all(j < len(src) and t[j] == src[j] for src, t, _ in seen):
            target.append(0)  # the input's own size on this axis
        else:
            target.append(-1)
    if target.count(-1) > 1:
        return None
    if any(_reshaped(src, target) != out for src, _, out in seen):
        return None
    return target


def _reshaped(src: tuple[int, ...], target: Sequence[int]) -> tuple[int, ...] | None:
    """The shape ONNX ``Reshape`` (allowzero 0) gives ``src`` with ``target``."""
    dims = [src[j] if d == 0 and j < len(src) else d for j, d in enumerate(target)]
    if any(d == 0 for d in target[len(src) :]):
        return None
    total = int(np.prod(src))
    known = int(np.prod([d for d in dims if d != -1]))
    if -1 in dims:
        if known == 0 or total % known:
            return None
        dims[dims.index(-1)] = total // known
    return tuple(dims)


def _drop_softmax_nan_guards(graph: Any) -> None:
    made = {o: n for n in graph.node for o in n.output}
    initializers = {i.name: i for i in graph.initializer}
    renamed: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "Where" or len(node.input) != 3:
            continue
        cond, fill, value = node.input
        guard = made.get(cond)
        source = made.get(value)
        if (
            guard is not None
            and guard.op_type == "IsNaN"
            and guard.input[0] == value
            and _is_zero(fill, made, initializers)
            and source is not None
            and source.op_type == "Softmax"
        ):
            renamed[node.output[0]] = value
    if not renamed or any(o.name in renamed for o in graph.output):
        return
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]


def _is_zero(name: str, made: dict[str, Any], initializers: dict[str, Any]) -> bool:
    """Whether ``name`` is a constant (initializer or ``Constant`` node) of zeros only."""
    from onnx import numpy_helper

    tensor = initializers.get(name)
    node = made.get(name)
    if tensor is None and node is not None and node.op_type == "Constant":
        tensor = next((a.t for a in node.attribute if a.name == "value"), None)
    if tensor is None:
        return False
    return not np.any(numpy_helper.to_array(tensor))


def _prune(graph: Any) -> None:
    """Remove nodes no output depends on, then initializers no node reads."""
    needed = {o.name for o in graph.output}
    live = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(i for i in node.input if i)
    live.reverse()
    del graph.node[:]
    graph.node.extend(live)
    used = {i for n in graph.node for i in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
