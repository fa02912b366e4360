"""Family-independent ONNX helpers: export, external data, fp16; the graph edits
(:mod:`~triton_sam.export.graph_edits`) and the check against torch
(:mod:`~triton_sam.export.verification`) are importable from here too.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triton_sam.errors import ExportError

if TYPE_CHECKING:
    import torch

from triton_sam.export.graph_edits import (  # noqa: F401 - re-exported: their old home
    bound_points,
    set_metadata,
    set_output_dims,
)
from triton_sam.export.verification import (  # noqa: F401 - re-exported: their old home
    EPS_FP16,
    EPS_FP32,
    FP16_TOLERANCE,
    FP32_TOLERANCE,
    Tolerance,
    compare_outputs,
    declared_shape_mismatches,
    run_onnx,
    verify_graph,
)

# ONNX protobufs cannot exceed 2 GiB; above this the weights go to a sidecar file.
_PROTOBUF_LIMIT_BYTES = 2**31 - 1
EXTERNAL_DATA_SUFFIX = ".onnx_data"


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
