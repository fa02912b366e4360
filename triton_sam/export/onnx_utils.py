"""Family-independent ONNX helpers: export, static output dims, check against torch, fp16,
external data."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from triton_sam.errors import ExportError, ExportValidationError

if TYPE_CHECKING:
    import torch

    from triton_sam.models.spec import TensorSpec

# ONNX protobufs cannot exceed 2 GiB; above this the weights go to a sidecar file.
_PROTOBUF_LIMIT_BYTES = 2**31 - 1
EXTERNAL_DATA_SUFFIX = ".onnx_data"


# float32's machine epsilon (2^-23): the spacing of floats in [1, 2), the unit of the bounds.
EPS_FP32 = float(np.finfo(np.float32).eps)
EPS_FP16 = float(np.finfo(np.float16).eps)  # 2^-10


@dataclass(frozen=True)
class Tolerance:
    """How far an ONNX output may be from its torch reference, relative to the reference's
    own magnitude (one source of truth for every export check).

    Two bounds, both scaled by the tensor: ``max|onnx - torch| <= max_rel * max(max|torch|,
    floor)`` and ``rms(onnx - torch) <= rms_rel * max(rms(torch), floor)``. A float32 rounding
    error is relative to the magnitude of the values summed, not to the element it lands in:
    the same graph with another summation order moves every output by a few ulps of the
    tensor's scale, so an element-wise ``atol + rtol * |x|`` trips on the elements near 0 of a
    large-valued tensor (a fine-tuned checkpoint with larger activations) though the export is
    exact up to rounding. The max bound, loose, catches a bug confined to a few elements; the
    rms bound, tight because independent roundings average out, catches a small error spread
    over every element.

    ``floor`` is the scale below which the bounds stop shrinking: SAM's activations are
    normalised (LayerNorm, GroupNorm) to order 1, so an output that is small because terms of
    order 1 cancel (a single object-score logit of 0.02) still carries their rounding.

    Attributes:
        max_rel: bound on the largest absolute error, as a fraction of the scale.
        rms_rel: bound on the root-mean-square error, as a fraction of the rms scale.
        unit: the epsilon the fractions are stated in, for messages (float32's, fp16's, 1).
        floor: the smallest scale (see above).
    """

    max_rel: float
    rms_rel: float
    unit: float = 1.0
    floor: float = 1.0

    @classmethod
    def ulps(cls, max_ulps: float, rms_ulps: float, eps: float = EPS_FP32) -> Tolerance:
        """Bounds in units of ``eps`` (float32's by default) of the tensor's magnitude."""
        return cls(max_ulps * eps, rms_ulps * eps, eps)

    def bounds(self, reference: np.ndarray) -> tuple[float, float]:
        """(bound on the max abs error, bound on the rms error) for this reference."""
        ref = np.abs(np.asarray(reference, np.float64))
        rms = float(np.sqrt(np.mean(ref * ref))) if ref.size else 0.0
        largest = float(ref.max(initial=0.0))
        return self.max_rel * max(largest, self.floor), self.rms_rel * max(rms, self.floor)

    def mismatch(self, actual: np.ndarray, reference: np.ndarray) -> str | None:
        """Why ``actual`` is out of tolerance of ``reference`` (None when it is within).

        NaN or inf anywhere in either is a mismatch (their comparisons are false)."""
        if actual.shape != reference.shape:
            return f"shape {actual.shape}, expected {reference.shape}"
        err = np.abs(np.asarray(actual, np.float64) - np.asarray(reference, np.float64))
        max_bound, rms_bound = self.bounds(reference)
        worst = float(err.max(initial=0.0))
        rms = float(np.sqrt(np.mean(err * err))) if err.size else 0.0
        found = []
        if not worst <= max_bound:
            outside = int((~(err <= max_bound)).sum())
            found.append(
                f"max abs error {worst:.3g} > {max_bound:.3g} ({outside}/{err.size} elements; "
                f"bound {self._in_units(self.max_rel)} of max|torch|)"
            )
        if not rms <= rms_bound:
            found.append(
                f"rms error {rms:.3g} > {rms_bound:.3g} "
                f"(bound {self._in_units(self.rms_rel)} of rms(torch))"
            )
        return "; ".join(found) or None

    def describe(self) -> str:
        """The bounds in words, for reports."""
        return (
            f"max error <= {self._in_units(self.max_rel)} of max|torch|, "
            f"rms error <= {self._in_units(self.rms_rel)} of rms(torch) "
            f"(scales of at least {self.floor:g})"
        )

    def _in_units(self, fraction: float) -> str:
        if self.unit == EPS_FP32:
            return f"{fraction / self.unit:g} float32 ulps"
        if self.unit == EPS_FP16:
            return f"{fraction / self.unit:g} fp16 ulps"
        return f"{fraction:g}"


# fp32: ORT and torch run the same float32 math up to the order of sums (fused kernels, other
# blockings). Rounding a reordered sum of n terms moves it by ~sqrt(n) ulps of the terms'
# magnitude (independent roundings); the deepest reductions here (attention over 64x64 tokens,
# 12 Hiera blocks) make ~64 ulps of the tensor's scale a plausible single-element drift.
# Measured on SAM2.1-tiny's five video graphs, seeds 0-5 (tests/export/test_export_gates.py
# for the encoder): largest error 11 ulps of max|torch| (encoder features), 30 ulps of a
# single object-score logit's own magnitude (0.02: within the floor of 1), rms errors <= 9 ulps
# of rms(torch). max 512 ulps (6.1e-5 of the scale) is 8x that plausible drift and ~45x what
# is measured; rms 64 ulps (7.6e-6 of the scale) is 7x the measured rms. A bug is orders
# above both: a weight off by 1% is ~84,000 ulps, a dropped bias or residual is of the order
# of the tensor itself (tests/unit/test_export_tolerance.py plants each).
FP32_TOLERANCE = Tolerance.ulps(max_ulps=512, rms_ulps=64)
# fp16 weights and activations carry ~3 significant digits (eps 2^-10); errors accumulate over
# the depth of the encoder, so the check is only a guard against a broken conversion: 64 fp16
# ulps of the scale (6%) on the worst element, 16 (1.6%) in rms.
FP16_TOLERANCE = Tolerance.ulps(max_ulps=64, rms_ulps=16, eps=EPS_FP16)


def export_graph(
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    opset: int,
    external_data: bool = False,
) -> Path:
    """Export ``module(*args)`` to ``path`` with the TorchScript-based exporter.

    The TorchScript exporter (``dynamo=False``) is used because it keeps the dynamic batch
    and point dimensions symbolic for these models; the dynamo exporter specialises some of
    them. ``external_data`` forces weights into ``<name>.onnx_data``; above 2 GiB (SAM1
    ViT-H) they always go there.

    Returns:
        The path of the written ``.onnx`` file (its sidecar, if any, is
        ``<stem>.onnx_data`` beside it).

    Raises:
        ExportError: the exporter failed; the message carries its error.
    """
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    # Above 2 GiB the TorchScript exporter writes every initializer to its own file beside
    # the graph, named after the weight (hundreds for ViT-H). Export into a private
    # directory, then keep only <stem>.onnx (+ one <stem>.onnx_data) at ``path``.
    with tempfile.TemporaryDirectory(prefix=f".{path.stem}.export-", dir=path.parent) as tmp:
        raw = Path(tmp) / path.name
        try:
            with warnings.catch_warnings(), torch.no_grad():
                # Tracer warnings about Python-side shape arithmetic are expected for SAM.
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    module.eval(),
                    args,
                    str(raw),
                    input_names=list(input_names),
                    output_names=list(output_names),
                    dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()},
                    opset_version=opset,
                    do_constant_folding=True,
                    dynamo=False,
                )
        except Exception as e:  # the exporter raises many unrelated types
            raise ExportError(f"torch.onnx.export failed for {path.name}: {e}") from e
        sidecar = path.with_name(path.stem + EXTERNAL_DATA_SUFFIX)
        sidecar.unlink(missing_ok=True)  # a stale one from an earlier export
        if external_data or raw.stat().st_size > _PROTOBUF_LIMIT_BYTES or external_data_files(raw):
            save_with_external_data(raw, dest=path)
        else:
            os.replace(raw, path)
    return path


def save_with_external_data(path: Path, *, dest: Path | None = None) -> Path:
    """Save the model at ``path`` (weights inline or in any sidecars) to ``dest`` (default:
    ``path`` itself) with all weights in one ``<dest stem>.onnx_data`` beside it.

    Returns:
        The path of the sidecar.
    """
    import onnx

    dest = path if dest is None else dest
    model = onnx.load(str(path), load_external_data=True)
    location = dest.stem + EXTERNAL_DATA_SUFFIX
    (dest.parent / location).unlink(missing_ok=True)
    onnx.save_model(
        model,
        str(dest),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=1024,
    )
    return dest.parent / location


def external_data_files(path: Path) -> list[Path]:
    """Sidecar weight files an ONNX model refers to (empty when self-contained).

    Looks at initializers and at tensors held by node attributes, subgraphs included;
    the weights themselves are not loaded.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    locations = set()
    for tensor in _all_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            locations.add({e.key: e.value for e in tensor.external_data}["location"])
    return [path.parent / loc for loc in sorted(locations)]


def _all_tensors(graph: Any) -> Any:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _all_tensors(sub)


def convert_to_fp16(path: Path) -> None:
    """Convert weights and compute of an ONNX model to fp16 in place, keeping fp32 I/O.

    Inputs and outputs stay float32 so the client and the Triton config do not change with
    precision; the casts at the boundary are negligible next to the network.
    """
    import onnx
    from onnx.shape_inference import infer_shapes_path
    from onnxruntime.transformers.float16 import convert_float_to_float16

    had_external = bool(external_data_files(path))
    # The converter keeps ops onnxruntime has no fp16 kernel for (Range, CumSum, ...) in fp32
    # and casts around them, but only where it knows value types: without shape inference a
    # Constant/Cast feeding Range became fp16 and the SAM2 encoder failed to load ("Type
    # 'tensor(float16)' of input parameter ... of operator (Range)"). Inference runs on the
    # file (models above 2 GiB included); the converter then reads the types from value_info.
    inferred = path.with_name(f".{path.stem}.inferred.onnx")
    try:
        infer_shapes_path(str(path), str(inferred))
        model = onnx.load(str(inferred), load_external_data=True)
    finally:
        inferred.unlink(missing_ok=True)
    model16 = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=True)
    save_model(model16, path, external=had_external)


def save_model(model: Any, path: Path, *, external: bool) -> None:
    """Save ``model`` at ``path``, its weights in one ``<stem>.onnx_data`` sidecar when
    ``external``, else inline."""
    import onnx

    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.stem + EXTERNAL_DATA_SUFFIX,
        )
    else:
        onnx.save_model(model, str(path))


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
    import numpy as np
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


def run_onnx(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an ONNX file once on CPU with onnxruntime and return outputs by name."""
    return _run(_session(path), feeds)


def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _run(session: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds)), strict=True))


def declared_shape_mismatches(
    session: Any, actual: Mapping[str, np.ndarray], *, label: str = ""
) -> list[str]:
    """Outputs whose computed shape contradicts a fixed dim the graph declares.

    onnxruntime only warns about such a contradiction; Triton sizes and checks responses
    by the config, which says what the graph declares, so it must be an error here.
    """
    problems = []
    for output in session.get_outputs():
        got = actual.get(output.name)
        if got is None:
            continue
        declared = list(output.shape)
        fixed_ok = len(declared) == got.ndim and all(
            not isinstance(d, int) or d == n for d, n in zip(declared, got.shape, strict=True)
        )
        if not fixed_ok:
            problems.append(
                f"{label}{output.name}: computed shape {got.shape}, the graph declares {declared}"
            )
    return problems


def compare_outputs(
    actual: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    tolerance: Tolerance,
    *,
    label: str = "",
) -> list[str]:
    """Compare every expected output; return one line per mismatch (empty when all match)."""
    mismatches = []
    for name, ref in expected.items():
        got = actual.get(name)
        if got is None:
            mismatches.append(f"{label}{name}: missing from the ONNX outputs")
            continue
        why = tolerance.mismatch(got, ref)
        if why is not None:
            mismatches.append(f"{label}{name}: {why}")
    return mismatches


def verify_graph(
    path: Path,
    cases: Sequence[tuple[str, Mapping[str, np.ndarray], Mapping[str, np.ndarray]]],
    tolerance: Tolerance,
) -> dict[str, float]:
    """Run each ``(label, feeds, expected)`` case through ORT; raise once listing all mismatches
    (values out of tolerance, and computed shapes that contradict the graph's declared dims).

    Returns:
        The max absolute error per output over all cases (for reports).

    Raises:
        ExportValidationError: one or more outputs of one or more cases are out of tolerance.
    """
    mismatches: list[str] = []
    max_err: dict[str, float] = {}
    session = _session(path)
    for label, feeds, expected in cases:
        actual = _run(session, feeds)
        mismatches += compare_outputs(actual, expected, tolerance, label=f"[{label}] ")
        mismatches += declared_shape_mismatches(session, actual, label=f"[{label}] ")
        for name, ref in expected.items():
            if name in actual and actual[name].shape == ref.shape:
                err = float(np.abs(actual[name].astype(np.float64) - ref).max(initial=0.0))
                max_err[name] = max(max_err.get(name, 0.0), err)
    if mismatches:
        raise ExportValidationError(path.name, mismatches)
    return max_err
