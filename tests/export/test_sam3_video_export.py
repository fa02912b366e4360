"""SAM3 video export: ``Sam3TrackerVideoModel`` as the tracker's five graphs, each verified
against transformers' own code path (``export/sam3_video_checks.py``) by the export itself,
and written with ``sam3_tracker`` as ``setup-video sam3_tracker`` writes them."""

from __future__ import annotations

import onnx
import pytest

from triton_sam.export.sam3_video import build_video_model, tracker_config
from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.tracking.config import TrackerConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_every_graph_output_was_checked_and_written(sam3_video_build):
    repo, build = sam3_video_build
    assert build.models == [*protocol.SAM3_MODEL_NAMES.values(), protocol.SAM3_TRACKER_MODEL]
    expected = {
        f"{key}.{name}" for key, (_, outs) in protocol.SAM3_GRAPHS.items() for name, *_ in outs
    }
    assert set(build.max_abs_error) == expected
    # SAM3's mask prompt returns its memory too (encoded from the full-resolution mask)
    assert protocol.SAM3_GRAPHS["mask_prompt"][1][-1][0] == "maskmem_features"
    for key, name in protocol.SAM3_MODEL_NAMES.items():
        graph = onnx.load(repo / name / "1" / "model.onnx", load_external_data=False).graph
        inputs, outputs = protocol.SAM3_GRAPHS[key]
        assert [i.name for i in graph.input] == [n for n, *_ in inputs]
        assert [o.name for o in graph.output] == [n for n, *_ in outputs]
        dims = [[d.dim_value or -1 for d in o.type.tensor_type.shape.dim][1:] for o in graph.output]
        assert dims == [list(shape) for _, _, shape in outputs]


def test_tracker_config_is_the_models(sam3_video_checkpoint, sam3_video_build):
    repo, _ = sam3_video_build
    config = tracker_config(build_video_model(sam3_video_checkpoint))
    assert (config.image_size, config.feat_size, config.mask_size) == (1008, 72, 288)
    assert (config.hidden_dim, config.mem_dim, config.num_maskmem) == (256, 64, 7)
    assert (config.max_obj_ptrs_in_encoder, config.max_cond_frames_in_attn) == (16, 4)
    assert config.preprocessing == "sam3" and config.forward_on_prompt
    assert config.mask_prompt_memory
    assert TrackerConfig.from_json(config.to_json()) == config
    served = (repo / protocol.SAM3_TRACKER_MODEL / "config.pbtxt").read_text()
    assert config.to_json().replace('"', '\\"') in served
    assert "288" in served and "256" not in served.split("masks")[1].split("}")[0]
