"""config.pbtxt rendering: reference files, round trip, validation, target conversion, and the
GPU-only keys (TensorRT accelerator) checked by name against Triton's onnxruntime backend."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from google.protobuf import text_format

from triton_sam.errors import InputValidationError, RepositoryError
from triton_sam.models.sam2 import SAM2_FAMILY
from triton_sam.repository import config as cfg
from triton_sam.repository.config import (
    RepositoryOptions,
    build_config,
    check_accelerators,
    check_onnxruntime_parameters,
    parse_config,
    render_config,
    to_cpu_twin,
    to_python_target,
    triton_dtype,
)

ASSETS = Path(__file__).parent / "assets"

# Reference files were checked by hand against triton_sam/models/sam2.py and Triton's
# model_config.proto; a change in rendering must be a deliberate change of these files.
REFERENCES = {
    "sam2_encoder_onnxruntime.pbtxt": ("encoder", RepositoryOptions(target="onnxruntime")),
    "sam2_decoder_onnxruntime.pbtxt": ("decoder", RepositoryOptions(target="onnxruntime")),
    "sam2_decoder_onnxruntime_trt_fp16_warmup.pbtxt": (
        "decoder",
        RepositoryOptions(
            target="onnxruntime",
            tensorrt_fp16=True,
            warmup=True,
            instance_count=2,
            max_queue_delay_us=500,
        ),
    ),
    "sam2_encoder_python.pbtxt": ("encoder", RepositoryOptions(target="python")),
    "sam2_decoder_python.pbtxt": (
        "decoder",
        RepositoryOptions(target="python", intra_op_threads=2),
    ),
}


@pytest.mark.parametrize("filename", sorted(REFERENCES))
def test_render_matches_reference(filename: str) -> None:
    graph, options = REFERENCES[filename]
    assert render_config(SAM2_FAMILY, graph, options) == (ASSETS / filename).read_text()


@pytest.mark.parametrize("filename", sorted(REFERENCES))
def test_write_then_parse_round_trip(filename: str, tmp_path: Path) -> None:
    graph, options = REFERENCES[filename]
    path = tmp_path / "config.pbtxt"
    path.write_text(render_config(SAM2_FAMILY, graph, options))
    assert parse_config(path) == build_config(SAM2_FAMILY, graph, options)
    assert parse_config(str(path)) == parse_config(path.read_text())


@pytest.mark.parametrize("graph", ["encoder", "decoder"])
def test_tensors_come_from_the_spec(graph: str) -> None:
    config = build_config(SAM2_FAMILY, graph, RepositoryOptions())
    inputs = SAM2_FAMILY.encoder_inputs if graph == "encoder" else SAM2_FAMILY.decoder_inputs
    outputs = SAM2_FAMILY.encoder_outputs if graph == "encoder" else SAM2_FAMILY.decoder_outputs
    assert [(t.name, tuple(t.dims)) for t in config.input] == [(t.name, t.shape) for t in inputs]
    assert [(t.name, tuple(t.dims)) for t in config.output] == [(t.name, t.shape) for t in outputs]


def test_names_default_to_the_family_and_can_be_overridden() -> None:
    options = RepositoryOptions()
    assert build_config(SAM2_FAMILY, "encoder", options).name == SAM2_FAMILY.encoder_model
    assert build_config(SAM2_FAMILY, "decoder", options).name == SAM2_FAMILY.decoder_model
    assert build_config(SAM2_FAMILY, "decoder", options, name="dec_v2").name == "dec_v2"


def test_every_model_has_a_dynamic_batcher() -> None:
    # Cancellation of queued requests depends on it (see config.py).
    for target in cfg.TARGETS:
        for graph in SAM2_FAMILY.graphs:
            config = build_config(SAM2_FAMILY, graph.role, RepositoryOptions(target=target))
            assert config.HasField("dynamic_batching")
            assert config.max_batch_size > 0


def test_instance_kind_defaults_per_target_and_can_be_forced() -> None:
    kinds = cfg.model_config_pb2.ModelInstanceGroup
    gpu_python = RepositoryOptions(target="python", instance_kind="gpu", instance_count=3)
    group = build_config(SAM2_FAMILY, "encoder", gpu_python).instance_group[0]
    assert (group.kind, group.count) == (kinds.KIND_GPU, 3)
    group = build_config(SAM2_FAMILY, "encoder", RepositoryOptions()).instance_group[0]
    assert group.kind == kinds.KIND_GPU
    group = build_config(SAM2_FAMILY, "encoder", RepositoryOptions(target="python"))
    assert group.instance_group[0].kind == kinds.KIND_CPU


def test_dtype_mapping() -> None:
    assert triton_dtype("float32") == "TYPE_FP32"
    assert triton_dtype("float16") == "TYPE_FP16"
    assert triton_dtype("int64") == "TYPE_INT64"
    assert triton_dtype("bool") == "TYPE_BOOL"
    with pytest.raises(InputValidationError, match="dtype"):
        triton_dtype("complex64")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"target": "tensorrt"}, "target"),
        ({"encoder_max_batch_size": 0}, "encoder_max_batch_size"),
        ({"decoder_max_batch_size": -1}, "decoder_max_batch_size"),
        ({"encoder_max_batch_size": True}, "encoder_max_batch_size"),
        ({"instance_count": 0}, "instance_count"),
        ({"instance_kind": "tpu"}, "instance_kind"),
        ({"max_queue_delay_us": -5}, "max_queue_delay_us"),
        ({"intra_op_threads": -1}, "intra_op_threads"),
        ({"target": "python", "tensorrt_fp16": True}, "tensorrt_fp16"),
        ({"tensorrt_fp16": True, "trt_engine_cache_path": ""}, "trt_engine_cache_path"),
    ],
)
def test_options_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InputValidationError) as info:
        RepositoryOptions(**kwargs)
    assert info.value.field == field
    assert field in str(info.value)


def test_bad_graph_and_name() -> None:
    with pytest.raises(InputValidationError, match="graph"):
        render_config(SAM2_FAMILY, "prompt_encoder", RepositoryOptions())  # type: ignore[arg-type]
    for bad in ("", "../evil", ".hidden", "a/b"):
        with pytest.raises(InputValidationError, match="name"):
            render_config(SAM2_FAMILY, "encoder", RepositoryOptions(), name=bad)


def test_parse_errors_name_the_source(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="config text"):
        parse_config("name: 'x'\nmax_batch_size: {")
    bad = tmp_path / "config.pbtxt"
    bad.write_text("no_such_field: 1\n")
    with pytest.raises(RepositoryError, match=str(bad)):
        parse_config(bad)
    with pytest.raises(RepositoryError, match="cannot read"):
        parse_config(tmp_path / "missing.pbtxt")


def test_python_twin_of_an_onnxruntime_config() -> None:
    options = RepositoryOptions(tensorrt_fp16=True, warmup=True, intra_op_threads=3)
    gpu = build_config(SAM2_FAMILY, "decoder", options)
    twin = to_python_target(gpu)
    expected = build_config(
        SAM2_FAMILY, "decoder", RepositoryOptions(target="python", warmup=True, intra_op_threads=3)
    )
    assert text_format.MessageToString(twin) == text_format.MessageToString(expected)
    assert to_python_target(twin) == twin  # already python: unchanged


def test_python_twin_refuses_other_platforms() -> None:
    with pytest.raises(RepositoryError, match="tensorrt_plan"):
        to_python_target(parse_config('name: "m"\nplatform: "tensorrt_plan"\n'))


def test_cpu_twin_changes_only_what_a_cpu_host_cannot_do() -> None:
    options = RepositoryOptions(
        tensorrt_fp16=True, warmup=True, intra_op_threads=3, instance_count=2
    )
    gpu = build_config(SAM2_FAMILY, "decoder", options)
    twin = to_cpu_twin(gpu)
    (group,) = twin.instance_group
    assert group.kind == group.KIND_CPU and group.count == 2 and list(group.gpus) == []
    assert not twin.HasField("optimization")  # TensorRT was its only content
    # Everything else is the production config, byte for byte.
    expected = build_config(
        SAM2_FAMILY,
        "decoder",
        RepositoryOptions(warmup=True, intra_op_threads=3, instance_count=2, instance_kind="cpu"),
    )
    assert text_format.MessageToString(twin) == text_format.MessageToString(expected)
    assert twin.platform == "onnxruntime_onnx" and twin.backend == ""
    assert to_cpu_twin(twin) == twin  # already CPU: unchanged
    assert gpu.instance_group[0].kind == group.KIND_GPU  # the input is not modified


def test_cpu_twin_keeps_cpu_accelerators_and_drops_only_gpu_ones() -> None:
    config = parse_config(
        'name: "m"\nplatform: "onnxruntime_onnx"\n'
        "instance_group { kind: KIND_GPU gpus: [0, 1] count: 1 }\n"
        "optimization { priority: PRIORITY_MAX execution_accelerators {\n"
        '  gpu_execution_accelerator { name: "cuda" }\n'
        '  cpu_execution_accelerator { name: "openvino" } } }\n'
    )
    twin = to_cpu_twin(config)
    accelerators = twin.optimization.execution_accelerators
    assert [a.name for a in accelerators.cpu_execution_accelerator] == ["openvino"]
    assert list(accelerators.gpu_execution_accelerator) == []
    assert twin.optimization.priority == twin.optimization.PRIORITY_MAX
    assert list(twin.instance_group[0].gpus) == []


def test_tensorrt_parameters_are_names_the_onnxruntime_backend_accepts() -> None:
    """Every key the renderer writes is in the backend's list (onnxruntime_backend r24.10)."""
    config = build_config(SAM2_FAMILY, "encoder", RepositoryOptions(tensorrt_fp16=True))
    (trt,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert trt.name == cfg.TENSORRT_ACCELERATOR == "tensorrt"
    assert set(trt.parameters) <= cfg.TENSORRT_PARAMS
    assert trt.parameters["precision_mode"] in cfg.TENSORRT_PRECISION_MODES
    check_accelerators(config)  # no error


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("precison_mode", "FP16", "unknown TensorRT parameter 'precison_mode'"),
        ("engine_cache_enable", "true", "unknown TensorRT parameter 'engine_cache_enable'"),
        ("precision_mode", "fp16", "precision_mode 'fp16'"),
    ],
)
def test_a_misspelled_accelerator_parameter_fails(key: str, value: str, match: str) -> None:
    config = build_config(SAM2_FAMILY, "encoder", RepositoryOptions(tensorrt_fp16=True))
    config.optimization.execution_accelerators.gpu_execution_accelerator[0].parameters[key] = value
    with pytest.raises(RepositoryError, match=match):
        check_accelerators(config)
    with pytest.raises(RepositoryError, match=match):  # never silently dropped for the CPU twin
        to_cpu_twin(config)


def test_an_unknown_accelerator_name_fails() -> None:
    config = build_config(SAM2_FAMILY, "encoder", RepositoryOptions(tensorrt_fp16=True))
    config.optimization.execution_accelerators.gpu_execution_accelerator[0].name = "TensorRT"
    with pytest.raises(RepositoryError, match="unknown GPU execution accelerator 'TensorRT'"):
        check_accelerators(config)


def test_the_renderer_checks_what_it_writes(monkeypatch) -> None:
    from triton_sam.repository import backend_checks as checks

    monkeypatch.setattr(
        checks, "TENSORRT_PARAMS", checks.TENSORRT_PARAMS - {"trt_engine_cache_path"}
    )
    with pytest.raises(RepositoryError, match="trt_engine_cache_path"):
        build_config(SAM2_FAMILY, "encoder", RepositoryOptions(tensorrt_fp16=True))


def test_the_python_target_declares_its_kind_and_the_runner_reads_the_protocols_keys() -> None:
    from triton_sam.serving.protocol import runner as runner_protocol

    config = to_python_target(
        parse_config(render_config(SAM2_FAMILY, "decoder", RepositoryOptions()))
    )
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params[runner_protocol.PARAM_KIND] == runner_protocol.KIND
    source = (Path(cfg.__file__).parent.parent / "serving" / "runner_model.py").read_text()
    read = set(re.findall(r"params\.get\(protocol\.(PARAM_\w+)\)", source))
    assert {getattr(runner_protocol, k) for k in read} == set(runner_protocol.PARAM_KEYS) - {
        runner_protocol.PARAM_KIND
    }


def test_runner_imports_only_what_the_stub_has() -> None:
    source = (Path(cfg.__file__).parent.parent / "serving" / "runner_model.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    stub = {"json", "os", "sys", "numpy", "onnxruntime", "triton_python_backend_utils"}
    # the shipped protocol package (triton_sam itself only in the source tree's fallback)
    assert imported <= stub | {"triton_sam_serving", "triton_sam"}


def test_onnxruntime_parameters_rendered_are_keys_the_backend_reads() -> None:
    options = RepositoryOptions(intra_op_threads=2)
    for graph in ("encoder", "decoder"):
        config = build_config(SAM2_FAMILY, graph, options)
        assert set(config.parameters) <= set(cfg.ORT_MODEL_PARAMS)
        assert config.parameters[cfg.ORT_INTRA_OP_PARAM].string_value == "2"
        check_onnxruntime_parameters(config)  # no error


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (
            "intra_op_threads",
            "1",
            "the python runner's key; the backend's is 'intra_op_thread_count'",
        ),
        ("inter_op_threads", "1", "unknown parameter 'inter_op_threads'"),
        ("intra_op_thread_count", "two", "'intra_op_thread_count' is 'two', expected an integer"),
        ("intra_op_thread_count", "-1", "expected an integer >= 0"),
        ("execution_mode", "2", r"'execution_mode' is '2', expected one of \[0, 1\]"),
        ("enable_mem_arena", "yes", "'enable_mem_arena' is 'yes', expected a boolean"),
    ],
)
def test_a_parameter_the_onnxruntime_backend_would_ignore_or_refuse_fails(
    key: str, value: str, match: str
) -> None:
    config = build_config(SAM2_FAMILY, "decoder", RepositoryOptions())
    config.parameters[key].string_value = value
    with pytest.raises(RepositoryError, match=match):
        check_onnxruntime_parameters(config)
    with pytest.raises(RepositoryError, match=match):  # nor derived into the embedded twin
        to_cpu_twin(config)


def test_backend_boolean_spellings_and_graph_levels_are_accepted() -> None:
    config = build_config(SAM2_FAMILY, "decoder", RepositoryOptions())
    config.parameters["enable_mem_pattern"].string_value = "OFF"
    config.parameters["execution_mode"].string_value = "1"
    config.optimization.graph.level = -1
    check_onnxruntime_parameters(config)
    config.optimization.graph.level = 3
    with pytest.raises(RepositoryError, match="optimization.graph.level 3"):
        check_onnxruntime_parameters(config)


def test_only_openvino_is_a_cpu_accelerator_of_the_backend() -> None:
    config = build_config(SAM2_FAMILY, "decoder", RepositoryOptions())
    config.optimization.execution_accelerators.cpu_execution_accelerator.add(name="openvino")
    check_onnxruntime_parameters(config)
    config.optimization.execution_accelerators.cpu_execution_accelerator.add(name="dnnl")
    with pytest.raises(RepositoryError, match="unknown CPU execution accelerator 'dnnl'"):
        check_onnxruntime_parameters(config)


@pytest.mark.parametrize(
    ("cores", "instances", "threads"),
    [(1, 1, "1"), (2, 1, "2"), (4, 1, "4"), (8, 2, "4"), (16, 4, "4"), (64, 4, "16")],
)
def test_a_cpu_decoder_is_sized_by_cores(cores: int, instances: int, threads: str) -> None:
    twin = to_cpu_twin(build_config(SAM2_FAMILY, "decoder", RepositoryOptions()))
    sized = cfg.size_cpu_decoder(twin, cores)
    assert [g.count for g in sized.instance_group] == [instances]
    assert sized.parameters[cfg.ORT_INTRA_OP_PARAM].string_value == threads
    check_onnxruntime_parameters(sized)
    assert twin.instance_group[0].count == 1  # a copy; the twin is untouched


@pytest.mark.parametrize("cores", [1, 2, 8, 16])
def test_the_session_models_decoder_is_an_unbatched_copy_with_a_slot_per_instance(
    cores: int,
) -> None:
    twin = cfg.size_cpu_decoder(
        to_cpu_twin(build_config(SAM2_FAMILY, "decoder", RepositoryOptions())), cores
    )
    unbatched = cfg.unbatched_cpu_decoder(twin)
    assert unbatched.name == twin.name + "_unbatched"
    assert twin.HasField("dynamic_batching") and not unbatched.HasField("dynamic_batching")
    check_onnxruntime_parameters(unbatched)
    rest = (unbatched.input, unbatched.output, unbatched.instance_group, unbatched.parameters)
    assert rest == (twin.input, twin.output, twin.instance_group, twin.parameters)
    assert unbatched.max_batch_size == twin.max_batch_size  # batched requests still run
    instances = twin.instance_group[0].count
    assert cfg.decoder_slots(unbatched) == instances + 1


def test_a_warmed_decoder_runs_one_zero_request_per_instance_with_its_contract() -> None:
    twin = to_cpu_twin(build_config(SAM2_FAMILY, "decoder", RepositoryOptions()))
    warm = cfg.with_warmup(twin)
    (warmup,) = warm.model_warmup
    assert warmup.batch_size == 1 and warmup.count == 1
    assert set(warmup.inputs) == {t.name for t in twin.input}
    for tensor in twin.input:  # variable dims (the number of points) warm with 1
        spec = warmup.inputs[tensor.name]
        assert spec.data_type == tensor.data_type and spec.zero_data
        assert list(spec.dims) == [1 if d == -1 else d for d in tensor.dims]
    assert cfg.with_warmup(warm) == warm  # once
    assert not twin.model_warmup  # a copy


def test_a_decoder_with_its_own_thread_count_is_not_resized() -> None:
    twin = to_cpu_twin(build_config(SAM2_FAMILY, "decoder", RepositoryOptions(intra_op_threads=3)))
    assert cfg.size_cpu_decoder(twin, 16) == twin
    with pytest.raises(InputValidationError, match="cores"):
        cfg.size_cpu_decoder(twin, 0)
