"""What Triton's onnxruntime backend (r24.10) accepts in a ``config.pbtxt``: accelerators,
model parameters and graph levels, checked statically (a GPU container's refusals, found on any
host, before anything is written).
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2

from triton_sam.errors import RepositoryError
from triton_sam.serving.protocol import runner as runner_protocol

ModelConfig = model_config_pb2.ModelConfig
# The python runner's key for the intra-op threads (serving/protocol/runner.py), and the
# onnxruntime backend's own key for the same setting.
INTRA_OP_THREADS_PARAM = runner_protocol.PARAM_INTRA_OP_THREADS
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


__all__ = [
    "CUDA_ACCELERATOR",
    "INTRA_OP_THREADS_PARAM",
    "OPENVINO_ACCELERATOR",
    "ORT_GRAPH_LEVELS",
    "ORT_INTRA_OP_PARAM",
    "ORT_MODEL_PARAMS",
    "TENSORRT_ACCELERATOR",
    "TENSORRT_PARAMS",
    "TENSORRT_PRECISION_MODES",
    "check_accelerators",
    "check_onnxruntime_parameters",
]
