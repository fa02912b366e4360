"""Repository writer: layout, atomic replacement, crash recovery, pairs and embedded twins
(CPU twins on the onnxruntime backend, or runner twins)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from triton_sam.errors import InputValidationError, RepositoryError
from triton_sam.models.sam2 import SAM2_FAMILY
from triton_sam.models.spec import TensorSpec
from triton_sam.repository import writer
from triton_sam.repository.config import (
    RepositoryOptions,
    parse_config,
    render_config,
    to_cpu_twin,
    unbatched_cpu_decoder,
    with_warmup,
)
from triton_sam.repository.writer import (
    embedded_repository,
    list_models,
    write_model,
    write_pair,
)

PYTHON = RepositoryOptions(target="python")
GPU = RepositoryOptions(target="onnxruntime")


def _config(target: str, name: str = "sam2_encoder") -> str:
    return render_config(SAM2_FAMILY, "encoder", RepositoryOptions(target=target), name)


def _file(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def _hidden(repo: Path) -> list[str]:
    """Hidden entries in the repository, and staging/retired leftovers beside it."""
    inside = [p.name for p in repo.iterdir() if p.name.startswith(".")]
    beside = [p.name for p in repo.parent.iterdir() if p.name.startswith(f".{repo.name}.")]
    return sorted(inside + beside)


def _tiny_onnx(path: Path, *, external: bool = False) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    # raw bytes: only raw_data tensors can move to an external-data file
    weight = onnx.numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["image", "w"], ["image_embed"])],
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("image_embed", TensorProto.FLOAT, ["b", 4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=external,
        location=path.stem + ".onnx_data",
        size_threshold=0,
    )
    return path


def test_layout_python_target(tmp_path: Path) -> None:
    onnx_path = _file(tmp_path / "encoder.onnx", b"graph")
    sidecar = _file(tmp_path / "encoder.onnx_data", b"weights")
    repo = tmp_path / "repo"
    dest = write_model(
        repo,
        "sam2_encoder",
        onnx_path,
        _config("python"),
        target="python",
        external_data_files=[sidecar],
    )
    assert dest == repo / "sam2_encoder"
    assert (dest / "config.pbtxt").read_text() == _config("python")
    assert (dest / "1" / "model.onnx").read_bytes() == b"graph"
    assert (dest / "1" / "encoder.onnx_data").read_bytes() == b"weights"
    assert (dest / "1" / "model.py").read_text() == writer.RUNNER_SOURCE.read_text()
    assert _hidden(repo) == []


def test_onnxruntime_target_has_no_runner(tmp_path: Path) -> None:
    onnx_path = _file(tmp_path / "e.onnx", b"graph")
    dest = write_model(
        tmp_path / "repo", "sam2_encoder", onnx_path, _config("onnxruntime"), target="onnxruntime"
    )
    assert sorted(p.name for p in (dest / "1").iterdir()) == ["model.onnx"]


def test_rewrite_replaces_the_model(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for content in (b"old", b"new"):
        onnx_path = _file(tmp_path / "e.onnx", content)
        write_model(repo, "sam2_encoder", onnx_path, _config("python"), target="python")
    assert (repo / "sam2_encoder" / "1" / "model.onnx").read_bytes() == b"new"
    assert _hidden(repo) == []


def test_failure_mid_write_keeps_the_previous_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    write_model(
        repo, "sam2_encoder", _file(tmp_path / "e.onnx", b"v1"), _config("python"), target="python"
    )
    calls = []

    def copy_then_fail(source: Path, dest: Path) -> None:
        calls.append(dest)
        if len(calls) == 2:  # model.onnx is written, model.py is not
            raise OSError(28, "No space left on device")
        dest.write_bytes(source.read_bytes())

    monkeypatch.setattr(writer, "_copy", copy_then_fail)
    with pytest.raises(RepositoryError, match="No space left") as info:
        write_model(
            repo,
            "sam2_encoder",
            _file(tmp_path / "e.onnx", b"v2"),
            _config("python"),
            target="python",
        )
    assert str(repo / "sam2_encoder") in str(info.value)
    assert (repo / "sam2_encoder" / "1" / "model.onnx").read_bytes() == b"v1"
    assert (repo / "sam2_encoder" / "1" / "model.py").is_file()
    assert _hidden(repo) == []


def test_interrupt_mid_write_leaves_no_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(source: Path, dest: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "_copy", interrupted)
    repo = tmp_path / "repo"
    with pytest.raises(KeyboardInterrupt):
        write_model(
            repo,
            "sam2_encoder",
            _file(tmp_path / "e.onnx", b"v"),
            _config("python"),
            target="python",
        )
    assert list(repo.iterdir()) == []


def test_failed_swap_restores_the_previous_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    write_model(
        repo, "sam2_encoder", _file(tmp_path / "e.onnx", b"v1"), _config("python"), target="python"
    )
    real_rename = os.rename

    def rename(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        if ".staging-" in Path(src).name:  # "new in" fails after "old aside" succeeded
            raise OSError(5, "I/O error")
        real_rename(src, dst)

    monkeypatch.setattr(writer.os, "rename", rename)
    with pytest.raises(RepositoryError, match="I/O error"):
        write_model(
            repo,
            "sam2_encoder",
            _file(tmp_path / "e.onnx", b"v2"),
            _config("python"),
            target="python",
        )
    assert (repo / "sam2_encoder" / "1" / "model.onnx").read_bytes() == b"v1"
    assert _hidden(repo) == []


def test_staging_never_appears_inside_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Triton loads every subdirectory of the repository, hidden ones too.
    repo = tmp_path / "repo"
    seen: list[Path] = []
    real_fill = writer._fill

    def spy(staging: Path, *args, **kwargs) -> None:
        seen.append(staging)
        real_fill(staging, *args, **kwargs)

    monkeypatch.setattr(writer, "_fill", spy)
    write_model(
        repo, "sam2_encoder", _file(tmp_path / "e.onnx", b"v1"), _config("python"), target="python"
    )
    assert seen and all(p.parent == tmp_path for p in seen)


def test_next_write_recovers_from_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A crash between "old aside" and "new in": the model only exists as a retired dir,
    # next to a half-built staging dir.
    repo = tmp_path / "repo"
    write_model(
        repo, "sam2_encoder", _file(tmp_path / "e.onnx", b"v1"), _config("python"), target="python"
    )
    os.rename(repo / "sam2_encoder", tmp_path / ".repo.sam2_encoder.old-abc")
    (tmp_path / ".repo.sam2_encoder.staging-def" / "1").mkdir(parents=True)
    assert list_models(repo) == []

    def fail(source: Path, dest: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "_copy", fail)
    with pytest.raises(RepositoryError):
        write_model(
            repo,
            "sam2_encoder",
            _file(tmp_path / "e.onnx", b"v2"),
            _config("python"),
            target="python",
        )
    assert (repo / "sam2_encoder" / "1" / "model.onnx").read_bytes() == b"v1"
    assert _hidden(repo) == []


def test_inconsistent_arguments_are_refused(tmp_path: Path) -> None:
    onnx_path = _file(tmp_path / "e.onnx", b"graph")
    repo = tmp_path / "repo"
    with pytest.raises(RepositoryError, match="equal the directory name"):
        write_model(repo, "other_name", onnx_path, _config("python"), target="python")
    with pytest.raises(RepositoryError, match="same target"):
        write_model(repo, "sam2_encoder", onnx_path, _config("onnxruntime"), target="python")
    with pytest.raises(InputValidationError, match="target"):
        write_model(repo, "sam2_encoder", onnx_path, _config("python"), target="tflite")  # type: ignore[arg-type]
    with pytest.raises(InputValidationError, match="name"):
        write_model(repo, "../sam2_encoder", onnx_path, _config("python"), target="python")
    clash = _file(tmp_path / "model.py", b"weights")
    with pytest.raises(RepositoryError, match="external-data file"):
        write_model(
            repo,
            "sam2_encoder",
            onnx_path,
            _config("python"),
            target="python",
            external_data_files=[clash],
        )
    missing = tmp_path / "missing.onnx"
    with pytest.raises(RepositoryError, match=str(missing)):
        write_model(repo, "sam2_encoder", missing, _config("python"), target="python")
    assert not (repo / "sam2_encoder").exists()


def test_list_models(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("b_model", "a_model"):
        write_model(
            repo, name, _file(tmp_path / "e.onnx", b"g"), _config("python", name), target="python"
        )
    (repo / "not_a_model").mkdir()
    (repo / ".hidden" / "1").mkdir(parents=True)
    (repo / ".hidden" / "config.pbtxt").write_text('name: ".hidden"')
    assert list_models(repo) == ["a_model", "b_model"]
    with pytest.raises(RepositoryError, match="not found"):
        list_models(tmp_path / "nowhere")


def test_write_pair_carries_external_data(tmp_path: Path) -> None:
    encoder = _tiny_onnx(tmp_path / "encoder.onnx", external=True)
    decoder = _tiny_onnx(tmp_path / "decoder.onnx")
    repo = tmp_path / "repo"
    names = write_pair(
        repo, SAM2_FAMILY, encoder_onnx=encoder, decoder_onnx=decoder, options=PYTHON
    )
    assert names == ("sam2_encoder", "sam2_decoder")
    assert list_models(repo) == ["sam2_decoder", "sam2_encoder"]
    assert (repo / "sam2_encoder" / "1" / "encoder.onnx_data").is_file()
    assert sorted(p.name for p in (repo / "sam2_decoder" / "1").iterdir()) == [
        "model.onnx",
        "model.py",
        "triton_sam_serving",  # the runner's protocol
    ]
    assert parse_config(repo / "sam2_decoder" / "config.pbtxt").backend == "python"


def _write_versioned_pair(repo: Path, tmp_path: Path, tag: bytes) -> None:
    encoder = _tiny_onnx(tmp_path / "encoder.onnx")
    decoder = _tiny_onnx(tmp_path / "decoder.onnx")
    write_pair(repo, SAM2_FAMILY, encoder_onnx=encoder, decoder_onnx=decoder, options=PYTHON)
    for name in ("sam2_encoder", "sam2_decoder"):
        (repo / name / "1" / "model.onnx").write_bytes(tag)  # mark which write this was


def test_a_pair_whose_decoder_fails_to_copy_leaves_both_old_models(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    _write_versioned_pair(repo, tmp_path, b"old")
    real_copy = writer._copy

    def disk_full_on_the_decoder(source: Path, dest: Path) -> None:
        if source.name == "decoder.onnx":
            raise OSError(28, "No space left on device")
        real_copy(source, dest)

    monkeypatch.setattr(writer, "_copy", disk_full_on_the_decoder)
    encoder = _tiny_onnx(tmp_path / "encoder.onnx")
    decoder = _tiny_onnx(tmp_path / "decoder.onnx")
    with pytest.raises(RepositoryError, match="sam2_decoder.*No space left"):
        write_pair(repo, SAM2_FAMILY, encoder_onnx=encoder, decoder_onnx=decoder, options=PYTHON)
    # the encoder was fully staged, yet neither model changed: never a mismatched pair
    for name in ("sam2_encoder", "sam2_decoder"):
        assert (repo / name / "1" / "model.onnx").read_bytes() == b"old"
    assert _hidden(repo) == []


def test_a_pair_whose_second_rename_fails_puts_the_first_back(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    _write_versioned_pair(repo, tmp_path, b"old")
    real_rename, calls = os.rename, []

    def fail_the_decoder_swap(src, dst) -> None:
        calls.append(Path(dst).name)
        if Path(dst).name == "sam2_decoder" and ".staging-" in Path(src).name:
            raise OSError(5, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(writer.os, "rename", fail_the_decoder_swap)
    encoder = _tiny_onnx(tmp_path / "encoder.onnx")
    decoder = _tiny_onnx(tmp_path / "decoder.onnx")
    with pytest.raises(RepositoryError, match="sam2_decoder.*left unchanged"):
        write_pair(repo, SAM2_FAMILY, encoder_onnx=encoder, decoder_onnx=decoder, options=PYTHON)
    assert "sam2_encoder" in calls  # the encoder had been swapped in, then put back
    for name in ("sam2_encoder", "sam2_decoder"):
        assert (repo / name / "1" / "model.onnx").read_bytes() == b"old"
    assert _hidden(repo) == []


# A family whose contract is _tiny_onnx's graph: image [4] -> image_embed [4].
TINY = dataclasses.replace(
    SAM2_FAMILY,
    family="tiny",
    encoder_inputs=(TensorSpec("image", "float32", (4,)),),
    encoder_outputs=(TensorSpec("image_embed", "float32", (4,)),),
    decoder_inputs=(TensorSpec("image", "float32", (4,)),),
    decoder_outputs=(TensorSpec("image_embed", "float32", (4,)),),
    encoder_model="tiny_encoder",
    decoder_model="tiny_decoder",
)


GPU_TRT = RepositoryOptions(target="onnxruntime", tensorrt_fp16=True, instance_count=2)


def _gpu_pair(tmp_path: Path) -> Path:
    encoder = _tiny_onnx(tmp_path / "encoder.onnx", external=True)
    decoder = _tiny_onnx(tmp_path / "decoder.onnx")
    repo = tmp_path / "model_repository"
    write_pair(repo, TINY, encoder_onnx=encoder, decoder_onnx=decoder, options=GPU_TRT)
    return repo


def test_embedded_twin_of_a_gpu_repository_on_the_onnxruntime_backend(tmp_path: Path) -> None:
    repo = _gpu_pair(tmp_path)
    twin = embedded_repository(repo)
    assert twin == tmp_path / "model_repository_embedded"
    assert list_models(twin) == list_models(repo)
    version_dir = twin / "tiny_encoder" / "1"
    assert (version_dir / "model.onnx").resolve() == (repo / "tiny_encoder/1/model.onnx").resolve()
    assert (version_dir / "encoder.onnx_data").is_symlink()
    assert sorted(p.name for p in version_dir.iterdir()) == ["encoder.onnx_data", "model.onnx"]
    for name in ("tiny_encoder", "tiny_decoder"):
        production = parse_config(repo / name / "config.pbtxt")
        served = parse_config(twin / name / "config.pbtxt")
        assert served == to_cpu_twin(production)  # the mechanical CPU changes, nothing else
        assert served.platform == "onnxruntime_onnx" and served.instance_group[0].count == 2
    assert embedded_repository(twin) == twin  # already CPU: served as is


def test_embedded_twin_on_the_python_runner(tmp_path: Path) -> None:
    repo = _gpu_pair(tmp_path)
    twin = embedded_repository(repo, target="python")
    version_dir = twin / "tiny_encoder" / "1"
    assert (version_dir / "model.py").is_file() and not (version_dir / "model.py").is_symlink()
    assert (version_dir / "encoder.onnx_data").is_symlink()
    config = parse_config(twin / "tiny_encoder" / "config.pbtxt")
    assert (config.backend, config.platform) == ("python", "")
    assert embedded_repository(twin, target="python") == twin  # already python: as is
    # Switching back rewrites the twins in place.
    assert parse_config(
        embedded_repository(repo) / "tiny_encoder" / "config.pbtxt"
    ).platform == "onnxruntime_onnx"  # fmt: skip
    with pytest.raises(InputValidationError, match="target"):
        embedded_repository(repo, target="tensorrt")  # type: ignore[arg-type]


def test_embedded_twin_is_a_function_of_the_artifact(tmp_path: Path) -> None:
    """Config and file references in, twin config and references out; nothing is written."""
    repo = _gpu_pair(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    model = writer.read_model(repo, "tiny_encoder")
    cpu = writer.embedded_twin(model, "onnxruntime")
    assert cpu.files == model.files
    assert parse_config(cpu.config_text) == to_cpu_twin(parse_config(model.config_text))
    runner = writer.embedded_twin(model, "python")
    assert set(runner.files) - set(model.files) >= {"model.py", "triton_sam_serving/__init__.py"}
    assert parse_config(runner.config_text).backend == "python"
    assert writer.embedded_twin(runner, "python") is runner  # already a CPU model
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    missing = dataclasses.replace(model, files={})
    with pytest.raises(RepositoryError, match="triton-sam setup"):
        writer.embedded_twin(missing, "onnxruntime")


def test_embedded_twin_refuses_a_graph_the_onnxruntime_backend_would_refuse(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    graph = _tiny_onnx(tmp_path / "encoder.onnx")  # not the SAM2 encoder's contract
    write_model(repo, "sam2_encoder", graph, _config("onnxruntime"), target="onnxruntime")
    with pytest.raises(RepositoryError) as info:
        embedded_repository(repo)
    message = str(info.value)
    assert "output 'image_embed': the graph declares [-1, 4]" in message
    assert "output 'high_res_feats_0' is not in the graph" in message
    assert not (tmp_path / "repo_embedded").exists()
    # The runner does not compare dims at load: that fallback is not refused here.
    assert embedded_repository(repo, target="python") == tmp_path / "repo_embedded"


def test_write_pair_refuses_graphs_the_gpu_container_would_refuse(tmp_path: Path) -> None:
    encoder = _tiny_onnx(tmp_path / "encoder.onnx")
    decoder = _tiny_onnx(tmp_path / "decoder.onnx")
    repo = tmp_path / "repo"
    repo.mkdir()
    with pytest.raises(RepositoryError, match="onnxruntime backend would refuse"):
        write_pair(repo, SAM2_FAMILY, encoder_onnx=encoder, decoder_onnx=decoder, options=GPU)
    assert list_models(repo) == [] and _hidden(repo) == []  # nothing written


def test_embedded_twin_of_an_empty_repository(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    with pytest.raises(RepositoryError, match="no models"):
        embedded_repository(tmp_path / "repo")


def test_embedded_twin_of_configs_without_exports_says_to_run_setup(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "sam2_encoder").mkdir(parents=True)
    (repo / "sam2_encoder" / "config.pbtxt").write_text(_config("onnxruntime"))
    with pytest.raises(RepositoryError, match="triton-sam setup"):
        embedded_repository(repo)


def test_the_decoder_behind_a_session_model_is_sized_for_the_host(tmp_path: Path) -> None:
    from triton_sam.repository.config import bounded_cpu_encoder, size_cpu_decoder
    from triton_sam.repository.session_config import SessionOptions, write_session

    repo = _gpu_pair(tmp_path)
    write_session(repo, TINY, GPU_TRT, SessionOptions())
    twin = embedded_repository(repo)
    cores = len(os.sched_getaffinity(0))
    production = {
        n: parse_config(repo / n / "config.pbtxt") for n in ("tiny_encoder", "tiny_decoder")
    }
    served = {n: parse_config(twin / n / "config.pbtxt") for n in production}
    # mechanical, but for its batch (bounded_cpu_encoder)
    assert served["tiny_encoder"] == bounded_cpu_encoder(to_cpu_twin(production["tiny_encoder"]))
    assert served["tiny_decoder"] == with_warmup(
        size_cpu_decoder(to_cpu_twin(production["tiny_decoder"]), cores)
    )
    assert served["tiny_decoder"].parameters["intra_op_thread_count"].string_value
    # The session model's clicks run on an unbatched copy (same files); clients calling the
    # decoder directly keep its batcher.
    assert served["tiny_decoder"].HasField("dynamic_batching")
    session = parse_config(twin / "tiny_session" / "config.pbtxt")
    assert session.parameters["decoder_model"].string_value == "tiny_decoder_unbatched"
    unbatched = parse_config(twin / "tiny_decoder_unbatched" / "config.pbtxt")
    assert unbatched == unbatched_cpu_decoder(served["tiny_decoder"])
    assert not unbatched.HasField("dynamic_batching")
    instances = sum(g.count for g in unbatched.instance_group)
    assert session.parameters["decoder_slots"].string_value == str(instances + 1)
    assert (twin / "tiny_decoder_unbatched" / "1" / "model.onnx").resolve() == (
        repo / "tiny_decoder" / "1" / "model.onnx"
    ).resolve()
    assert embedded_repository(twin) == twin  # a twin is served as it is


@pytest.mark.parametrize(
    ("given", "served"), [((4, 32), ("1", "16")), ((4, 16), ("1", "16")), ((1, 2), ("1", "2"))]
)
def test_a_cpu_host_encodes_one_image_at_a_time(
    tmp_path: Path, given: tuple[int, int], served: tuple[str, str]
) -> None:
    from triton_sam.repository.session_config import SessionOptions, write_session

    repo = _gpu_pair(tmp_path)
    options = SessionOptions(max_concurrent_embeds=given[0], max_waiting_embeds=given[1])
    write_session(repo, TINY, GPU_TRT, options)
    twin = embedded_repository(repo)
    session = parse_config(twin / "tiny_session" / "config.pbtxt").parameters
    assert (
        session["max_concurrent_embeds"].string_value,
        session["max_waiting_embeds"].string_value,
    ) == served  # lowered to the CPU's bounds, never raised
    assert parse_config(twin / "tiny_encoder" / "config.pbtxt").max_batch_size == 1
    production = parse_config(repo / "tiny_encoder" / "config.pbtxt")
    assert production.max_batch_size == GPU_TRT.encoder_max_batch_size  # GPU: not changed
    decoder = parse_config(twin / "tiny_decoder" / "config.pbtxt")
    assert decoder.max_batch_size == GPU_TRT.decoder_max_batch_size


def test_only_a_decoder_a_session_model_calls_gets_an_unbatched_copy(
    tmp_path: Path, monkeypatch
) -> None:
    from triton_sam.repository.session_config import SessionOptions, write_session

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    repo = _gpu_pair(tmp_path)
    write_session(repo, TINY, GPU_TRT, SessionOptions())
    twin = embedded_repository(repo, background_encoder=False)
    assert list_models(twin) == sorted([*list_models(repo), "tiny_decoder_unbatched"])
    for name in ("tiny_decoder", "tiny_decoder_unbatched"):  # 2 cores: 1 instance x 2 threads
        config = parse_config(twin / name / "config.pbtxt")
        assert [g.count for g in config.instance_group] == [1]
        assert config.parameters["intra_op_thread_count"].string_value == "2"
    session = parse_config(twin / "tiny_session" / "config.pbtxt")
    assert session.parameters["decoder_slots"].string_value == "2"
    # Without a session model nothing calls it, so none is made.
    (tmp_path / "bare").mkdir()
    bare = embedded_repository(_gpu_pair(tmp_path / "bare"))
    assert "tiny_decoder_unbatched" not in list_models(bare)
    # The python runner fallback keeps its decoder as the production config has it.
    runner_dir = embedded_repository(repo, target="python")
    runner = parse_config(runner_dir / "tiny_decoder" / "config.pbtxt")
    assert runner.instance_group[0].count == 2
    assert "tiny_decoder_unbatched" not in list_models(runner_dir)


def test_the_session_models_embeds_run_on_a_niced_copy_of_its_encoder(
    tmp_path: Path, monkeypatch
) -> None:
    """Clicks keep the cores during a storm of embeds: the encoder a session model calls
    gets a background copy (same graph, python runner, lower CPU priority); clients calling
    the encoder directly keep the onnxruntime one."""
    from triton_sam.repository.session_config import SessionOptions, write_session

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    repo = _gpu_pair(tmp_path)
    write_session(repo, TINY, GPU_TRT, SessionOptions())
    twin = embedded_repository(repo)
    assert "tiny_encoder_background" in list_models(twin)
    session = parse_config(twin / "tiny_session" / "config.pbtxt")
    assert session.parameters["encoder_model"].string_value == "tiny_encoder_background"
    # image ids stay those the clients compute from the encoder they know
    assert session.parameters["encoder_identity"].string_value == "tiny_encoder"
    background = parse_config(twin / "tiny_encoder_background" / "config.pbtxt")
    assert background.backend == "python"
    assert background.parameters["nice"].string_value == "10"
    assert background.parameters["intra_op_threads"].string_value == "2"
    encoder = parse_config(twin / "tiny_encoder" / "config.pbtxt")
    assert encoder.platform == "onnxruntime_onnx"  # the stateless path's encoder as it was
    version = twin / "tiny_encoder_background" / "1"
    assert (version / "model.py").read_text() == (
        Path(__file__).resolve().parents[2] / "triton_sam/serving/runner_model.py"
    ).read_text()
    assert (version / "model.onnx").resolve() == (twin / "tiny_encoder/1/model.onnx").resolve()
    # Off: the session model calls the onnxruntime encoder.
    plain = embedded_repository(repo, tmp_path / "plain", background_encoder=False)
    assert "tiny_encoder_background" not in list_models(plain)
