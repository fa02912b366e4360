"""The CPU-twin policy, in one place: what a model of a production (GPU) repository becomes on
a CPU host (the embedded server), config by config.

- the mechanical twin (:func:`to_cpu_twin`: GPU instances and accelerators out, nothing else);
- the python-runner twin (:func:`to_python_target`) for a server without the onnxruntime
  backend;
- the measured CPU choices: decoder instances and threads (:func:`size_cpu_decoder`), a
  warm-up (:func:`with_warmup`), an unbatched copy for the session model's clicks
  (:func:`unbatched_cpu_decoder`), the session model's encoder at batch 1
  (:func:`bounded_cpu_encoder`) and a niced background copy for its embeds
  (:func:`background_cpu_encoder`), the embed admission (:data:`CPU_MAX_CONCURRENT_EMBEDS`).

Which model of a repository gets which is decided by its kind and by who calls it
(:mod:`triton_sam.repository.embedded`); the production repository is never changed.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2

from triton_sam.errors import RepositoryError
from triton_sam.repository.backend_checks import (
    INTRA_OP_THREADS_PARAM,
    ORT_INTRA_OP_PARAM,
    check_accelerators,
    check_onnxruntime_parameters,
)
from triton_sam.repository.checks import check_int
from triton_sam.repository.config import (
    _KINDS,
    ONNX_FILENAME,
    InstanceKind,
    ModelConfig,
    RepositoryOptions,
    _set_python,
)
from triton_sam.serving.protocol import runner as runner_protocol


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


# What a CPU host admits of a session model's embeds (``embedded.embedded_repository`` lowers
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


__all__ = [
    "ARENA_SHRINKAGE_PARAM",
    "BACKGROUND_ENCODER_SUFFIX",
    "BACKGROUND_NICE",
    "CPU_ARENA_SHRINKAGE",
    "CPU_DECODER_CORES_PER_INSTANCE",
    "CPU_DECODER_MAX_INSTANCES",
    "CPU_ENCODER_MAX_BATCH_SIZE",
    "CPU_MAX_CONCURRENT_EMBEDS",
    "CPU_MAX_WAITING_EMBEDS",
    "UNBATCHED_DECODER_SUFFIX",
    "WARMUP_NAME",
    "background_cpu_encoder",
    "bounded_cpu_encoder",
    "decoder_slots",
    "size_cpu_decoder",
    "to_cpu_twin",
    "to_python_target",
    "unbatched_cpu_decoder",
    "with_cpu_instances",
    "with_warmup",
]
