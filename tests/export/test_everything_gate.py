"""The everything decoder's export gate (``export/everything.py``) on SAM2.1-tiny checkpoints
that are not ours: it passes several seeds whose mask heads are scaled to the logit magnitudes
of real SAM checkpoints (tens; a 1e-5 absolute bound on stability refused such a checkpoint),
and it still refuses a graph with a planted bug in its stability score. A refused everything
decoder does not take the rest of the repository down: the pair and the session model are
written, and the refusal is returned and logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from triton_sam.errors import ExportValidationError
from triton_sam.export import ExportOptions, save_random_checkpoint
from triton_sam.serving import everything as ev

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HEAD_SCALE = 40.0  # mask logits |mean| ~12, max ~100 on random features: SAM's magnitudes
SEEDS = [2, 3]


def _checkpoint(spec, seed: int, directory: Path) -> Path:
    """A seeded random-init checkpoint whose mask logits are ``HEAD_SCALE`` times larger: the
    last layer of each hypernetwork MLP (the mask = its output . the upscaled embedding)."""
    path = save_random_checkpoint(spec, directory / f"seed{seed}.pt", seed=seed)
    state = torch.load(path, weights_only=True)
    head = "sam_mask_decoder.output_hypernetworks_mlps."
    scaled = {
        k: v * HEAD_SCALE if k.startswith(head) and ".layers.2." in k else v
        for k, v in state["model"].items()
    }
    torch.save({"model": scaled}, path)
    return path


@pytest.fixture(scope="module")
def gated_exports(sam2_tiny_spec, tmp_path_factory):
    """seed -> (checkpoint, everything decoder exported through the gate), each built once."""
    from triton_sam.export.everything import export_for_spec

    built: dict[int, tuple[Path, Path]] = {}

    def get(seed: int) -> tuple[Path, Path]:
        if seed not in built:
            work = tmp_path_factory.mktemp(f"everything_seed{seed}")
            checkpoint = _checkpoint(sam2_tiny_spec, seed, work)
            built[seed] = checkpoint, export_for_spec(sam2_tiny_spec, checkpoint, work / "onnx")
        return built[seed]

    return get


@pytest.mark.parametrize("seed", SEEDS)
def test_the_gate_passes_realistic_logit_magnitudes(gated_exports, sam2_tiny_spec, seed):
    from triton_sam.export import exporter_for
    from triton_sam.export.everything import verify_graph

    checkpoint, path = gated_exports(seed)  # export_for_spec raised if the gate refused
    model = exporter_for(sam2_tiny_spec).build_model(sam2_tiny_spec, checkpoint)
    verify_graph(model, "sam2", path, seed=seed + 10)  # and on other features


def _planted(bug: str):
    """The everything decoder with a bug in the cut-offs of its stability score."""
    from triton_sam.export.everything import EverythingDecoder

    class Planted(EverythingDecoder):
        def forward(self, *inputs: torch.Tensor):
            first = 1 if self.family == "sam1" else 3
            names = list(ev.GRAPH_INPUTS)
            high = first + names.index(ev.IN_STABILITY_HIGH)
            low = first + names.index(ev.IN_STABILITY_LOW)
            args = list(inputs)
            if bug == "offset":  # the upper cut-off a quarter logit off
                args[high] = args[high] + 0.25
            else:  # "flipped": the cut-offs swapped
                args[high], args[low] = args[low], args[high]
            return super().forward(*args)

    return Planted


@pytest.mark.parametrize("bug", ["offset", "flipped"])
def test_the_gate_refuses_a_planted_bug(gated_exports, sam2_tiny_spec, monkeypatch, tmp_path, bug):
    from triton_sam.export import everything, exporter_for

    checkpoint, _ = gated_exports(SEEDS[0])
    model = exporter_for(sam2_tiny_spec).build_model(sam2_tiny_spec, checkpoint)
    with monkeypatch.context() as patch:
        patch.setattr(everything, "EverythingDecoder", _planted(bug))
        path = everything.export_everything_decoder(model, "sam2", tmp_path / "planted.onnx")
    with pytest.raises(ExportValidationError, match=ev.OUT_STABILITY) as refused:
        everything.verify_graph(model, "sam2", path)
    assert all(ev.OUT_STABILITY in line for line in refused.value.mismatches)


def test_stability_bound_counts_pixels():
    from triton_sam.export.everything import VERIFY_STABILITY_PIXELS, stability_bound

    masks = np.zeros((3, 10, 20), bool)
    masks[0] = True  # 200 pixels
    masks[1, :2, :5] = True  # 10 pixels; masks[2] empty
    bound = stability_bound(masks)
    assert bound.tolist() == [VERIFY_STABILITY_PIXELS / 200, VERIFY_STABILITY_PIXELS / 10, 4.0]


def test_a_refused_everything_decoder_leaves_the_rest_written(
    sam2_tiny_spec, sam2_tiny_checkpoint, monkeypatch, tmp_path, caplog
):
    from triton_sam.export import everything
    from triton_sam.serving.protocol.everything import model_name
    from triton_sam.setup.pipeline import build_repository

    refusal = "stability_scores (m2m=False multimask=True): max diff 0.5"

    def refuse(spec, checkpoint, out_dir, **_):
        raise ExportValidationError("sam2_everything_decoder.onnx", [refusal])

    monkeypatch.setattr(everything, "export_for_spec", refuse)
    repo = tmp_path / "repo"
    with caplog.at_level(logging.WARNING, logger="triton_sam.setup.pipeline"):
        build = build_repository(
            sam2_tiny_spec,
            repo,
            checkpoint=sam2_tiny_checkpoint,
            export_options=ExportOptions(verify=False),
            everything=True,
        )
    decoder, job = ev.graph_name("sam2"), model_name(sam2_tiny_spec.family.session_model)
    assert set(build.not_written) == {decoder, job}
    assert refusal in build.not_written[decoder]
    assert any(decoder in r.message and refusal in r.message for r in caplog.records)
    written = {p.name for p in repo.iterdir() if not p.name.startswith(".")}
    assert {*build.models, build.session_model} <= written
    assert not {decoder, job} & written
