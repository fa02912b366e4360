"""The tracker's contracts and settings parametrised by family (SAM2.1, SAM3): graph shapes
from ``graph_contracts``, the tracker's outputs at the family's mask size, and the
``TrackerConfig`` fields SAM3 adds (JSON round trip, refusals)."""

from __future__ import annotations

import pytest

from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.tracking.config import TrackerConfig


def shapes(graphs):
    return {name: dims for key in graphs for name, _, dims in graphs[key][0] + graphs[key][1]}


def test_sam2_contracts_are_unchanged():
    """SAM2.1's shapes as they were written out before the contracts took sizes."""
    sam2 = shapes(protocol.GRAPHS)
    assert sam2["image"] == (3, 1024, 1024) and sam2["mask"] == (1, 1024, 1024)
    assert sam2["vision_feats"] == (256, 64, 64)
    assert sam2["high_res_feats_0"] == (32, 256, 256)
    assert sam2["high_res_feats_1"] == (64, 128, 128)
    assert sam2["low_res_masks"] == sam2["mask_input"] == (1, 256, 256)
    assert sam2["memory"] == (-1, 64, 64, 64) and sam2["obj_ptrs"] == (-1, 256)
    assert len(protocol.GRAPHS) == 5
    masks = {name: dims for name, _, dims in protocol.OUTPUT_TENSORS}["masks"]
    assert masks == (-1, 1, 256, 256)


def test_sam3_contracts_are_at_its_sizes():
    assert tuple(protocol.SAM3_GRAPHS) == protocol.SAM3_GRAPH_KEYS == tuple(protocol.GRAPHS)
    sam3 = shapes(protocol.SAM3_GRAPHS)
    assert sam3["image"] == (3, 1008, 1008)
    assert sam3["vision_feats"] == (256, 72, 72)
    assert sam3["high_res_feats_0"] == (32, 288, 288)
    assert sam3["high_res_feats_1"] == (64, 144, 144)
    assert sam3["low_res_masks"] == sam3["mask_input"] == (1, 288, 288)
    assert sam3["memory"] == (-1, 64, 72, 72)
    assert sam3["maskmem_features"] == (64, 72, 72)
    assert protocol.SAM3_MODEL_NAMES == {
        "video_encoder": "sam3_video_encoder",
        "memory_attention": "sam3_memory_attention",
        "video_decoder": "sam3_video_decoder",
        "memory_encoder": "sam3_memory_encoder",
        "mask_prompt": "sam3_mask_prompt",
    }
    assert [n for n, *_ in protocol.SAM3_GRAPHS["mask_prompt"][1]] == [
        "obj_ptr",
        "object_score_logits",
        "maskmem_features",
    ]
    masks = {name: dims for name, _, dims in protocol.output_tensors(288)}["masks"]
    assert masks == (-1, 1, 288, 288)


def test_tracker_config_round_trips_the_family_fields():
    config = TrackerConfig(
        image_size=1008, feat_size=72, preprocessing="sam3", forward_on_prompt=True
    )
    assert config.mask_size == 288 and TrackerConfig().mask_size == 256
    assert TrackerConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"preprocessing": "sam4"}', "preprocessing: got 'sam4'"),
        ('{"preprocessing": 3}', "preprocessing = 3, expected str"),
        ('{"forward_on_prompt": 1}', "forward_on_prompt = 1, expected bool"),
        ('{"feat_size": "72"}', "feat_size = '72', expected int"),
    ],
)
def test_tracker_config_refuses_bad_family_fields(text, message):
    with pytest.raises(ValueError, match=message):
        TrackerConfig.from_json(text)
