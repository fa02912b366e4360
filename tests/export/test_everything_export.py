"""The everything-decoder graph exported, checked against torch, and written as a model.

SAM2.1-tiny (the session's random-init checkpoint): ``export_for_spec`` runs its own
onnxruntime-vs-torch check (plain and m2m, multimask and single-mask; tolerances in
``export/everything.py``); the artifact's production config and its embedded CPU twin pass
the checks Triton's onnxruntime backend applies (``repository/onnx_check.py``).
"""

from __future__ import annotations

import pytest

from triton_sam.repository.config import RepositoryOptions, parse_config
from triton_sam.serving import everything as ev

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_everything_decoder_exports_and_writes(sam2_tiny_spec, sam2_tiny_checkpoint, tmp_path):
    from triton_sam.export.everything import export_for_spec
    from triton_sam.repository.everything_decoder import everything_decoder_artifact
    from triton_sam.repository.writer import embedded_repository, write_models

    path = export_for_spec(sam2_tiny_spec, sam2_tiny_checkpoint, tmp_path / "onnx")
    repo = tmp_path / "repo"
    artifact = everything_decoder_artifact(sam2_tiny_spec.family, path, RepositoryOptions())
    assert artifact.name == ev.graph_name("sam2") == "sam2_everything_decoder"
    write_models(repo, [artifact])
    config = parse_config((repo / artifact.name / "config.pbtxt").read_text())
    assert config.max_batch_size == 0  # no common first dim to batch on
    assert config.platform == "onnxruntime_onnx"
    assert not config.HasField("optimization")  # no TensorRT (data-dependent shapes)
    names = [t.name for t in config.input]
    assert names[:3] == ["image_embed", "high_res_feats_0", "high_res_feats_1"]
    assert names[3:] == list(ev.GRAPH_INPUTS)
    assert [t.name for t in config.output] == list(ev.GRAPH_OUTPUTS)
    twin_repo = embedded_repository(repo)  # checked against the graph as the backend would
    twin = parse_config((twin_repo / artifact.name / "config.pbtxt").read_text())
    assert [g.kind for g in twin.instance_group] == [twin.instance_group[0].KIND_CPU]


def test_everything_refused_for_other_families() -> None:
    from triton_sam.errors import InputValidationError
    from triton_sam.models import get_model
    from triton_sam.repository.everything_decoder import contract

    with pytest.raises(InputValidationError, match="family"):
        contract(get_model("sam3_tracker").family)
