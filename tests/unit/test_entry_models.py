"""Entry models (repository/entry.py): the normalising graph, the ensemble config, how the
writer writes them and how the embedded server's CPU twin carries them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from triton_sam.models.naming import normalized_name
from triton_sam.models.registry import get_family
from triton_sam.repository.config import (
    RepositoryOptions,
    build_config,
    config_to_text,
    parse_config,
)
from triton_sam.repository.entry import (
    affine,
    entry_artifacts,
    entry_configs,
    normalizer_onnx,
)
from triton_sam.repository.writer import embedded_repository, onnx_artifact, write_models
from triton_sam.setup.paintera import ENTRIES, bundle_spec

GPU = RepositoryOptions(target="onnxruntime")
SAM1, SAM2, SAM3 = get_family("sam1"), get_family("sam2"), get_family("sam3")


def test_sam3s_minus_one_to_one_is_our_encoders_input_so_its_entry_is_a_rename():
    assert affine(SAM3, (-1.0, 1.0)) is None
    assert affine(SAM1, (0.0, 1.0)) == (0.0, 255.0)  # SamPredictor normalises 0-255 pixels
    assert affine(SAM2, (0.0, 1.0)) == (0.0, 1.0)  # SAM2Transforms normalises [0, 1]


@pytest.mark.parametrize(("family", "lo", "hi"), [(SAM1, 0.0, 1.0), (SAM2, 0.0, 1.0)])
def test_the_normalising_graph_gives_upstreams_input_up_to_float_rounding(
    tmp_path: Path, family, lo, hi
):
    ort = pytest.importorskip("onnxruntime")
    path = normalizer_onnx(tmp_path / "n.onnx", family, (lo, hi), "image")
    size = family.preprocessing.image_size
    u8 = np.random.default_rng(0).integers(0, 256, (1, 3, size, size)).astype(np.float32)
    sent = u8 * np.float32((hi - lo) / 255.0) + np.float32(lo)  # sam-link's intRGBtoCHW
    (ours,) = ort.InferenceSession(str(path)).run(None, {"image": sent})
    pre = family.preprocessing
    mean = np.reshape(pre.pixel_mean, (1, 3, 1, 1)).astype(np.float32)
    std = np.reshape(pre.pixel_std, (1, 3, 1, 1)).astype(np.float32)
    upstream = (u8 * np.float32(pre.pixel_scale) - mean) / std
    # sam-link's u8 * (1/255f) rounds once more than upstream's u8 / 255: a few ulps of the
    # normalised range (|x| <= 2.7), never more.
    assert np.abs(ours - upstream).max() <= 8 * np.finfo(np.float32).eps * 2.7


def test_the_ensemble_runs_the_normaliser_then_our_encoder_under_the_clients_names():
    entry = ENTRIES["sam1"]
    encoder = build_config(SAM1, "encoder", GPU, name=normalized_name("sam1_encoder"))
    ensemble, normalizer = entry_configs(entry, SAM1, encoder, GPU)
    assert normalizer is not None and normalizer.name == "sam1_encoder_pixels"
    assert (ensemble.name, ensemble.platform) == ("sam1_encoder", "ensemble")
    assert ensemble.max_batch_size == encoder.max_batch_size
    assert [(t.name, list(t.dims)) for t in ensemble.input] == [("image", [3, 1024, 1024])]
    assert [t.name for t in ensemble.output] == ["image_embeddings"]
    first, second = ensemble.ensemble_scheduling.step
    assert (first.model_name, dict(first.input_map)) == ("sam1_encoder_pixels", {"image": "image"})
    assert second.model_name == "sam1_encoder_normalized"
    assert dict(second.input_map) == {"image": dict(first.output_map)["normalized_pixels"]}
    assert dict(second.output_map) == {"image_embeddings": "image_embeddings"}
    assert parse_config(config_to_text(ensemble)) == ensemble  # write-then-parse round trip


def test_a_rename_entry_has_the_encoder_as_its_only_step():
    encoder = build_config(SAM3, "encoder", GPU)
    ensemble, normalizer = entry_configs(ENTRIES["sam3"], SAM3, encoder, GPU)
    assert normalizer is None
    (step,) = ensemble.ensemble_scheduling.step
    assert step.model_name == "sam3_encoder" and dict(step.input_map) == {
        "pixel_values": "pixel_values"
    }
    assert [t.name for t in ensemble.output] == [f"image_embeddings.{i}" for i in range(3)]
    assert all(t.data_type == encoder.output[0].data_type for t in ensemble.output)  # FP32


def test_only_sam1s_encoder_is_renamed_in_the_bundle():
    from triton_sam.models.registry import get_model

    assert bundle_spec(get_model("sam1_vit_b")).family.encoder_model == "sam1_encoder_normalized"
    assert bundle_spec(get_model("sam2.1_hiera_tiny")).family.encoder_model == "sam2_encoder"
    assert bundle_spec(get_model("sam3_tracker")).family.encoder_model == "sam3_encoder"


def _sam1_like_encoder(path: Path) -> Path:
    """A graph with SAM1's encoder contract (a 16x16 stride-16 conv), for the writer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.zeros((256, 3, 16, 16), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "w"], ["image_embeddings"], strides=[16, 16])],
        "sam1_like",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["b", 3, 1024, 1024])],
        [helper.make_tensor_value_info("image_embeddings", TensorProto.FLOAT, ["b", 256, 64, 64])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_the_writer_and_the_cpu_twin_carry_ensembles(tmp_path: Path):
    repo = tmp_path / "model_repository"
    served = build_config(SAM1, "encoder", GPU, name="sam1_encoder_normalized")
    entry = entry_artifacts(ENTRIES["sam1"], SAM1, served, GPU, tmp_path)
    # The encoder served at batch 1 (as a CPU twin serves a session model's encoder): the
    # ensemble, rendered for batch 4, must come down to it or Triton refuses to load it.
    served.max_batch_size = 1
    encoder = onnx_artifact(served, _sam1_like_encoder(tmp_path / "e.onnx"), target="onnxruntime")
    write_models(repo, [encoder, *entry])
    assert sorted(p.name for p in (repo / "sam1_encoder").iterdir()) == ["1", "config.pbtxt"]
    assert list((repo / "sam1_encoder" / "1").iterdir()) == []  # Triton needs the empty 1/
    twin = embedded_repository(repo)
    ensemble = parse_config(twin / "sam1_encoder" / "config.pbtxt")
    assert ensemble.platform == "ensemble" and (twin / "sam1_encoder" / "1").is_dir()
    assert ensemble.max_batch_size == 1
    assert (
        ensemble.ensemble_scheduling
        == parse_config(repo / "sam1_encoder" / "config.pbtxt").ensemble_scheduling
    )
    pixels = parse_config(twin / "sam1_encoder_pixels" / "config.pbtxt")
    assert pixels.platform == "onnxruntime_onnx"
    assert [g.kind for g in pixels.instance_group] == [pixels.instance_group[0].KIND_CPU]


def test_setup_paintera_writes_each_family_through_the_bundle(monkeypatch, tmp_path: Path):
    from typer.testing import CliRunner

    import triton_sam.setup.paintera as paintera
    from triton_sam.cli import app

    written = []

    def fake_family(spec, repository, **build_args):
        written.append((spec.name, build_args["random_init"], build_args["checkpoint"]))
        build = type(
            "Build", (), {"models": (), "metadata": {}, "onnx_bytes": {}, "not_written": {}}
        )()
        build.export = type("Export", (), {"max_abs_error": {}})()
        return paintera.PainteraFamily(build, (f"{spec.family.family}_entry",))

    monkeypatch.setattr(paintera, "build_paintera_family", fake_family)
    args = [
        "setup",
        "paintera",
        "--random-init",
        "-r",
        str(tmp_path),
        "--sam2",
        "sam2.1_hiera_tiny",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert written == [
        ("sam1_vit_h", True, None),
        ("sam2.1_hiera_tiny", True, None),
        ("sam3_tracker", True, None),
    ]
    assert "http://<host>:8001" in result.output
