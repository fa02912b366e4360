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
from triton_sam.serving import bounds, protocol
from triton_sam.serving.protocol import runner as runner_protocol

Target = Literal["onnxruntime", "python"]
InstanceKind = Literal["cpu", "gpu"]
TARGETS: tuple[str, ...] = get_args(Target)
# The sets of serving bounds RepositoryOptions holds (encoder_*, decoder_*); a graph names one.
BATCHINGS: tuple[str, ...] = get_args(Batching)

ModelConfig = model_config_pb2.ModelConfig

ONNX_FILENAME = "model.onnx"
# Keys of the config ``parameters`` that runner_model.py reads (serving/protocol/runner.py).
ONNX_FILE_PARAM = runner_protocol.PARAM_ONNX_FILE
INTRA_OP_THREADS_PARAM = runner_protocol.PARAM_INTRA_OP_THREADS
# The onnxruntime backend's own key for the same setting.
ORT_INTRA_OP_PARAM = "intra_op_thread_count"

# Execution-accelerator settings Triton's onnxruntime backend accepts, by name, as its source
# spells them (onnxruntime_backend r24.10 = 17e5cb23, src/onnxruntime.cc,
# ModelInstanceState::ModelInstanceState): any other TensorRT parameter fails the model's load
# with "unknown parameter '<key>' is provided for TensorRT Execution Accelerator", any other
# accelerator name with "unknown Execution Accelerator". Neither can be loaded without a GPU
# (the CPU build compiles that code out), so check_accelerators() checks them statically.
TENSORRT_ACCELERATOR = "tensorrt"  # kTensorRTExecutionAccelerator (backend_common.h)
CUDA_ACCELERATOR = "cuda"
TENSORRT_PARAMS = frozenset(
    {
        "precision_mode",  # FP32 | FP16 | INT8
        "max_workspace_size_bytes",
        "trt_max_partition_iterations",
        "trt_min_subgraph_size",
        "int8_calibration_table_name",
        "int8_use_native_calibration_table",
        "trt_dla_enable",
        "trt_dla_core",
        "trt_engine_cache_enable",
        "trt_engine_cache_path",
        "trt_engine_cache_prefix",
        "trt_dump_subgraphs",
        "trt_force_sequential_engine_build",
        "trt_context_memory_sharing_enable",
        "trt_layer_norm_fp32_fallback",
        "trt_timing_cache_enable",
        "trt_timing_cache_path",
        "trt_force_timing_cache",
        "trt_detailed_build_log",
        "trt_build_heuristics_enable",
        "trt_sparsity_enable",
        "trt_builder_optimization_level",
        "trt_auxiliary_streams",
        "trt_tactic_sources",
        "trt_extra_plugin_lib_paths",
        "trt_profile_min_shapes",
        "trt_profile_max_shapes",
        "trt_profile_opt_shapes",
        "trt_cuda_graph_enable",
        "trt_dump_ep_context_model",
        "trt_ep_context_file_path",
        "trt_ep_context_embed_mode",
    }
)
TENSORRT_PRECISION_MODES = ("FP32", "FP16", "INT8")

# Model-level ``parameters`` the onnxruntime backend reads (same source, ModelState's
# constructor, ModelInstanceState's run options and its CUDA provider setup), with the values
# it parses them into. The backend ignores any other key silently, so a misspelled one (or the
# python runner's ``intra_op_threads``) would leave ORT at its defaults without a word;
# check_onnxruntime_parameters() refuses it instead. Values are strings in the config;
# integers go through std::stoi, booleans through ParseBoolValue (true/false/on/off/1/0,
# any case). ORT's intra-op spinning has no key here: r24.10 cannot turn it off.
_INT, _BOOL, _TEXT = "integer", "boolean", "text"
ORT_MODEL_PARAMS: dict[str, tuple[str, tuple[int, ...] | None]] = {
    "execution_mode": (_INT, (0, 1)),  # 0 sequential, 1 parallel (inter-op pool)
    ORT_INTRA_OP_PARAM: (_INT, None),  # threads per instance; 0 = ORT's default
    "inter_op_thread_count": (_INT, None),
    "enable_mem_arena": (_BOOL, None),
    "enable_mem_pattern": (_BOOL, None),
    "memory.enable_memory_arena_shrinkage": (_TEXT, None),  # e.g. "cpu:0;gpu:0", per run
    # CUDA provider (deprecated spelling; the "cuda" accelerator's parameters replace it)
    "cudnn_conv_algo_search": (_INT, (0, 1, 2)),
    "gpu_mem_limit": (_TEXT, None),
    "arena_extend_strategy": (_INT, (0, 1)),
    "do_copy_in_default_stream": (_TEXT, None),
}
_BOOL_WORDS = ("true", "false", "on", "off", "1", "0")
# optimization { graph { level } }: -1 basic, 1 extended, 2 none; 0 (unset) all. The backend
# maps any other value to "all" without a word.
ORT_GRAPH_LEVELS = (-1, 0, 1, 2)
OPENVINO_ACCELERATOR = "openvino"  # the only cpu_execution_accelerator it knows

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
        _check_choice("target", self.target, TARGETS)
        _check_choice("instance_kind", self.instance_kind, ("cpu", "gpu", None))
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
        _check_choice("batching", batching, BATCHINGS)
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
    _check_choice("graph", role, tuple(graphs))
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


def to_python_target(
    config: ModelConfig, *, instance_kind: InstanceKind = "cpu", onnx_file: str = ONNX_FILENAME
) -> ModelConfig:
    """Turn an ``onnxruntime``-target config into its ``python``-target twin.

    Keeps name, tensors, batching, dynamic batching and warmup; drops what only the
    onnxruntime backend understands (platform, TensorRT accelerators, its parameters).

    Raises:
        RepositoryError: ``config`` is neither an onnxruntime nor a python model.
    """
    if config.backend == "python":
        return config
    if config.platform != "onnxruntime_onnx" and config.backend != "onnxruntime":
        raise RepositoryError(
            f"model {config.name!r}: platform={config.platform!r} backend={config.backend!r}; "
            "expected an onnxruntime or python model"
        )
    twin = ModelConfig()
    twin.CopyFrom(config)
    for field in ("platform", "backend", "optimization", "default_model_filename"):
        twin.ClearField(field)
    twin.parameters.clear()
    count = max((g.count for g in config.instance_group), default=1) or 1
    del twin.instance_group[:]
    twin.instance_group.add(kind=_KINDS[instance_kind], count=count)
    _set_python(twin, RepositoryOptions(target="python"), onnx_file=onnx_file)
    threads = config.parameters.get(ORT_INTRA_OP_PARAM)
    if threads is not None:
        twin.parameters[INTRA_OP_THREADS_PARAM].string_value = threads.string_value
    return twin


def to_cpu_twin(config: ModelConfig) -> ModelConfig:
    """The config of ``config``'s model on a CPU-only host (the embedded server), changed
    mechanically in what a CPU host cannot do and nothing else.

    - ``KIND_GPU`` instance groups become ``KIND_CPU`` with the same count (no ``gpus``);
    - GPU execution accelerators (TensorRT, CUDA) are dropped, and ``optimization`` when
      nothing is left in it.

    Everything else (platform or backend, tensors, batching, queue policy, parameters,
    warmup) is kept, so the embedded server loads the production config itself.

    Raises:
        RepositoryError: an unknown GPU accelerator or TensorRT parameter (see
            :func:`check_accelerators`): the GPU container would refuse it, so it is not
            silently dropped here.
    """
    check_accelerators(config)
    if config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime":
        check_onnxruntime_parameters(config)
    twin = with_cpu_instances(config)
    accelerators = twin.optimization.execution_accelerators
    accelerators.ClearField("gpu_execution_accelerator")
    if not accelerators.ListFields():
        twin.optimization.ClearField("execution_accelerators")
    if not twin.optimization.ListFields():
        twin.ClearField("optimization")
    return twin


def with_cpu_instances(config: ModelConfig) -> ModelConfig:
    """``config`` with its ``KIND_GPU`` instance groups made ``KIND_CPU``, same counts, no
    ``gpus``; nothing else changed (a copy)."""
    twin = ModelConfig()
    twin.CopyFrom(config)
    for group in twin.instance_group:
        if group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU:
            group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
            del group.gpus[:]
    return twin


# At most this many decoder instances on a CPU host: enough for c=4 without one instance per
# core on large hosts, where a click would then run on a single thread.
CPU_DECODER_MAX_INSTANCES = 4
CPU_DECODER_CORES_PER_INSTANCE = 4


def size_cpu_decoder(config: ModelConfig, cores: int) -> ModelConfig:
    """A decoder's CPU twin sized for ``cores`` usable cores: one instance per 4 cores (at
    least 1, at most 4), each with ``cores // instances`` intra-op threads (2 cores: 1 x 2,
    8 cores: 2 x 4, 16 cores: 4 x 4).

    Why: a click is one decoder run, so its latency is set by the threads one run gets;
    concurrent clicks queue for the instance (or run on the next one). Measured on SAM2.1-tiny,
    2 quiet cores, both sizings in one `triton-sam bench click --decoder-sizing 2x1,1x2
    --concurrency 4` run: 1 x 2 threads gave a single session click of 1.20-1.25x in-process
    ORT (2 x 1: 1.88-1.92x, a run on one thread) and 0.58-0.76x ORT's clicks/s at c=4
    (2 x 1: 0.89-0.93x). Interactive latency is what this server is for, so one instance gets
    the cores; past 4 cores a run scales poorly, so more instances (not measured here: no
    host with more than 2 cores). Configs that set ``intra_op_thread_count`` themselves are
    left as they are (a deliberate choice).

    Raises:
        InputValidationError: ``cores`` < 1.
    """
    check_int("cores", cores, minimum=1)
    if ORT_INTRA_OP_PARAM in config.parameters:
        return config
    instances = _decoder_instances(cores)
    return _cpu_sized(config, instances, max(1, cores // instances))


def _decoder_instances(cores: int) -> int:
    """:func:`size_cpu_decoder`'s instance count: one per 4 cores, 1 to 4."""
    return max(1, min(cores // CPU_DECODER_CORES_PER_INSTANCE, CPU_DECODER_MAX_INSTANCES))


def _cpu_sized(config: ModelConfig, instances: int, threads: int) -> ModelConfig:
    """A copy of ``config`` with ``instances`` per CPU instance group of ``threads``
    intra-op threads each."""
    sized = ModelConfig()
    sized.CopyFrom(config)
    for group in sized.instance_group:
        if group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU:
            group.count = instances
    sized.parameters[ORT_INTRA_OP_PARAM].string_value = str(threads)
    return sized


# What a CPU host admits of a session model's embeds (``writer.embedded_repository`` lowers
# the production values to these): one image encoded at a time, since one encode already
# takes every core (two at once run as a batch of 2: no faster per image, twice the memory),
# and the production line of 16: a lab of 16 users opening images at once each gets an
# embedding within about 16 encodes, where a line of 4 refused 11 of them (the replicas test's
# 16 sessions); each waiting embed holds only its request.
CPU_MAX_CONCURRENT_EMBEDS = 1
CPU_MAX_WAITING_EMBEDS = 16
# The batch a session model's encoder runs on a CPU host. Onnxruntime's CPU memory arena
# keeps its high-water mark and extends by doubling: measured on SAM2.1-tiny (2 cores, one
# server, interleaved), batch-4 runs grew the server by 2.0 GiB, and again by 1.7 GiB on the
# next ones, while batch-1 runs settle after the first; a batch costs a CPU as much per image
# as single runs (9.6 against 8.7 s per image). Turning the arena off instead bounds it too
# (+0.05 GiB on the second batch-4 run) but made each image 1.6x slower (14.1 s).
CPU_ENCODER_MAX_BATCH_SIZE = 1


def bounded_cpu_encoder(config: ModelConfig) -> ModelConfig:
    """A session model's encoder on a CPU host: ``max_batch_size``
    :data:`CPU_ENCODER_MAX_BATCH_SIZE`, so onnxruntime's arena peaks at what one image
    needs (a larger batch, from any client, is refused as a shape error), and the arena
    shrinks after each run (:data:`CPU_ARENA_SHRINKAGE`): the activations of an encode are
    many times the weights (SAM1 ViT-B: ~3.5 GB against 0.4 GB), and with the arena kept, an
    idle server held them for good from its warm-up on (two copies of the encoder, this one
    and the background one, made a ViT-B server 8 GB resident). GPU configs are not touched:
    there the CUDA arena is bounded by ``max_batch_size`` already and batches are what make
    a GPU fast."""
    bounded = ModelConfig()
    bounded.CopyFrom(config)
    if not 0 < config.max_batch_size <= CPU_ENCODER_MAX_BATCH_SIZE:
        bounded.max_batch_size = CPU_ENCODER_MAX_BATCH_SIZE
    if ARENA_SHRINKAGE_PARAM not in bounded.parameters:
        bounded.parameters[ARENA_SHRINKAGE_PARAM].string_value = CPU_ARENA_SHRINKAGE
    return bounded


# onnxruntime's run option: the CPU arena gives back, after each run, the memory that run took.
ARENA_SHRINKAGE_PARAM = "memory.enable_memory_arena_shrinkage"
CPU_ARENA_SHRINKAGE = "cpu:0"
BACKGROUND_ENCODER_SUFFIX = "_background"
# The background encoder's nice increment: at 10 a Linux thread weighs 110 against a default
# thread's 1024, so the clicks' decoder gets about 90% of a core both want.
BACKGROUND_NICE = 10


def background_cpu_encoder(config: ModelConfig, cores: int) -> ModelConfig:
    """The encoder a session model's embeds run on, on a CPU host: ``config``'s graph (same
    files) on the python runner, renamed ``<name>_background``, in a stub process that lowers
    its own CPU priority (:data:`BACKGROUND_NICE`) before onnxruntime starts ``cores``
    threads. The encoder ``config`` itself, which clients call directly, stays as it is.

    Why: on a CPU an encode and the clicks share the cores, and a storm of embeds kept the
    encoder busy for seconds on end. Measured on SAM2.1-tiny, 2 quiet cores, 16 users
    clicking (2 s think time) during storms of 64 embeds, `triton-sam bench storm`: clicks
    p50 169-221 ms and p95 1.7-3.1x their idle p95 with the encoder in the onnxruntime
    backend, 57 ms and 1.2-1.4x with it niced here; the storms took as long (15 s). A lone
    embed runs at full speed: niceness only matters while something else wants the core.
    The cost is a second copy of the encoder's weights in memory on a CPU host.
    """
    twin = to_python_target(config, onnx_file=config.default_model_filename or ONNX_FILENAME)
    twin.name = config.name + BACKGROUND_ENCODER_SUFFIX
    twin.parameters[runner_protocol.PARAM_NICE].string_value = str(BACKGROUND_NICE)
    if INTRA_OP_THREADS_PARAM not in twin.parameters:
        twin.parameters[INTRA_OP_THREADS_PARAM].string_value = str(max(1, cores))
    twin.parameters[runner_protocol.PARAM_SHRINK_ARENA].string_value = CPU_ARENA_SHRINKAGE
    return twin


UNBATCHED_DECODER_SUFFIX = "_unbatched"
WARMUP_NAME = "zeros"


def with_warmup(config: ModelConfig) -> ModelConfig:
    """``config`` with one warm-up request (batch 1, every input zeros, variable dims 1) that
    Triton runs on each instance as it loads, so the first clicks an instance serves do not
    pay onnxruntime's first-run allocations (seen: the first clicks on a cold instance 2-3x
    slower). Already warmed: unchanged."""
    if any(w.name == WARMUP_NAME for w in config.model_warmup):
        return config
    warm = ModelConfig()
    warm.CopyFrom(config)
    warmup = warm.model_warmup.add(name=WARMUP_NAME, batch_size=1, count=1)
    for tensor in config.input:
        spec = warmup.inputs[tensor.name]
        spec.data_type = tensor.data_type
        spec.dims.extend(max(int(d), 1) for d in tensor.dims)
        spec.zero_data = True
    return warm


def unbatched_cpu_decoder(config: ModelConfig) -> ModelConfig:
    """The decoder a session model's clicks run on, on a CPU host: ``config`` (sized by
    :func:`size_cpu_decoder`) renamed ``<name>_unbatched``, without a dynamic batcher, so
    Triton's default scheduler queues its requests at the instance. The session model bounds
    and cancels its clicks itself (``serving.click_queue``, given :func:`decoder_slots`); the
    decoder ``config`` itself, which clients call directly (the stateless path, whose
    speculative clients rely on the batcher dropping cancelled requests), keeps its batcher.

    Why: a batch costs a CPU decoder as much per click as single runs (SAM2.1-tiny, 2
    threads: 30.5 ms per click at batch 4, 31.8 at batch 1, in process), while Triton's
    batcher forms the next batch only once the instance is free, so the cores idled between
    runs. Measured on SAM2.1-tiny, 2 quiet cores, 4 callers on 4 images, 100 session clicks
    over gRPC: 20.1 clicks/s with the batcher (16.3-19.5 with batch-1 runs), 24.3-25.3
    without (in-process onnxruntime 25.2-27.7), docs/cpu-performance.md.
    """
    unbatched = ModelConfig()
    unbatched.CopyFrom(config)
    unbatched.name = config.name + UNBATCHED_DECODER_SUFFIX
    unbatched.ClearField("dynamic_batching")
    return unbatched


def decoder_slots(config: ModelConfig) -> int:
    """Clicks a session model keeps at the decoder ``config`` at once: one per instance, plus
    one queued at the instances so that the next run starts as one ends."""
    return sum(g.count for g in config.instance_group) + 1


def check_accelerators(config: ModelConfig) -> None:
    """Refuse GPU execution accelerators Triton's onnxruntime backend (r24.10) would refuse.

    Checks accelerator names (``tensorrt``, ``cuda``), TensorRT parameter names against
    :data:`TENSORRT_PARAMS` and ``precision_mode`` values, and lists every problem at once.

    Raises:
        RepositoryError: naming the model, the accelerator and the offending key or value.
    """
    problems = []
    for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
        if accelerator.name == TENSORRT_ACCELERATOR:
            for key, value in sorted(accelerator.parameters.items()):
                if key not in TENSORRT_PARAMS:
                    problems.append(f"unknown TensorRT parameter {key!r}")
                elif key == "precision_mode" and value not in TENSORRT_PRECISION_MODES:
                    modes = list(TENSORRT_PRECISION_MODES)
                    problems.append(f"precision_mode {value!r}, expected one of {modes}")
        elif accelerator.name != CUDA_ACCELERATOR:
            problems.append(
                f"unknown GPU execution accelerator {accelerator.name!r}, expected "
                f"{TENSORRT_ACCELERATOR!r} or {CUDA_ACCELERATOR!r}"
            )
    if problems:
        raise RepositoryError(
            f"model {config.name!r}: Triton's onnxruntime backend would refuse "
            f"optimization.execution_accelerators: {'; '.join(problems)}"
        )


def model_kind(config: ModelConfig) -> str | None:
    """The kind a triton_sam python-backend model declares (``protocol.KINDS``), else None
    (an ONNX graph, or its python-target runner)."""
    if protocol.KIND_PARAM not in config.parameters:
        return None
    return config.parameters[protocol.KIND_PARAM].string_value


def check_onnxruntime_parameters(config: ModelConfig) -> None:
    """Refuse settings of an onnxruntime-backend model that backend (r24.10) would ignore or
    refuse: unknown ``parameters`` keys, unparsable or out-of-range values, an unknown
    ``optimization.graph.level`` and CPU accelerators other than ``openvino``.

    Raises:
        RepositoryError: naming the model and every offending key or value at once.
    """
    problems = []
    for key, param in sorted(config.parameters.items()):
        problems += _ort_parameter_problems(key, param.string_value)
    if config.optimization.HasField("graph"):
        level = config.optimization.graph.level
        if level not in ORT_GRAPH_LEVELS:
            problems.append(
                f"optimization.graph.level {level}, expected one of {list(ORT_GRAPH_LEVELS)} "
                "(-1 basic, 1 extended, 2 none, 0 all)"
            )
    for accelerator in config.optimization.execution_accelerators.cpu_execution_accelerator:
        if accelerator.name != OPENVINO_ACCELERATOR:
            problems.append(
                f"unknown CPU execution accelerator {accelerator.name!r}, expected "
                f"{OPENVINO_ACCELERATOR!r}"
            )
    if problems:
        raise RepositoryError(
            f"model {config.name!r}: Triton's onnxruntime backend would ignore or refuse: "
            + "; ".join(problems)
        )


def _ort_parameter_problems(key: str, value: str) -> list[str]:
    known = ORT_MODEL_PARAMS.get(key)
    if known is None:
        hint = (
            f" (the python runner's key; the backend's is {ORT_INTRA_OP_PARAM!r})"
            if (key == INTRA_OP_THREADS_PARAM)
            else ""
        )
        return [f"unknown parameter {key!r}{hint}, expected one of {sorted(ORT_MODEL_PARAMS)}"]
    kind, allowed = known
    text = value.strip()
    if kind == _BOOL and text.lower() not in _BOOL_WORDS:
        return [f"parameter {key!r} is {value!r}, expected a boolean ({'/'.join(_BOOL_WORDS)})"]
    if kind == _INT:
        number = int(text) if text.lstrip("-").isdigit() else None
        if number is None or (allowed is None and number < 0):
            return [f"parameter {key!r} is {value!r}, expected an integer >= 0"]
        if allowed is not None and number not in allowed:
            return [f"parameter {key!r} is {value!r}, expected one of {list(allowed)}"]
    return []


def check_model_name(name: str) -> None:
    """Refuse names Triton cannot use as a repository directory.

    Raises:
        InputValidationError: empty, hidden, or containing a path separator.
    """
    if not name or name.startswith(".") or "/" in name or "\\" in name or name != name.strip():
        raise InputValidationError(
            "name", f"got {name!r}, expected a plain directory name (no '/', not hidden)"
        )


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


def _check_choice(field: str, value: object, choices: tuple[object, ...]) -> None:
    if value not in choices:
        shown = [c for c in choices if c is not None]
        raise InputValidationError(field, f"got {value!r}, expected one of {shown}")


def check_int(field: str, value: object, *, minimum: int) -> None:
    # bool is an int subclass; `max_batch_size=True` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InputValidationError(field, f"got {value!r}, expected an integer >= {minimum}")
