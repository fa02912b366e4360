"""Fine-tuned checkpoints: any file of the variant's architecture exports with plain
``--checkpoint FILE``; a file of another architecture gets a structural error.

The session exports (tests/conftest.py) already go through ``obtain_checkpoint`` with seeded
random checkpoints that are not the published files; here we check what they recorded, the
CLI flag end to end, and the errors for wrong architectures.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from triton_sam.errors import CheckpointError
from triton_sam.export import sam2
from triton_sam.export.optimize import FUSED_METADATA_KEY
from triton_sam.models import get_model
from triton_sam.models.checkpoints import checkpoint_sha256

slow = pytest.mark.slow


def _onnx_metadata(path: Path) -> dict[str, str]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}


def _shaped_like(structure: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """A state dict with these shapes that costs one float per tensor on disk (stride 0)."""
    return {
        k: torch.zeros(1).expand(*shape) if shape else torch.zeros(())
        for k, shape in structure.items()
    }


@slow
@pytest.mark.parametrize(
    ("build", "variant"),
    [
        ("sam2_tiny_build", "sam2.1_hiera_tiny"),
        ("sam1_vit_b_build", "sam1_vit_b"),
        ("sam3_build", "sam3_tracker"),
    ],
)
def test_a_non_published_checkpoint_exports_and_its_sha256_is_recorded(build, variant, request):
    repo, result = request.getfixturevalue(build)
    checkpoint = result.checkpoint
    assert checkpoint is not None
    expected = {
        "triton_sam.variant": variant,
        "triton_sam.checkpoint": checkpoint.name,
        "triton_sam.checkpoint_sha256": checkpoint_sha256(checkpoint),
        "triton_sam.checkpoint_origin": "user",
    }
    assert result.metadata == expected
    for model in result.models:
        meta = _onnx_metadata(repo / model / "1" / "model.onnx")
        # The served CPU twin's fused encoder keeps the provenance and says it was fused.
        meta.pop(FUSED_METADATA_KEY, None)
        assert meta == expected


@slow
def test_cli_export_takes_a_fine_tuned_checkpoint_with_no_override(sam2_tiny_checkpoint, tmp_path):
    from typer.testing import CliRunner

    from triton_sam.cli import app

    mine = tmp_path / "my_finetuned.pt"
    shutil.copy(sam2_tiny_checkpoint, mine)
    repo = tmp_path / "repo"
    result = CliRunner().invoke(
        app,
        [
            "export",
            "sam2.1_hiera_tiny",
            "--checkpoint",
            str(mine),
            "--repository",
            str(repo),
            "--target",
            "python",
            "export.verify=false",
            f"paths.checkpoints={tmp_path / 'checkpoints'}",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"sha256 {checkpoint_sha256(mine)} (user" in result.output
    meta = _onnx_metadata(repo / "sam2_encoder" / "1" / "model.onnx")
    assert meta["triton_sam.checkpoint"] == "my_finetuned.pt"


def test_a_vit_l_file_given_for_vit_b_names_both_and_the_keys(tmp_path):
    from triton_sam.export import sam1

    vit_l = tmp_path / "sam_vit_l_finetuned.pth"
    torch.save(_shaped_like(sam1.structure(get_model("sam1_vit_l"))), vit_l)
    with pytest.raises(CheckpointError) as err:
        sam1.build_model(get_model("sam1_vit_b"), vit_l)
    message = str(err.value)
    assert "does not match the architecture of sam1_vit_b" in message
    assert (
        "keys with other shapes (first: image_encoder.pos_embed: file [1, 64, 64, 1024]" in message
    )
    assert "unexpected keys (first: image_encoder.blocks.12." in message
    assert "matches sam1_vit_l instead" in message
    assert "download" not in message  # never tells the user to replace their own file


@slow
def test_a_sam2_small_file_given_for_tiny_names_small(tmp_path):
    from triton_sam.export import sam2

    small = tmp_path / "small.pt"
    torch.save({"model": _shaped_like(sam2.structure(get_model("sam2.1_hiera_small")))}, small)
    with pytest.raises(CheckpointError) as err:
        sam2.build_model(get_model("sam2.1_hiera_tiny"), small)
    message = str(err.value)
    assert "does not match the architecture of sam2.1_hiera_tiny" in message
    assert "matches sam2.1_hiera_small instead" in message
    assert re.search(r"\d+ unexpected keys \(first: image_encoder\.trunk\.blocks\.", message)


def test_a_file_of_no_known_variant_says_what_it_must_be(tmp_path):
    from triton_sam.export import sam1

    structure = sam1.structure(get_model("sam1_vit_b"))
    structure["mask_decoder.iou_token.weight"] = (2, 256)  # one shape edited
    odd = tmp_path / "odd.pth"
    torch.save(_shaped_like(structure), odd)
    with pytest.raises(CheckpointError, match="It must be a sam1 checkpoint of the sam1_vit_b"):
        sam1.build_model(get_model("sam1_vit_b"), odd)


def test_a_sam3_directory_whose_weights_do_not_fit_its_config(tmp_path, sam3_small_checkpoint):
    from triton_sam.export import sam3

    edited = tmp_path / "sam3_edited"
    shutil.copytree(sam3_small_checkpoint, edited)
    config = json.loads((edited / "config.json").read_text())
    config["mask_decoder_config"]["mlp_dim"] *= 2
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        sam3.build_model(get_model("sam3_tracker"), edited)
    message = str(err.value)
    assert "does not match the architecture of its config.json" in message
    assert "keys with other shapes (first: mask_decoder.transformer.layers.0.mlp" in message


def _setup_video(*args: str):
    from typer.testing import CliRunner

    from triton_sam.cli import app

    return CliRunner().invoke(app, ["setup-video", "sam2.1_hiera_tiny", *args])


def test_setup_video_checks_the_given_checkpoint_against_the_architecture(tmp_path):
    """The file given reaches the exporter's structural check (not the published file)."""
    small = tmp_path / "my_small_finetune.pt"
    torch.save({"model": _shaped_like(sam2.structure(get_model("sam2.1_hiera_small")))}, small)
    result = _setup_video(
        "--checkpoint", str(small), "--repository", str(tmp_path / "repo"),
        f"paths.checkpoints={tmp_path / 'checkpoints'}",
    )  # fmt: skip
    assert isinstance(result.exception, CheckpointError), result.output
    assert "does not match the architecture of sam2.1_hiera_tiny" in str(result.exception)
    assert "matches sam2.1_hiera_small instead" in str(result.exception)
    assert not (tmp_path / "checkpoints").exists()  # nothing downloaded


def test_setup_video_names_a_missing_checkpoint(tmp_path):
    result = _setup_video("--checkpoint", str(tmp_path / "nowhere.pt"))
    assert isinstance(result.exception, CheckpointError)
    assert "nowhere.pt does not exist" in str(result.exception)


@slow
def test_setup_video_exports_a_fine_tuned_checkpoint(sam2_tiny_spec, tmp_path):
    """A seeded checkpoint that is not ours, every video graph checked against torch."""
    from triton_sam.export import save_random_checkpoint

    mine = save_random_checkpoint(sam2_tiny_spec, tmp_path / "my_finetuned.pt", seed=5)
    repo = tmp_path / "repo"
    result = _setup_video(
        "--checkpoint", str(mine), "--repository", str(repo), "--target", "python",
        f"paths.checkpoints={tmp_path / 'checkpoints'}",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "onnxruntime vs torch max abs error over the graphs" in result.output
    assert (repo / "sam2_tracker" / "config.pbtxt").is_file()
