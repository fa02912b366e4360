"""What Triton's onnxruntime backend checks when it loads a model, checked without a server.

The backend (onnxruntime_backend r24.10 = 17e5cb23: ``ValidateInputs``/``ValidateOutputs``
in ``src/onnxruntime.cc``, ``CompareDimsSupported`` in ``src/onnxruntime_utils.cc``) refuses
a model whose ``config.pbtxt`` disagrees with the graph:

- the graph's inputs must be exactly the config's non-optional inputs, by count; every config
  input and output must exist in the graph, with the same datatype;
- with ``max_batch_size > 0`` every tensor's first graph dim must be variable (-1), and
  ``optional`` inputs are not allowed;
- input dims are compatible: a variable graph dim accepts any config dim, a fixed one must be
  repeated in the config;
- output dims are compared **exactly**: a variable graph dim must be -1 in the config, a fixed
  one the same size. (The first run of the exported SAM2 graphs failed here: they declared
  symbolic output dims, the configs fixed sizes; see ``export.onnx_utils.set_output_dims``.)

The graph's dims are read from its declarations (what onnxruntime reports for them:
``dim_param`` or an unknown dim is -1), without loading its weights. The embedded server
loading the model for real is the final word; this check gives the same verdict when a
repository is written or derived, listing every mismatch at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from triton_sam.errors import RepositoryError
from triton_sam.repository.config import ModelConfig, model_config_pb2, triton_dtype


def onnx_config_mismatches(config: ModelConfig, onnx_path: str | os.PathLike[str]) -> list[str]:
    """Every reason Triton's onnxruntime backend would refuse ``config`` with this graph.

    Returns:
        One line per mismatch, naming the tensor; empty when the backend would load it.

    Raises:
        RepositoryError: the graph cannot be read.
    """
    inputs, outputs = _graph_io(Path(onnx_path))
    batching = config.max_batch_size > 0
    problems = []
    required = [t for t in config.input if not t.optional]
    if len(inputs) != len(required):
        problems.append(
            f"the graph has {len(inputs)} inputs {sorted(inputs)}, the config "
            f"{len(required)} non-optional ones {[t.name for t in required]}"
        )
    for tensor in config.input:
        if tensor.optional and batching:
            problems.append(f"input {tensor.name!r}: optional inputs need max_batch_size 0")
        problems += _tensor_mismatches("input", tensor, inputs, batching, exact=False)
    for tensor in config.output:
        problems += _tensor_mismatches("output", tensor, outputs, batching, exact=True)
    return problems


def check_onnx_config(config: ModelConfig, onnx_path: str | os.PathLike[str]) -> None:
    """Raise when Triton's onnxruntime backend would refuse ``config`` with this graph.

    Raises:
        RepositoryError: listing every mismatch (see :func:`onnx_config_mismatches`).
    """
    problems = onnx_config_mismatches(config, onnx_path)
    if problems:
        raise RepositoryError(
            f"model {config.name!r}: Triton's onnxruntime backend would refuse its config with "
            f"{onnx_path}:\n  " + "\n  ".join(problems) + "\nGraphs exported by an older "
            "triton-sam declare symbolic output dims: export them again. A model of your own "
            "needs a config that lists its tensors as its graph declares them (configs are "
            "loaded as written, without auto-completion)."
        )


def _tensor_mismatches(
    kind: str,
    tensor: Any,
    graph: dict[str, tuple[str, list[int]]],
    batching: bool,
    *,
    exact: bool,
) -> list[str]:
    declared = graph.get(tensor.name)
    if declared is None:
        return [f"{kind} {tensor.name!r} is not in the graph (it has {sorted(graph)})"]
    dtype, dims = declared
    want = model_config_pb2.DataType.Name(tensor.data_type)
    if dtype != want:
        return [f"{kind} {tensor.name!r}: the graph has {dtype}, the config {want}"]
    config_dims = [-1, *tensor.dims] if batching else list(tensor.dims)
    if not dims:  # a scalar: the backend only takes dims of 1 for it
        ok = all(d == 1 for d in tensor.dims)
    elif batching and dims[0] != -1:
        return [f"{kind} {tensor.name!r}: batch dim fixed to {dims[0]} in the graph {dims}, "
                "but max_batch_size > 0 needs it variable"]  # fmt: skip
    else:
        ok = len(dims) == len(config_dims) and all(
            g == c if (exact or g != -1) else True for g, c in zip(dims, config_dims, strict=True)
        )
    if ok:
        return []
    rule = "must equal" if exact else "must fit"
    return [f"{kind} {tensor.name!r}: the graph declares {dims}, the config {config_dims} ({rule})"]


def _graph_io(path: Path) -> tuple[dict[str, tuple[str, list[int]]], ...]:
    """(inputs, outputs): name -> (Triton datatype, dims with -1 for variable ones)."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError, OSError...
        raise RepositoryError(f"{path}: not a readable ONNX model: {e}") from e
    initializers = {t.name for t in model.graph.initializer}

    def describe(value: Any) -> tuple[str, list[int]]:
        tensor = value.type.tensor_type
        if tensor.elem_type == onnx.TensorProto.STRING:
            dtype = "TYPE_STRING"
        else:
            dtype = triton_dtype(tensor_dtype_to_np_dtype(tensor.elem_type).name)
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        return dtype, dims

    # Initializers listed as graph inputs (older IR) are overridable, not required inputs.
    inputs = {v.name: describe(v) for v in model.graph.input if v.name not in initializers}
    outputs = {v.name: describe(v) for v in model.graph.output}
    return inputs, outputs
