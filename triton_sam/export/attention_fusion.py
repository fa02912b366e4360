"""Our own attention fusion for encoders onnxruntime's transformer optimizer does not know.

What the TorchScript exporter writes (opset 17) for ``scaled_dot_product_attention`` on
q, k, v of shape [..., N, D] (e.g. SAM3's ViT after its rotary embedding, [B, heads, N, D]):

    Softmax(MatMul(q * c1, Transpose(k, swap last two) * c2), axis=-1) @ v

(c1 = c2 = sqrt(1/sqrt(D)); a single scale on the scores, on either operand or none at all is
matched too). onnxruntime runs it as written: the [..., N, N] score matrix is materialised,
then softmaxed, then multiplied (small SAM3 tracker, 2 threads, onnxruntime's profiler:
~100 ms of MatMul/Softmax kernels for the 5184-token global block, against 29 ms for
torch's flash attention). :func:`fuse_sdpa` replaces each match by one
``com.microsoft.MultiHeadAttention``, which on CPU runs MLAS's flash attention (tiles of the
score matrix, never the whole of it): 27 ms for both blocks in the same profile.

The op wants [batch, sequence, hidden] inputs. Every leading dim of q, k and v (batch,
heads, windows...) is folded into that batch and the op is told ``num_heads=1``: the
[..., N, D] -> [-1, N, D] reshapes are free (contiguous), no transpose is needed, and the
number of heads need not be known (ONNX shape inference leaves it symbolic in these graphs).
The output [-1, N, Dv] is reshaped back to q's leading dims + [N, Dv] under the name the last
MatMul had, so its consumers are untouched. Same math up to float reassociation (the scale
is applied once, c1*c2, instead of on each operand). q, k and v must have the same leading
dims (no broadcasting), as SDPA's export has; where a graph broadcasts them instead, the
folded batches differ and the op refuses at run time (it checks key's batch against
query's) unless the broadcast dims are 1, where the result is the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_MINUS_ONE = "fused_sdpa/minus_one"
_SCALE_OPS = ("Mul", "Div")


def fuse_sdpa(model: Any) -> int:
    """Replace each decomposed scaled-dot-product attention of ``model`` (an ``onnx.ModelProto``,
    top-level graph) by ``com.microsoft.MultiHeadAttention``, in place.

    Returns:
        The number of attentions fused (0: the graph is unchanged).
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    constants = _scalar_constants(graph)

    def only_use(name: str) -> Any:
        """The single consumer of ``name``, or None (several, none, or a graph output)."""
        users = consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in outputs else None

    producer = {out: node for node in graph.node for out in node.output}
    matches = []
    for softmax in graph.node:
        if softmax.op_type == "Softmax":
            found = _match(softmax, producer, only_use, constants)
            if found is not None:
                matches.append(found)
    if not matches:
        return 0

    graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), _MINUS_ONE))
    # Nodes are keyed by their first output (unique in an ONNX graph): protobuf may hand out a
    # new Python wrapper for the same node on each access, so object ids would not do.
    dead: set[str] = set()
    replacement: dict[str, list[Any]] = {}
    for i, (q, k, v, scale, removed, last) in enumerate(matches):
        p = f"fused_sdpa_{i}/"
        nodes, folded = [], []
        for label, t in (("q", q), ("k", k), ("v", v)):
            # [..., N, D] -> [-1, N, D]: every leading dim becomes the op's batch.
            nodes += [
                helper.make_node("Shape", [t], [p + f"{label}_nd"], start=-2),
                helper.make_node(
                    "Concat", [_MINUS_ONE, p + f"{label}_nd"], [p + f"{label}_3d_shape"], axis=0
                ),
                helper.make_node("Reshape", [t, p + f"{label}_3d_shape"], [p + f"{label}_3d"]),
            ]
            folded.append(p + f"{label}_3d")
        nodes += [
            helper.make_node(
                "MultiHeadAttention",
                folded,
                [p + "out_3d"],
                name=p + "MultiHeadAttention",
                domain="com.microsoft",
                num_heads=1,
                scale=scale,
            ),
            # Back to q's leading dims + [N, Dv], under the name the last MatMul's output had.
            helper.make_node("Shape", [q], [p + "lead"], end=-2),
            helper.make_node("Shape", [q], [p + "n"], start=-2, end=-1),
            helper.make_node("Shape", [v], [p + "dv"], start=-1),
            helper.make_node("Concat", [p + "lead", p + "n", p + "dv"], [p + "out_shape"], axis=0),
            helper.make_node("Reshape", [p + "out_3d", p + "out_shape"], [last.output[0]]),
        ]
        dead |= {n.output[0] for n in removed}
        replacement[last.output[0]] = nodes

    # The new nodes take the place of the last MatMul: q, k and v are produced before it
    # (they fed the removed nodes) and its consumers come after, so the order stays valid.
    kept = []
    for node in graph.node:
        kept += replacement.get(node.output[0], [])
        if node.output[0] not in dead:
            kept.append(node)
    # The scale constants the removed Muls read are now unused; drop their Constant nodes
    # (initializers left unused are dropped by onnxruntime when it loads the graph).
    used = {name for node in kept for name in node.input} | outputs
    kept = [n for n in kept if n.op_type != "Constant" or n.output[0] in used]
    del graph.node[:]
    graph.node.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return len(matches)


def _match(softmax: Any, producer: dict, only_use: Any, constants: dict) -> tuple | None:
    """(q, k, v, scale, nodes to remove, the last MatMul) for one attention, or None."""
    scores = producer.get(softmax.input[0])
    after = only_use(softmax.output[0])
    if scores is None or after is None or after.op_type != "MatMul":
        return None
    if after.input[0] != softmax.output[0] or not _same(only_use(scores.output[0]), softmax):
        return None
    removed = [softmax, after]
    scale = 1.0
    # An optional scale on the scores (Mul or Div by a scalar constant).
    if scores.op_type in _SCALE_OPS:
        c, x = _scaled(scores, constants)
        if c is None:
            return None
        scale *= c
        removed.append(scores)
        scores = producer.get(x)
        if scores is None or not _same(only_use(scores.output[0]), removed[-1]):
            return None
    if scores.op_type != "MatMul":
        return None
    removed.append(scores)
    q, q_scale, q_nodes = _strip_scale(scores.input[0], producer, only_use, constants)
    kt, k_scale, k_nodes = _strip_scale(scores.input[1], producer, only_use, constants)
    transpose = producer.get(kt)
    if transpose is None or transpose.op_type != "Transpose" or only_use(kt) is None:
        return None
    perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
    if (
        perm is None
        or len(perm) < 3
        or perm != [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]
    ):
        return None
    axis = next((a.i for a in softmax.attribute if a.name == "axis"), -1)
    if axis not in (-1, len(perm) - 1):
        return None
    k, k2_scale, k2_nodes = _strip_scale(transpose.input[0], producer, only_use, constants)
    removed += [*q_nodes, *k_nodes, transpose, *k2_nodes]
    scale *= q_scale * k_scale * k2_scale
    return q, k, after.input[1], scale, removed, after


def _same(a: Any, b: Any) -> bool:
    """Whether two node wrappers are the same node (see the keying note in fuse_sdpa)."""
    return a is not None and b is not None and a.output[0] == b.output[0]


def _strip_scale(name: str, producer: dict, only_use: Any, constants: dict) -> tuple:
    """``name`` = x * c (or x / c) with a scalar constant c used only here -> (x, c, [node]);
    anything else -> (name, 1.0, [])."""
    node = producer.get(name)
    if node is not None and node.op_type in _SCALE_OPS and only_use(name) is not None:
        c, x = _scaled(node, constants)
        if c is not None:
            return x, c, [node]
    return name, 1.0, []


def _scaled(node: Any, constants: dict) -> tuple[float | None, str]:
    """(factor, the other input) for Mul/Div by a scalar constant, else (None, "")."""
    a, b = node.input
    if node.op_type == "Mul":
        if b in constants:
            return constants[b], a
        if a in constants:
            return constants[a], b
    elif node.op_type == "Div" and b in constants and constants[b] != 0.0:
        return 1.0 / constants[b], a
    return None, ""


def _scalar_constants(graph: Any) -> dict[str, float]:
    """Float tensors of one element, from initializers and Constant nodes."""
    from onnx import TensorProto, numpy_helper

    tensors = [(t.name, t) for t in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                tensors.append((node.output[0], value))
    found = {}
    for name, t in tensors:
        if t.data_type == TensorProto.FLOAT and int(np.prod(t.dims)) == 1 and not t.external_data:
            found[name] = float(numpy_helper.to_array(t).reshape(()))
    return found
