"""The video models of a repository: configs rendered from the protocol, the tracker shipped
with its package, written as one set; no server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from triton_sam.errors import RepositoryError
from triton_sam.repository.config import RepositoryOptions, parse_config
from triton_sam.repository.video_config import (
    PACKAGE_DIR,
    TrackerOptions,
    build_tracker_config,
    is_tracker_config,
    video_artifacts,
    write_video_models,
)
from triton_sam.repository.writer import embedded_repository, list_models
from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.tracking.config import TrackerConfig


def fake_graphs(folder: Path) -> dict[str, Path]:
    """Graphs that only declare the protocol's contracts (batch dim variable, no nodes): what
    the writer reads of a graph (its declarations, for the onnx check and its sidecars)."""
    import onnx
    from onnx import helper

    folder.mkdir(parents=True, exist_ok=True)
    graphs = {}
    for key, (inputs, outputs) in protocol.GRAPHS.items():

        def declare(contracts):
            return [
                helper.make_tensor_value_info(
                    name,
                    helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                    ["batch", *(d if d > 0 else f"{name}_{i}" for i, d in enumerate(shape))],
                )
                for name, dtype, shape in contracts
            ]

        graph = helper.make_graph([], key, declare(inputs), declare(outputs))
        graphs[key] = folder / f"{key}.onnx"
        onnx.save_model(helper.make_model(graph), str(graphs[key]))
    return graphs


def test_tracker_config_has_optional_inputs_one_cpu_instance_and_its_bounds():
    tracker = TrackerOptions(max_sessions=3, max_frames=100)
    config = build_tracker_config(RepositoryOptions(), TrackerConfig(), tracker)
    inputs = {i.name: i for i in config.input}
    assert set(inputs) == {name for name, _, _ in protocol.INPUTS}
    assert [n for n, i in inputs.items() if not i.optional] == list(protocol.REQUIRED_INPUTS)
    assert [o.name for o in config.output] == list(protocol.OUTPUTS)
    assert len(config.instance_group) == 1 and config.instance_group[0].count == 1
    assert config.instance_group[0].kind == config.instance_group[0].KIND_CPU
    assert config.HasField("dynamic_batching")  # what makes Triton drop cancelled requests
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert set(params) == set(protocol.PARAM_KEYS)
    assert params["max_sessions"] == "3" and params["max_frames"] == "100"
    assert params["max_tenant_sessions"] == "0" and params["evict_idle_s"] == "60"
    assert TrackerConfig.from_json(params["model_config"]) == TrackerConfig()
    assert is_tracker_config(config)


@pytest.mark.parametrize(
    ("field", "value"), [("max_tenant_sessions", 5), ("evict_idle_s", -1), ("max_tenant_bytes", -1)]
)
def test_tenant_bounds_are_validated(field, value):
    from triton_sam.errors import InputValidationError

    with pytest.raises(InputValidationError) as info:
        TrackerOptions(max_sessions=4, **{field: value})
    assert info.value.field == field


@pytest.mark.parametrize("target", ["onnxruntime", "python"])
def test_graph_configs_follow_the_protocol(target, tmp_path):
    artifacts = video_artifacts(
        fake_graphs(tmp_path / "g"), TrackerConfig(), RepositoryOptions(target=target)
    )
    names = [a.name for a in artifacts]
    assert names == [*protocol.DEFAULT_MODEL_NAMES.values(), protocol.TRACKER_MODEL]
    attention = parse_config(artifacts[1].config_text)
    dims = {i.name: list(i.dims) for i in attention.input}
    assert dims["memory"] == [-1, 64, 64, 64] and dims["obj_ptrs"] == [-1, 256]
    assert (attention.backend == "python") == (target == "python")
    assert ("model.py" in artifacts[1].files) == (target == "python")


def test_the_set_is_written_with_the_tracker_package(tmp_path):
    repo = tmp_path / "model_repository"
    options = RepositoryOptions(target="onnxruntime", instance_kind="cpu")
    write_video_models(repo, fake_graphs(tmp_path / "g"), TrackerConfig(), options)
    assert list_models(repo) == sorted(
        [*protocol.DEFAULT_MODEL_NAMES.values(), protocol.TRACKER_MODEL]
    )
    version = repo / protocol.TRACKER_MODEL / "1"
    assert (version / "model.py").is_file()
    package = version / PACKAGE_DIR
    shipped = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    expected = {"protocol/tracker.py", "protocol/tenancy.py", "tracking/service.py"}
    assert expected | {"tracking/sessions.py", "__init__.py"} <= shipped
    twin = embedded_repository(repo, tmp_path / "embedded", target="python")  # fake graphs
    assert (twin / protocol.TRACKER_MODEL / "1" / PACKAGE_DIR / "tracking" / "tracker.py").is_file()
    assert parse_config(twin / "sam2_memory_attention" / "config.pbtxt").backend == "python"


def test_the_shipped_package_imports_without_triton_sam(tmp_path):
    """What Triton's stub does: the package under another name, numpy only, no triton_sam."""
    repo = tmp_path / "model_repository"
    write_video_models(repo, fake_graphs(tmp_path / "g"), TrackerConfig(), RepositoryOptions())
    version = repo / protocol.TRACKER_MODEL / "1"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import triton_sam_serving.tracking.service as s, triton_sam_serving.tracking.tracker;"
        "import triton_sam_serving.protocol.tenancy;"
        "assert not any(m == 'triton_sam' or m.startswith('triton_sam.') for m in sys.modules);"
        "assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules;"
        "print(s.TrackingService.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(version)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "TrackingService"


def test_python_target_graphs_ship_what_the_runner_imports(tmp_path):
    # The video graphs go through the writer's one graph path: the runner and its protocol.
    artifacts = video_artifacts(
        fake_graphs(tmp_path / "g"), TrackerConfig(), RepositoryOptions(target="python")
    )
    for artifact in artifacts[:-1]:
        assert f"{PACKAGE_DIR}/protocol/runner.py" in artifact.files


def test_a_missing_graph_is_named(tmp_path):
    graphs = fake_graphs(tmp_path / "g")
    del graphs["memory_attention"]
    with pytest.raises(RepositoryError, match="memory_attention"):
        video_artifacts(graphs, TrackerConfig(), RepositoryOptions())
