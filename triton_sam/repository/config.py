"""Render Triton ``config.pbtxt`` files from a family's graphs, for one of two targets.

A family is a declared list of graphs (``FamilySpec.graphs``, ``ConceptFamilySpec.graphs``,
the tracker's video graphs): each a ``GraphSpec`` (role, model name, tensor contract,
batching), and every one is rendered by :func:`graph_config`, however many a family has.

- ``onnxruntime``: the production target (the NGC GPU container; ``docker compose``):
  ``platform: "onnxruntime_onnx"`` on ``KIND_GPU`` instances, optionally through ONNX
  Runtime's TensorRT execution provider in FP16. The embedded server runs the same configs
  on Triton's onnxruntime backend built for CPU, through :func:`to_cpu_twin`.
- ``python``: a fallback for an embedded server without that backend: a python-backend model
  (``serving/runner_model.py``) runs ``model.onnx`` with onnxruntime (see :func:`to_python_target`).

Configs are built as Triton's own protobuf (``model_config_pb2.ModelConfig``) and written with
``text_format``, never from string templates, so what we write is what Triton parses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from triton_sam.errors import InputValidationError, RepositoryError
from triton_sam.models.spec import Batching, FamilySpec, GraphSpec, TensorSpec
from triton_sam.repository.backend_checks import (
    INTRA_OP_THREADS_PARAM,
    ORT_INTRA_OP_PARAM,
    check_accelerators,
    check_onnxruntime_parameters,
)
from triton_sam.repository.checks import check_choice, check_int, check_model_name
from triton_sam.repository.moved_names import moved_name
from triton_sam.serving import bounds, protocol
from triton_sam.serving.protocol import runner as runner_protocol
from triton_sam.serving.protocol.settings import to_parameters

Target = Literal["onnxruntime", "python"]
InstanceKind = Literal["cpu", "gpu"]
TARGETS: tuple[str, ...] = get_args(Target)
# The sets of serving bounds RepositoryOptions holds (encoder_*, decoder_*); a graph names one.
BATCHINGS: tuple[str, ...] = get_args(Batching)

ModelConfig = model_config_pb2.ModelConfig

ONNX_FILENAME = "model.onnx"
# Keys of the config ``parameters`` that runner_model.py reads (serving/protocol/runner.py).
ONNX_FILE_PARAM = runner_protocol.PARAM_ONNX_FILE


_TRITON_TYPES = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
}
_KINDS = {
    "cpu": model_config_pb2.ModelInstanceGroup.KIND_CPU,
    "gpu": model_config_pb2.ModelInstanceGroup.KIND_GPU,
}


@dataclass(frozen=True)
class RepositoryOptions:
    """How a family's graphs are configured in the repository.

    Attributes:
        target: ``"onnxruntime"`` (NGC GPU container) or ``"python"`` (embedded server).
        encoder_max_batch_size: Triton ``max_batch_size`` of the encoder and of every graph
            served like it (``GraphSpec.batching == "encoder"``: images per run).
        decoder_max_batch_size: same for the decoder and graphs served like it (prompts per
            run). At most ``GRAPH_MAX_BATCH_POINTS / MAX_POINTS`` (16): the decoder graphs
            refuse a batch of more prompt points than ``GRAPH_MAX_BATCH_POINTS``
            (``serving.bounds``), and a full batch of the largest requests the clients send
            must fit, or Triton's dynamic batcher would form batches the graph refuses.
        instance_count: model instances per device.
        instance_kind: ``"gpu"`` or ``"cpu"``; None picks the target's default
            (GPU for onnxruntime, CPU for python; python on ``"gpu"`` uses ORT's CUDA provider).
        max_queue_delay_us: how long the dynamic batcher waits to fill a batch.
        tensorrt_fp16: run the onnxruntime target through ORT's TensorRT provider in FP16.
        trt_engine_cache_path: where TensorRT engines are cached, inside the container; mount
            a volume there to keep engines (minutes to build) across restarts.
        warmup: have Triton run one zero-filled batch-1 request per model at load time.
        intra_op_threads: onnxruntime intra-op threads per instance; 0 keeps ORT's default.
        encoder_max_queue_size / decoder_max_queue_size: requests a model's queue holds;
            beyond it Triton rejects new ones at once ("Exceeds maximum queue size": the
            clients raise ``ServerOverloadedError``) instead of letting them pile up.
            Each queued request holds its tensors (a SAM2 decoder request carries ~16 MiB of
            embeddings), so this also bounds the server's memory. 0 = unbounded.
        encoder_queue_timeout_us / decoder_queue_timeout_us: longest wait in the queue
            before Triton rejects the request (a backstop; clients may ask for less per
            request, ``allow_timeout_override``). 0 = no timeout.
    """

    target: Target = "onnxruntime"
    encoder_max_batch_size: int = 4
    decoder_max_batch_size: int = 16
    instance_count: int = 1
    instance_kind: InstanceKind | None = None
    max_queue_delay_us: int = 100
    tensorrt_fp16: bool = False
    trt_engine_cache_path: str = "/tmp/triton_sam_trt_cache"
    warmup: bool = False
    intra_op_threads: int = 0
    encoder_max_queue_size: int = 16
    decoder_max_queue_size: int = 64
    encoder_queue_timeout_us: int = 60_000_000
    decoder_queue_timeout_us: int = 10_000_000

    def __post_init__(self) -> None:
        check_choice("target", self.target, TARGETS)
        check_choice("instance_kind", self.instance_kind, ("cpu", "gpu", None))
        for field in ("encoder_max_batch_size", "decoder_max_batch_size", "instance_count"):
            check_int(field, getattr(self, field), minimum=1)
        most = bounds.GRAPH_MAX_BATCH_POINTS // bounds.MAX_POINTS
        if self.decoder_max_batch_size > most:
            raise InputValidationError(
                "decoder_max_batch_size",
                f"got {self.decoder_max_batch_size}, expected at most {most}: the decoder "
                f"graphs refuse a batch of more than {bounds.GRAPH_MAX_BATCH_POINTS} prompt "
                f"points, and a full batch of {bounds.MAX_POINTS}-point requests must fit",
            )
        check_int("max_queue_delay_us", self.max_queue_delay_us, minimum=0)
        check_int("intra_op_threads", self.intra_op_threads, minimum=0)
        for batching in BATCHINGS:
            for bound in ("max_queue_size", "queue_timeout_us"):
                field = f"{batching}_{bound}"
                check_int(field, getattr(self, field), minimum=0)
        if self.tensorrt_fp16 and self.target != "onnxruntime":
            raise InputValidationError(
                "tensorrt_fp16",
                f"TensorRT runs only in the 'onnxruntime' target, got target={self.target!r}",
            )
        if self.tensorrt_fp16 and not self.trt_engine_cache_path:
            raise InputValidationError("trt_engine_cache_path", "empty; expected a directory")

    @property
    def kind(self) -> InstanceKind:
        """The instance kind actually used (the explicit one, else the target's default)."""
        if self.instance_kind is not None:
            return self.instance_kind
        return "gpu" if self.target == "onnxruntime" else "cpu"

    def max_batch_size(self, batching: Batching) -> int:
        """``max_batch_size`` of the graphs served with ``batching``'s bounds."""
        check_choice("batching", batching, BATCHINGS)
        return getattr(self, f"{batching}_max_batch_size")

    def bounds(self, batching: Batching) -> tuple[int, int, int]:
        """``(max_batch_size, max_queue_size, queue_timeout_us)`` of ``batching``."""
        return (
            self.max_batch_size(batching),
            getattr(self, f"{batching}_max_queue_size"),
            getattr(self, f"{batching}_queue_timeout_us"),
        )


def triton_dtype(dtype: str) -> str:
    """Map a numpy dtype name to Triton's config enum name (``"float32"`` -> ``"TYPE_FP32"``).

    Raises:
        InputValidationError: a dtype Triton tensors cannot carry in this toolkit.
    """
    try:
        return _TRITON_TYPES[dtype]
    except KeyError:
        raise InputValidationError(
            "dtype", f"got {dtype!r}, expected one of {sorted(_TRITON_TYPES)}"
        ) from None


def family_graph(family: FamilySpec, role: str) -> GraphSpec:
    """The graph of ``family`` with ``role`` (``"encoder"``, ``"decoder"``...).

    Raises:
        InputValidationError: ``family`` has no such graph.
    """
    graphs = {g.role: g for g in family.graphs}
    check_choice("graph", role, tuple(graphs))
    return graphs[role]


def default_model_name(family: FamilySpec, graph: str) -> str:
    """The Triton model name of ``family``'s graph ``graph`` (``family.encoder_model``...)."""
    return family_graph(family, graph).model


def build_config(
    family: FamilySpec, graph: str, options: RepositoryOptions, name: str | None = None
) -> ModelConfig:
    """Build the Triton model config of one graph of ``family`` as a protobuf message.

    Args:
        family: the family spec (tensor names, dtypes and per-item shapes).
        graph: the graph's role in ``family.graphs`` (``"encoder"`` or ``"decoder"``).
        options: target and serving options.
        name: Triton model name; defaults to the graph's (``family.encoder_model``...).

    Returns:
        A ``model_config_pb2.ModelConfig``; dims exclude the batch dim (``max_batch_size`` > 0).

    Raises:
        InputValidationError: unknown graph, bad name or an unsupported dtype in the spec.
    """
    return graph_config(family_graph(family, graph), options, name=name)


def graph_config(
    graph: GraphSpec,
    options: RepositoryOptions,
    *,
    name: str | None = None,
    max_batch_size: int | None = None,
    max_queue_size: int = 0,
    queue_timeout_us: int = 0,
) -> ModelConfig:
    """The config of one declared graph of any family: target, instance group, dynamic
    batching, queue policy, TensorRT, warmup.

    Args:
        graph: its contract (per item, without the batch dim); ``graph.batching`` picks its
            batch size and queue bounds in ``options`` (a heavy per-image graph serves like
            the encoder); without one, the explicit bounds given here apply.
        options: target and serving options.
        name: Triton model name; defaults to ``graph.model``.
        max_batch_size / max_queue_size / queue_timeout_us: explicit bounds (0 = none;
            ``max_batch_size`` is required when ``graph.batching`` is None).

    Raises:
        InputValidationError: a bad name, batch size or dtype.
    """
    name = graph.model if name is None else name
    check_model_name(name)
    if graph.batching is not None:
        max_batch_size, max_queue_size, queue_timeout_us = options.bounds(graph.batching)
    check_int("max_batch_size", max_batch_size, minimum=1)
    config = ModelConfig(name=name, max_batch_size=max_batch_size)
    config.input.extend(tensor_message(t, model_config_pb2.ModelInput) for t in graph.inputs)
    config.output.extend(tensor_message(t, model_config_pb2.ModelOutput) for t in graph.outputs)
    config.instance_group.add(kind=_KINDS[options.kind], count=options.instance_count)
    # Triton drops a cancelled request still in the queue only for models with a dynamic
    # batcher; the default scheduler hands requests straight to the backend. Speculative
    # clients depend on this, so every model gets one.
    config.dynamic_batching.max_queue_delay_microseconds = options.max_queue_delay_us
    _apply_queue_policy(config, max_queue_size, queue_timeout_us)
    if options.target == "onnxruntime":
        _set_onnxruntime(config, options)
        check_accelerators(config)
        check_onnxruntime_parameters(config)
    else:
        _set_python(config, options)
    if options.warmup:
        _add_warmup(config, graph.inputs)
    return config


def render_config(
    family: FamilySpec, graph: str, options: RepositoryOptions, name: str | None = None
) -> str:
    """Render the ``config.pbtxt`` text of one graph of ``family``; see :func:`build_config`."""
    return config_to_text(build_config(family, graph, options, name))


def config_to_text(config: ModelConfig) -> str:
    """Serialise a model config to protobuf text format (what Triton reads)."""
    return text_format.MessageToString(config)


def set_parameters(config: ModelConfig, settings: object, *, kind: str) -> None:
    """Write a settings dataclass into ``config.parameters``, headed by the model ``kind``:
    what the model's ``initialize`` reads back (``serving.protocol.settings``)."""
    for key, value in to_parameters(settings, kind=kind).items():
        config.parameters[key].string_value = value


def parse_config(text_or_path: str | os.PathLike[str]) -> ModelConfig:
    """Read a ``config.pbtxt`` back into a ``ModelConfig``.

    Args:
        text_or_path: a path (``Path``, or a one-line ``str`` naming an existing file) or the
            config text itself.

    Raises:
        RepositoryError: the file cannot be read or is not a valid model config.
    """
    source, text = _read_source(text_or_path)
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as e:
        raise RepositoryError(f"{source}: not a valid Triton model config: {e}") from e


def model_kind(config: ModelConfig) -> str | None:
    """The kind a triton_sam python-backend model declares (``protocol.KINDS``), else None
    (an ONNX graph, or its python-target runner)."""
    if protocol.KIND_PARAM not in config.parameters:
        return None
    return config.parameters[protocol.KIND_PARAM].string_value


def tensor_message(spec: TensorSpec, message: type) -> object:
    return message(name=spec.name, data_type=triton_dtype(spec.dtype), dims=list(spec.shape))


def _apply_queue_policy(config: ModelConfig, size: int, timeout_us: int) -> None:
    if not size and not timeout_us:
        return
    policy = config.dynamic_batching.default_queue_policy
    policy.timeout_action = model_config_pb2.ModelQueuePolicy.REJECT
    policy.allow_timeout_override = True
    if size:
        policy.max_queue_size = size
    if timeout_us:
        policy.default_timeout_microseconds = timeout_us


def _set_onnxruntime(config: ModelConfig, options: RepositoryOptions) -> None:
    config.platform = "onnxruntime_onnx"
    config.default_model_filename = ONNX_FILENAME
    if options.intra_op_threads:
        config.parameters[ORT_INTRA_OP_PARAM].string_value = str(options.intra_op_threads)
    if options.tensorrt_fp16:
        trt = config.optimization.execution_accelerators.gpu_execution_accelerator.add()
        trt.name = "tensorrt"
        trt.parameters["precision_mode"] = "FP16"
        # Building engines takes minutes for the encoder; cache them across loads.
        trt.parameters["trt_engine_cache_enable"] = "true"
        trt.parameters["trt_engine_cache_path"] = options.trt_engine_cache_path


def _set_python(
    config: ModelConfig, options: RepositoryOptions, *, onnx_file: str = ONNX_FILENAME
) -> None:
    config.backend = "python"
    config.parameters[runner_protocol.PARAM_KIND].string_value = runner_protocol.KIND
    config.parameters[ONNX_FILE_PARAM].string_value = onnx_file
    if options.intra_op_threads:
        config.parameters[INTRA_OP_THREADS_PARAM].string_value = str(options.intra_op_threads)


def _add_warmup(config: ModelConfig, inputs: tuple[TensorSpec, ...]) -> None:
    warmup = config.model_warmup.add(name="zeros_batch1", batch_size=1)
    for t in inputs:
        # Warmup needs concrete dims: a variable dim (-1, e.g. the number of points) gets 1.
        dims = [d if d > 0 else 1 for d in t.shape]
        warmup.inputs[t.name].CopyFrom(
            model_config_pb2.ModelWarmup.Input(
                data_type=triton_dtype(t.dtype), dims=dims, zero_data=True
            )
        )


def _read_source(text_or_path: str | os.PathLike[str]) -> tuple[str, str]:
    is_path = isinstance(text_or_path, os.PathLike) or (
        "\n" not in text_or_path and Path(text_or_path).is_file()
    )
    if not is_path:
        return "config text", str(text_or_path)
    path = Path(text_or_path)
    try:
        return str(path), path.read_text()
    except OSError as e:
        raise RepositoryError(f"{path}: cannot read model config: {e.strerror or e}") from e


# The CPU-twin policy and the backend's rules moved to modules of their own (cpu_twin imports
# this one): their names stay importable from here.
def __getattr__(name: str) -> object:
    from triton_sam.repository import backend_checks, cpu_twin

    return moved_name(__name__, name, cpu_twin, backend_checks)
