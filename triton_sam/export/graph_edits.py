"""Edits to an exported ONNX graph, in place, leaving its weights (and external data) alone:
the declared output dims Triton's onnxruntime backend needs, the bound on prompt points, and
``metadata_props``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from triton_sam.errors import ExportError

if TYPE_CHECKING:
    from triton_sam.models.spec import TensorSpec


def set_output_dims(path: Path, outputs: Sequence[TensorSpec]) -> None:
    """Declare the spec's fixed per-item output sizes in the graph's outputs, in place.

    Why: Triton's onnxruntime backend compares each output's ``dims`` in config.pbtxt with
    the shape the graph declares *exactly* (``CompareDimsSupported(..., compare_exact=true)``
    in onnxruntime_backend r24.10; inputs only need to be compatible). The TorchScript
    exporter leaves most non-batch output dims symbolic (``image_embed`` comes out as
    ``[batch, sym, sym, sym]``), so a config saying ``[256, 64, 64]`` fails to load. The
    sizes come from the spec, the one source the config is rendered from; dim 0 stays the
    symbolic batch and a spec ``-1`` stays symbolic. Only the graph's declarations change
    (no weights are loaded or rewritten); ``verify_graph`` then checks that the computed
    outputs have these shapes.

    Args:
        path: the ``.onnx`` file (weights inline or in sidecars, which are left alone).
        outputs: the graph's outputs as the family spec declares them (per item, no batch).

    Raises:
        ExportError: the graph's outputs differ from ``outputs`` by name or rank, its batch
            dim is fixed, or it declares a fixed size that disagrees with the spec (all
            listed at once).
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    declared = {value.name: value for value in model.graph.output}
    problems = []
    if set(declared) != {t.name for t in outputs}:
        problems.append(
            f"outputs are {sorted(declared)}, the spec says {sorted(t.name for t in outputs)}"
        )
    for spec in outputs:
        value = declared.get(spec.name)
        if value is not None:
            problems += _declare_dims(value.type.tensor_type.shape, spec)
    if problems:
        raise ExportError(
            f"{path.name}: cannot declare the spec's output dims: " + "; ".join(problems)
        )
    _save_graph_only(model, path)


def bound_points(path: Path, name: str, maximum: int, batch_maximum: int) -> None:
    """Make the graph refuse more than ``maximum`` prompt points per batch item, or more than
    ``batch_maximum`` in the whole batch, in input ``name``, in place.

    ``name`` is [B, ..., N, 2]: an item's points are every dim between the batch and the last
    (N, or objects x N); the batch's are B times that. Triton bounds the batch dim
    (``max_batch_size``) but cannot bound a variable dim, so a request sent straight to the
    decoder with 20,000 points would grow its attention maps until the process is killed
    (inside tritonserver on the onnxruntime backend: the whole server); and the attention of
    a batch holds every item's points at once, so the batch is bounded as a whole too. The
    guard is the input's first consumer: ``Reshape(x, shape(x))`` when both counts are within
    bounds (a no-op), else a Reshape to dims of -2, which onnxruntime refuses before any other
    node reads the points, with the node's name in the error:
    ``<name>: at most <maximum> points per item and <batch_maximum> per batch``. Idempotent
    for the same bounds; a graph bounded with others is refused.

    Raises:
        ExportError: the graph has no input ``name``, it is not at least [B, N, 2], or it is
            already bounded with other numbers.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    guard = f"{name}: at most {maximum} points per item and {batch_maximum} per batch"
    existing_guards = [n.name for n in graph.node if n.name.startswith(f"{name}: at most ")]
    if existing_guards == [guard]:
        return
    if existing_guards:
        raise ExportError(f"{path.name}: {name} is already bounded ({existing_guards[0]!r})")
    value = next((i for i in graph.input if i.name == name), None)
    rank = len(value.type.tensor_type.shape.dim) if value is not None else 0
    if rank < 3:
        raise ExportError(f"{path.name}: no input {name!r} of rank >= 3 to bound")
    p = f"{name}__bound_"
    bounded = p + "checked"
    for node in graph.node:
        for k, used in enumerate(node.input):
            if used == name:
                node.input[k] = bounded
    nodes = [
        helper.make_node("Shape", [name], [p + "item_shape"], start=1, end=-1),
        helper.make_node("ReduceProd", [p + "item_shape"], [p + "count"], keepdims=1),
        helper.make_node("Greater", [p + "count", p + "max"], [p + "item_over"]),
        helper.make_node("Shape", [name], [p + "batch_shape"], start=0, end=-1),
        helper.make_node("ReduceProd", [p + "batch_shape"], [p + "total"], keepdims=1),
        helper.make_node("Greater", [p + "total", p + "batch_max"], [p + "batch_over"]),
        helper.make_node("Or", [p + "item_over", p + "batch_over"], [p + "over"]),
        helper.make_node("Shape", [name], [p + "full"]),
        helper.make_node("Where", [p + "over", p + "refused", p + "full"], [p + "target"]),
        helper.make_node("Reshape", [name, p + "target"], [bounded], name=guard),
    ]
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([maximum], np.int64), p + "max"),
            numpy_helper.from_array(np.array([batch_maximum], np.int64), p + "batch_max"),
            numpy_helper.from_array(np.full(rank, -2, np.int64), p + "refused"),
        ]
    )
    existing = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + existing)
    _save_graph_only(model, path)


def _declare_dims(shape: Any, spec: TensorSpec) -> list[str]:
    """Set ``shape`` (an ONNX TensorShapeProto) to [symbolic batch, *spec.shape]."""
    dims = list(shape.dim)
    if len(dims) != 1 + len(spec.shape):
        return [f"{spec.name} has rank {len(dims)}, the spec says 1 + {len(spec.shape)}"]
    if dims[0].HasField("dim_value"):
        return [f"{spec.name}: batch dim is fixed to {dims[0].dim_value}; expected symbolic"]
    problems = []
    for i, (dim, size) in enumerate(zip(dims[1:], spec.shape, strict=True), start=1):
        fixed = dim.dim_value if dim.HasField("dim_value") else None
        if size >= 0 and fixed not in (None, size):
            problems.append(f"{spec.name} dim {i} is {fixed}, the spec says {size}")
        elif size < 0 and fixed is not None:
            problems.append(f"{spec.name} dim {i} is fixed to {fixed}, the spec says variable")
        elif size >= 0:
            dim.dim_value = size  # clears dim_param (a oneof)
    return problems


def _save_graph_only(model: Any, path: Path) -> None:
    """Write ``model`` (loaded without its external data) back to ``path`` atomically.

    Initializers kept in a sidecar stay references to it (same relative location), so only
    the graph file is rewritten.
    """
    import onnx

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        onnx.save_model(model, str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def set_metadata(path: Path, props: Mapping[str, str]) -> None:
    """Write ``props`` into the graph's ``metadata_props`` (replacing equal keys), in place.

    Readable with ``onnxruntime.InferenceSession(path).get_modelmeta().custom_metadata_map``.
    External weights are left where they are (only the graph file is rewritten).
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    kept = [p for p in model.metadata_props if p.key not in props]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in props.items():
        model.metadata_props.add(key=key, value=str(value))
    _save_graph_only(model, path)
