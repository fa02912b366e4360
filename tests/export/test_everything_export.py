"""The everything-decoder graph exported, checked against torch, and written as a model.

SAM2.1-tiny: the session's build (tests/conftest.py, ``everything=True`` as ``setup`` writes
it) exported it from the seeded checkpoint through ``export_for_spec``, which runs its own
onnxruntime-vs-torch check (plain and m2m, multimask and single-mask; tolerances in
``export/everything.py``; a refusal would be in ``not_written``); the artifact's production
config and its embedded CPU twin pass the checks Triton's onnxruntime backend applies
(``repository/onnx_check.py``).
"""

from __future__ import annotations

import pytest

from triton_sam.repository.config import parse_config
from triton_sam.serving import everything as ev

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_everything_decoder_exports_and_writes(sam2_tiny_build, sam2_tiny_repository):
    repo, build = sam2_tiny_build
    name = ev.graph_name("sam2")
    assert name == "sam2_everything_decoder"
    assert build.not_written == {}  # its export gate passed
    assert (repo / name / "1" / "model.onnx").is_file()
    config = parse_config((repo / name / "config.pbtxt").read_text())
    assert config.max_batch_size == 0  # no common first dim to batch on
    assert config.platform == "onnxruntime_onnx"
    assert not config.HasField("optimization")  # no TensorRT (data-dependent shapes)
    names = [t.name for t in config.input]
    assert names[:3] == ["image_embed", "high_res_feats_0", "high_res_feats_1"]
    assert names[3:] == list(ev.GRAPH_INPUTS)
    assert [t.name for t in config.output] == list(ev.GRAPH_OUTPUTS)
    # the twin was checked against the graph as the backend would (embedded_repository)
    twin = parse_config((sam2_tiny_repository / name / "config.pbtxt").read_text())
    assert [g.kind for g in twin.instance_group] == [twin.instance_group[0].KIND_CPU]


def test_everything_refused_for_other_families() -> None:
    from triton_sam.errors import InputValidationError
    from triton_sam.models import get_model
    from triton_sam.repository.everything_decoder import contract

    with pytest.raises(InputValidationError, match="family"):
        contract(get_model("sam3_tracker").family)
