"""Fold a pointwise (1x1) Conv into the Conv before it: one convolution instead of two.

SAM3's tracker reads its two high-resolution FPN levels through ``conv_s0`` / ``conv_s1``,
1x1 convolutions from 256 channels down to 32 / 64, applied straight to the output of the
neck's 3x3 ``proj2`` (256 -> 256 channels, at 288x288 / 144x144): nothing nonlinear between
them and nothing else reads the 256-channel map. Two linear maps compose into one:

    B(A(x)) = W_B . (W_A * x + b_A) + b_B = (W_B . W_A) * x + (W_B . b_A + b_B)

with W_B the [Co, Cm] matrix of the 1x1 conv and ``.`` applied per kernel tap. It is exact at
the borders too (the 1x1 conv acts per pixel, after A's padding). For level 0 that is a 3x3
conv 256 -> 32 (6 GFLOP) instead of 256 -> 256 plus 256 -> 32 (51 GFLOP), the bulk of the
small SAM3 encoder's time on CPU; for the full-size model the same ~55 GFLOP per image.
Neither onnxruntime nor torch does this on its own. The composed weights are computed in
float64 and stored as float32, so the result differs from the two-step one by float
rounding only (measured below 1e-6 on the small model's features).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def fold_pointwise_convs(model: Any) -> int:
    """Fold each 1x1 Conv whose input is the sole output of another Conv, in place, where it
    saves work (``model``: an ``onnx.ModelProto`` loaded *with* its weights).

    Folded pairs: B is a plain 1x1 Conv (group 1, stride 1, no padding or dilation), A any
    group-1 Conv, both with float32 initializer weights (and biases, if any), A's output read
    by B only, and fewer multiply-adds after than before.

    Returns:
        The number of pairs folded (0: the graph is unchanged).
    """
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    producer = {out: node for node in graph.node for out in node.output}

    def array(name: str) -> np.ndarray | None:
        # The exporter shares equal initializers (e.g. zero biases) through Identity nodes.
        while name not in weights and name in producer and producer[name].op_type == "Identity":
            name = producer[name].input[0]
        t = weights.get(name)
        if t is None or t.data_type != TensorProto.FLOAT:
            return None
        return numpy_helper.to_array(t).astype(np.float64)

    folded: set[str] = set()  # A's former outputs (what the removed B read)
    moved: set[str] = set()  # B's outputs, now written by A (their `producer` entry is stale)
    for b in graph.node:
        a = producer.get(b.input[0]) if b.op_type == "Conv" else None
        if a is None or a.op_type != "Conv" or a.output[0] in folded | moved:
            continue
        if consumers.get(a.output[0]) != 1 or a.output[0] in outputs or not _pointwise(b):
            continue
        if _attr(a, "group", 1) != 1:
            continue
        wa, wb = array(a.input[1]), array(b.input[1])
        if wa is None or wb is None or wb.shape[2:] != (1,) * (wb.ndim - 2):
            continue
        co, cm = wb.shape[:2]
        taps = int(np.prod(wa.shape[2:]))
        if co * wa.shape[1] * taps >= cm * wa.shape[1] * taps + co * cm:
            continue  # widening 1x1: folding would add work
        ba = array(a.input[2]) if len(a.input) > 2 and a.input[2] else np.zeros(cm)
        bb = array(b.input[2]) if len(b.input) > 2 and b.input[2] else np.zeros(co)
        if ba is None or bb is None:
            continue
        mix = wb[:, :, 0, 0]
        w = np.einsum("om,mi...->oi...", mix, wa).astype(np.float32)
        bias = (mix @ ba + bb).astype(np.float32)
        prefix = f"{b.name or b.output[0]}/folded_"
        graph.initializer.extend(
            [numpy_helper.from_array(w, prefix + "W"), numpy_helper.from_array(bias, prefix + "B")]
        )
        del a.input[1:]
        a.input.extend([prefix + "W", prefix + "B"])
        folded.add(a.output[0])
        moved.add(b.output[0])
        a.output[0] = b.output[0]  # A now writes what B wrote; B goes
    if not folded:
        return 0
    kept = [n for n in graph.node if not (n.op_type == "Conv" and n.input[0] in folded)]
    del graph.node[:]
    graph.node.extend(kept)
    # A's and B's old weights are now unused: drop them (they are the big ones). Subgraphs
    # (If branches) may read outer initializers, so their inputs count as uses too.
    used = _used_names(graph)
    kept_weights = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept_weights)
    return len(folded)


def _used_names(graph: Any) -> set[str]:
    """Every tensor name a node of ``graph`` or of its subgraphs reads, plus its outputs."""
    used = {o.name for o in graph.output}
    for node in graph.node:
        used.update(node.input)
        for a in node.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                used |= _used_names(sub)
    return used


def _pointwise(node: Any) -> bool:
    return (
        set(_attr(node, "kernel_shape", [1])) == {1}
        and _attr(node, "group", 1) == 1
        and set(_attr(node, "strides", [1])) == {1}
        and set(_attr(node, "dilations", [1])) == {1}
        and set(_attr(node, "pads", [0])) == {0}
        and _attr(node, "auto_pad", b"NOTSET") in (b"NOTSET", b"VALID")
    )


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
