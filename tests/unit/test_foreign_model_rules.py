"""Models of the user's own in a repository beside ours: recognised, served as they are.

A python model is ours when its config declares ``triton_sam.kind`` or its version directory
holds a package triton-sam ships beside ``model.py``; any other python model (the Lambda
seed's ``sam2``, a preprocessing model) is the user's, whatever its name, and the CPU twin
only turns its ``KIND_GPU`` instances into ``KIND_CPU``. A model of ours without a kind is
stale and refused with what to do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_sam.errors import RepositoryError
from triton_sam.repository import writer
from triton_sam.repository.config import model_config_pb2, parse_config
from triton_sam.repository.writer import ModelFiles, embedded_repository, written_by_triton_sam

# The Lambda seed's model: python backend, string inputs, batching, two GPU instances.
LAMBDA_SAM2 = """
name: "sam2"
backend: "python"
max_batch_size: 16
input [
  { name: "image_b64" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "prompt_json" data_type: TYPE_STRING dims: [ 1 ] }
]
output [ { name: "result_json" data_type: TYPE_STRING dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100000 }
instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]
"""
KIND = 'parameters { key: "triton_sam.kind" value { string_value: "%s" } }'


def _python_model(repo: Path, name: str, config: str, files: dict[str, bytes]) -> Path:
    """A model directory: ``config.pbtxt`` and ``files`` (paths relative to the model dir)."""
    model_dir = repo / name
    model_dir.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config)
    for path, content in files.items():
        (model_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / path).write_bytes(content)
    return model_dir


def _artifact(config: str, files: tuple[str, ...]) -> ModelFiles:
    return ModelFiles(parse_config(config).name, config, {f: Path(f) for f in files})


def _bare(name: str, extra: str = "") -> str:
    return f'name: "{name}"\nbackend: "python"\n{extra}'


# -- the recognition rule ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "files", "ours"),
    [
        (_bare("sam2_session", KIND % "embedding_cache"), ("model.py",), True),  # declares it
        (_bare("x", KIND % "onnx_runner"), ("model.py", "model.onnx"), True),
        (_bare("x"), ("model.py", "triton_sam_serving/__init__.py"), True),  # ships our package
        (_bare("x"), ("model.py", "triton_sam_tracking/__init__.py"), True),  # the first trackers'
        (LAMBDA_SAM2, ("model.py",), False),
        (_bare("sam2_session"), ("model.py",), False),  # a name of ours says nothing
        (_bare("x"), ("model.py", "triton_sam_servingx/a.py", "lib/triton_sam_serving.py"), False),
    ],
)
def test_ours_is_what_declares_a_kind_or_ships_our_package(config, files, ours) -> None:
    assert written_by_triton_sam(_artifact(config, files)) is ours


# -- the twin of a model of the user's own ---------------------------------------------------
def test_a_python_model_of_the_users_own_is_served_as_it_is_on_cpu(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _python_model(
        repo,
        "sam2",
        LAMBDA_SAM2,
        {
            "1/model.py": b"import json\n",
            "1/weights.bin": b"\x00" * 8,
            "1/lib/helpers.py": b"X = 1\n",
            "2/model.py": b"# version 2\n",
            "labels.txt": b"a\nb\n",
        },
    )
    twin_dir = embedded_repository(repo)
    assert twin_dir == tmp_path / "repo_embedded"
    twin = parse_config(twin_dir / "sam2" / "config.pbtxt")
    expected = parse_config(LAMBDA_SAM2)
    del expected.instance_group[0].gpus[:]
    expected.instance_group[0].kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert twin == expected  # the count, batching, tensors: all as the user wrote them
    served = twin_dir / "sam2"
    for path in ("1/model.py", "1/weights.bin", "1/lib/helpers.py", "2/model.py", "labels.txt"):
        assert (served / path).read_bytes() == (repo / "sam2" / path).read_bytes(), path
    assert not (served / "1" / "model.py").is_symlink()  # code is copied, data linked
    assert (served / "1" / "weights.bin").is_symlink()


def test_a_users_model_a_cpu_host_runs_as_it_is_is_not_copied(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    cpu = LAMBDA_SAM2.replace("KIND_GPU gpus: [ 0 ]", "KIND_CPU")
    _python_model(repo, "sam2", cpu, {"1/model.py": b"", "labels.txt": b"a\n"})
    _python_model(repo, "pre", _bare("pre"), {"1/model.py": b""})  # no instance group at all
    assert embedded_repository(repo) == repo
    assert not (tmp_path / "repo_embedded").exists()


def test_a_users_model_without_version_1_gets_none(tmp_path: Path) -> None:
    """An empty ``1/`` would be a version without a model file (refused under ``all``)."""
    repo = tmp_path / "repo"
    config = LAMBDA_SAM2 + "version_policy { all {} }\n"
    _python_model(repo, "sam2", config, {"3/model.py": b""})
    twin_dir = embedded_repository(repo)
    assert sorted(p.name for p in (twin_dir / "sam2").iterdir()) == ["3", "config.pbtxt"]


def test_a_users_python_model_with_an_onnx_file_parameter_is_still_the_users(
    tmp_path: Path,
) -> None:
    """Our runner's parameter name is no claim on a model that ships none of our code."""
    repo = tmp_path / "repo"
    config = LAMBDA_SAM2 + 'parameters { key: "onnx_file" value { string_value: "m.onnx" } }'
    _python_model(repo, "sam2", config, {"1/model.py": b""})
    twin = parse_config(embedded_repository(repo) / "sam2" / "config.pbtxt")
    assert twin.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU


def test_an_ensemble_is_served_as_it_is(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    ensemble = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling { step [ { model_name: "pre" model_version: -1
  input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] }
"""
    _python_model(repo, "pipeline", ensemble, {})
    _python_model(repo, "pre", _bare("pre"), {"1/model.py": b""})
    assert embedded_repository(repo) == repo


def test_a_backend_the_embedded_server_lacks_is_named(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _python_model(repo, "engine", 'name: "engine"\nplatform: "tensorrt_plan"\n', {"1/x": b""})
    with pytest.raises(RepositoryError) as info:
        embedded_repository(repo)
    message = str(info.value)
    assert "'engine'" in message and "tensorrt_plan" in message
    assert "onnxruntime, python and ensemble models only" in message


# -- a model of ours that is stale ---------------------------------------------------------------
def test_a_model_of_ours_without_a_kind_is_refused_with_what_to_do(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    files = {"1/model.py": b"", "1/triton_sam_serving/__init__.py": b""}
    _python_model(repo, "sam2_session", _bare("sam2_session"), files)
    _python_model(repo, "sam2", LAMBDA_SAM2, {"1/model.py": b""})
    with pytest.raises(RepositoryError) as info:
        embedded_repository(repo)
    message = str(info.value)
    assert "'sam2_session'" in message and "older triton-sam" in message
    assert "1/triton_sam_serving/" in message  # what it was recognised by
    assert "triton-sam setup" in message and "delete the folder sam2_session/" in message
    assert not (tmp_path / "repo_embedded").exists()


def test_a_kind_this_triton_sam_does_not_know_is_refused(tmp_path: Path) -> None:
    model = _artifact(_bare("x", KIND % "hologram"), ("model.py",))
    with pytest.raises(RepositoryError, match="'hologram'.*newer triton-sam"):
        writer.embedded_twin(model, "onnxruntime")


def test_an_old_runner_of_ours_without_a_kind_still_runs_as_it_is(tmp_path: Path) -> None:
    config = _bare("g", 'parameters { key: "onnx_file" value { string_value: "model.onnx" } }')
    model = _artifact(config, ("model.py", "model.onnx", "triton_sam_serving/__init__.py"))
    assert writer.embedded_twin(model, "onnxruntime") is model
