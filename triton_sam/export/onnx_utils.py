"""Family-independent ONNX helpers: export, check against torch, fp16, external data."""

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


@dataclass(frozen=True)
class Tolerance:
    """Element-wise check ``|onnx - torch| <= atol + rtol * |torch|`` (numpy.isclose)."""

    atol: float
    rtol: float


# fp32: ORT and torch run the same fp32 kernels up to reassociation; 1e-4 is ~100x the error
# measured on SAM2.1-tiny (3.5e-6 on encoder features of magnitude ~3).
FP32_TOLERANCE = Tolerance(atol=1e-4, rtol=1e-4)
# fp16 weights and activations carry ~3 significant digits; errors accumulate over the depth
# of the encoder, so the check is only a guard against a broken conversion.
FP16_TOLERANCE = Tolerance(atol=5e-2, rtol=5e-2)


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
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(path), load_external_data=True)
    had_external = bool(external_data_files(path))
    model16 = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=True)
    if had_external:
        onnx.save_model(
            model16,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.stem + EXTERNAL_DATA_SUFFIX,
        )
    else:
        onnx.save_model(model16, str(path))


def set_output_dims(path: Path, outputs: Sequence[TensorSpec]) -> None:
    """Declare fixed per-item output sizes in the graph's outputs, in place.

    Triton's onnxruntime backend compares each output's config ``dims`` with the shape the
    graph declares exactly, and the TorchScript exporter leaves most non-batch output dims
    symbolic. Dim 0 stays the symbolic batch and a ``-1`` stays symbolic; only declarations
    change (no weights are rewritten), and ``verify_graph`` then checks the real shapes.

    Raises:
        ExportError: the graph's outputs differ from ``outputs`` by name or rank, or a fixed
            size disagrees (all listed at once).
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    declared = {value.name: value for value in model.graph.output}
    problems = []
    if set(declared) != {t.name for t in outputs}:
        problems.append(
            f"outputs are {sorted(declared)}, expected {sorted(t.name for t in outputs)}"
        )
    for spec in outputs:
        value = declared.get(spec.name)
        if value is None:
            continue
        dims = list(value.type.tensor_type.shape.dim)
        if len(dims) != 1 + len(spec.shape):
            problems.append(f"{spec.name} has rank {len(dims)}, expected 1 + {len(spec.shape)}")
            continue
        for i, (dim, size) in enumerate(zip(dims[1:], spec.shape, strict=True), start=1):
            fixed = dim.dim_value if dim.HasField("dim_value") else None
            if size >= 0 and fixed not in (None, size):
                problems.append(f"{spec.name} dim {i} is {fixed}, expected {size}")
            elif size >= 0:
                dim.dim_value = size  # clears dim_param (a oneof)
    if problems:
        raise ExportError(f"{path.name}: cannot declare the output dims: " + "; ".join(problems))
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        onnx.save_model(model, str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def run_onnx(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an ONNX file once on CPU with onnxruntime and return outputs by name."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds)), strict=True))


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
        if got.shape != ref.shape:
            mismatches.append(f"{label}{name}: shape {got.shape}, expected {ref.shape}")
            continue
        ok = np.isclose(got, ref, atol=tolerance.atol, rtol=tolerance.rtol)
        if not ok.all():
            err = np.abs(got.astype(np.float64) - ref)
            mismatches.append(
                f"{label}{name}: {int((~ok).sum())}/{ok.size} elements outside "
                f"atol={tolerance.atol} rtol={tolerance.rtol} (max abs error {err.max():.3g})"
            )
    return mismatches


def verify_graph(
    path: Path,
    cases: Sequence[tuple[str, Mapping[str, np.ndarray], Mapping[str, np.ndarray]]],
    tolerance: Tolerance,
) -> dict[str, float]:
    """Run each ``(label, feeds, expected)`` case through ORT; raise once listing all mismatches.

    Returns:
        The max absolute error per output over all cases (for reports).

    Raises:
        ExportValidationError: one or more outputs of one or more cases are out of tolerance.
    """
    mismatches: list[str] = []
    max_err: dict[str, float] = {}
    for label, feeds, expected in cases:
        actual = run_onnx(path, feeds)
        mismatches += compare_outputs(actual, expected, tolerance, label=f"[{label}] ")
        for name, ref in expected.items():
            if name in actual and actual[name].shape == ref.shape:
                err = float(np.abs(actual[name].astype(np.float64) - ref).max(initial=0.0))
                max_err[name] = max(max_err.get(name, 0.0), err)
    if mismatches:
        raise ExportValidationError(path.name, mismatches)
    return max_err
