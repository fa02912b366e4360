"""The python-backend runner, outside Triton: a fake ``triton_python_backend_utils``.

Covers what the integration suite cannot observe directly: how many onnxruntime runs a list of
requests costs (real batching), output subsetting per request, cancelled requests never run,
and one failing request not failing its batch mates.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from triton_sam.repository import writer  # noqa: E402

OUTPUTS = ("y", "s", "t")


class _TritonError:
    CANCELLED, INVALID_ARG = "CANCELLED", "INVALID_ARG"

    def __init__(self, message: str, code: str | None = None) -> None:
        self.message, self.code = message, code


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class _Response:
    def __init__(self, output_tensors: list[_Tensor], error: _TritonError | None = None) -> None:
        self.outputs = {t.name: t.array for t in output_tensors}
        self.error = error


class _Request:
    def __init__(self, x: np.ndarray, p: np.ndarray, *, outputs=(), cancelled=False) -> None:
        self.inputs = {"x": _Tensor("x", x), "p": _Tensor("p", p)}
        self.outputs, self.cancelled = list(outputs), cancelled

    def is_cancelled(self) -> bool:
        return self.cancelled

    def requested_output_names(self) -> list[str]:
        return self.outputs


class _Metric:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels, self.value = labels, 0

    def increment(self, n: int) -> None:
        self.value += n


class _MetricFamily:
    COUNTER = "COUNTER"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.kind, self.metrics = name, kind, []

    def Metric(self, labels: dict[str, str]) -> _Metric:  # noqa: N802 - pb_utils' name
        self.metrics.append(_Metric(labels))
        return self.metrics[-1]


def _fake_pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.TritonError, pb.Tensor, pb.InferenceResponse = _TritonError, _Tensor, _Response
    pb.MetricFamily = _MetricFamily
    pb.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    pb.triton_string_to_numpy = lambda name: {"TYPE_FP32": np.float32}[name]
    return pb


def _tiny_model(path: Path) -> Path:
    """y = 2x + 1, s = sum(x), t = sum(p): x [b, 4], p [b, n, 2] (n variable)."""
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["x2"]),
        helper.make_node("Add", ["x2", "one"], ["y"]),
        helper.make_node("ReduceSum", ["x", "axis1"], ["s"], keepdims=1),
        helper.make_node("ReduceSum", ["p", "axis2"], ["p1"], keepdims=0),
        helper.make_node("ReduceSum", ["p1", "axis1"], ["t"], keepdims=1),
    ]
    consts = [
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "tiny",
        [value("x", TensorProto.FLOAT, ["b", 4]), value("p", TensorProto.FLOAT, ["b", "n", 2])],
        [value(n, TensorProto.FLOAT, ["b", 4 if n == "y" else 1]) for n in OUTPUTS],
        consts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by older onnxruntime builds too
    onnx.save_model(model, str(path))
    return path


def _runner_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str):
    """The runner's model.py loaded as a module (fake pb_utils), the tiny graph in ``1/``."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    spec = importlib.util.spec_from_file_location(name, writer.RUNNER_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "1").mkdir()
    _tiny_model(tmp_path / "1" / "model.onnx")
    return module


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    module = _runner_module(tmp_path, monkeypatch, "tiny_runner")
    config = {
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32"}, {"name": "p", "data_type": "TYPE_FP32"}],
        "output": [{"name": n, "data_type": "TYPE_FP32"} for n in OUTPUTS],
        "parameters": {"intra_op_threads": {"string_value": "1"}},
    }
    runner = module.TritonPythonModel()
    runner.initialize(
        {
            "model_config": json.dumps(config),
            "model_repository": str(tmp_path),
            "model_version": "1",
            "model_instance_kind": "CPU",
            "model_name": "tiny",
            "model_instance_name": "tiny_0_0",
        }
    )
    runner.runs = []
    real_run = runner.session.run

    def counting_run(names, feeds, run_options=None):
        runner.runs.append((list(names), {k: v.shape for k, v in feeds.items()}))
        runner.run_options_seen = run_options
        return real_run(names, feeds, run_options)

    runner.session.run = counting_run
    return runner


def _request(batch: int, points: int, seed: int, **kwargs) -> _Request:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 4)).astype(np.float32)
    p = rng.standard_normal((batch, points, 2)).astype(np.float32)
    return _Request(x, p, **kwargs)


def _check_values(request: _Request, response: _Response) -> None:
    x, p = request.inputs["x"].array, request.inputs["p"].array
    expected = {"y": 2 * x + 1, "s": x.sum(1, keepdims=True), "t": p.sum((1, 2))[:, None]}
    assert response.error is None
    for name, value in response.outputs.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, atol=1e-5)


def test_equal_shapes_run_as_one_batch(model) -> None:
    requests = [_request(1, 3, 0), _request(2, 3, 1), _request(1, 3, 2)]
    responses = model.execute(requests)
    assert len(model.runs) == 1
    assert model.runs[0][1] == {"x": (4, 4), "p": (4, 3, 2)}
    for request, response in zip(requests, responses, strict=True):
        assert set(response.outputs) == set(OUTPUTS)
        assert [len(v) for v in response.outputs.values()] == [len(request.inputs["x"].array)] * 3
        _check_values(request, response)


def test_different_variable_dims_run_separately(model) -> None:
    requests = [_request(1, 3, 0), _request(1, 5, 1), _request(1, 3, 2)]
    responses = model.execute(requests)
    assert sorted(shapes["p"] for _, shapes in model.runs) == [(1, 5, 2), (2, 3, 2)]
    for request, response in zip(requests, responses, strict=True):
        _check_values(request, response)


def test_only_requested_outputs_are_computed_and_returned(model) -> None:
    requests = [_request(1, 3, 0, outputs=["s"]), _request(1, 3, 1, outputs=["s", "t"])]
    responses = model.execute(requests)
    assert model.runs[0][0] == ["s", "t"]  # the group's union, never "y"
    assert set(responses[0].outputs) == {"s"}
    assert set(responses[1].outputs) == {"s", "t"}
    for request, response in zip(requests, responses, strict=True):
        _check_values(request, response)


def test_cancelled_requests_do_not_run(model) -> None:
    responses = model.execute([_request(1, 3, 0, cancelled=True), _request(1, 3, 1)])
    assert responses[0].error.code == "CANCELLED"
    assert model.runs[0][1]["x"] == (1, 4)
    assert responses[1].error is None
    model.runs.clear()
    responses = model.execute([_request(1, 3, 0, cancelled=True)])
    assert model.runs == [] and responses[0].error.code == "CANCELLED"


def test_a_failing_request_does_not_fail_its_batch_mates(model) -> None:
    real_run = model.session.run

    def fail_on_big_batches(names, feeds, run_options=None):
        if len(feeds["x"]) > 1 or feeds["x"][0, 0] > 100:
            raise RuntimeError("simulated onnxruntime failure")
        return real_run(names, feeds, run_options)

    model.session.run = fail_on_big_batches
    good, bad = _request(1, 3, 0), _request(1, 3, 1)
    bad.inputs["x"].array[0, 0] = 1000.0
    responses = model.execute([good, bad])
    _check_values(good, responses[0])
    assert responses[1].error.code == "INVALID_ARG"
    assert "simulated onnxruntime failure" in responses[1].error.message


def test_skipped_cancelled_requests_are_counted_for_the_metrics_endpoint(model) -> None:
    # Triton counts a request answered unrun as an inference; this counter tells them apart.
    family, metric = model._skipped
    assert family.name == "triton_sam_cancelled_requests_skipped" and family.kind == "COUNTER"
    assert metric.labels == {"model": "tiny", "version": "1", "instance": "tiny_0_0"}
    model.execute([_request(1, 3, 0, cancelled=True), _request(1, 3, 1)])
    model.execute([_request(1, 3, 0, cancelled=True), _request(1, 3, 1, cancelled=True)])
    assert metric.value == 3


def test_a_background_runner_lowers_its_priority_before_onnxruntime_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Onnxruntime's threads inherit the niceness of the thread that creates the session, so
    the runner must lower it first; without the parameter it leaves it alone."""
    module = _runner_module(tmp_path, monkeypatch, "tiny_runner_nice")
    calls = []
    monkeypatch.setattr(module.os, "nice", lambda inc: calls.append(("nice", inc)) or inc)
    real_session = module.ort.InferenceSession
    monkeypatch.setattr(
        module.ort,
        "InferenceSession",
        lambda *a, **k: calls.append(("session",)) or real_session(*a, **k),
    )
    for parameters, expected in (({"nice": {"string_value": "10"}}, [("nice", 10)]), ({}, [])):
        calls.clear()
        config = {
            "max_batch_size": 8,
            "input": [{"name": n, "data_type": "TYPE_FP32"} for n in ("x", "p")],
            "output": [{"name": n, "data_type": "TYPE_FP32"} for n in OUTPUTS],
            "parameters": parameters,
        }
        module.TritonPythonModel().initialize(
            {
                "model_config": json.dumps(config),
                "model_repository": str(tmp_path),
                "model_version": "1",
                "model_instance_kind": "CPU",
                "model_name": "tiny",
                "model_instance_name": "tiny_0_0",
            }
        )
        assert calls == [*expected, ("session",)]


def test_shrink_arena_parameter_becomes_the_run_option(tmp_path: Path, monkeypatch) -> None:
    """``shrink_arena`` (the CPU twin's background encoder sets "cpu:0") reaches every run as
    onnxruntime's arena-shrinkage run option; without it runs take no run options."""
    module = _runner_module(tmp_path, monkeypatch, "shrinking_runner")
    for params, expected in (({"shrink_arena": {"string_value": "cpu:0"}}, "cpu:0"), ({}, None)):
        config = {
            "max_batch_size": 8,
            "input": [{"name": n, "data_type": "TYPE_FP32"} for n in ("x", "p")],
            "output": [{"name": n, "data_type": "TYPE_FP32"} for n in OUTPUTS],
            "parameters": params,
        }
        runner = module.TritonPythonModel()
        runner.initialize(
            {
                "model_config": json.dumps(config),
                "model_repository": str(tmp_path),
                "model_version": "1",
                "model_instance_kind": "CPU",
                "model_name": "tiny",
                "model_instance_name": "tiny_0_0",
            }
        )
        seen = []
        real_run = runner.session.run

        def run(names, feeds, run_options=None, real_run=real_run, seen=seen):
            seen.append(run_options)
            return real_run(names, feeds, run_options)

        runner.session.run = run
        _check_values(request := _request(1, 3, 0), runner.execute([request])[0])
        option = seen[0] and seen[0].get_run_config_entry("memory.enable_memory_arena_shrinkage")
        assert option == expected
