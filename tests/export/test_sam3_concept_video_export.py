"""The tracker view of ``Sam3VideoModel`` (``triton_sam.export.sam3_concept_video``): its
vision encoder computes exactly what the video model feeds its tracker
(``get_vision_features_for_tracker``: the detector's ViT, ``tracker_neck``, ``conv_s0`` /
``conv_s1``), so exporting it with the tracker family's exporter gives the video model's
tracker. The graphs themselves are checked end to end in
``tests/parity/test_sam3_concept_video_e2e.py``."""

from __future__ import annotations

import pytest
from concept_video_e2e_support import random_video_model

from triton_sam.export.sam3_concept_video import tracker_view

pytestmark = pytest.mark.slow


def test_tracker_view_is_the_video_models_tracker_on_its_vit():
    import torch

    model = random_video_model()
    view = tracker_view(model)
    pixels = torch.randn(1, 3, 1008, 1008, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        vision = model.detector_model.get_vision_features(pixel_values=pixels)
        feats, positions = model.get_vision_features_for_tracker(vision)
        ours = view.get_image_features(pixels, return_dict=True)
    assert len(feats) == len(ours.fpn_hidden_states) == 3
    for theirs, mine in zip(feats, ours.fpn_hidden_states, strict=True):
        assert torch.equal(theirs, mine)  # the same modules in the same order: bit for bit
    for theirs, mine in zip(positions, ours.fpn_position_encoding, strict=True):
        assert torch.equal(theirs, mine)
    tracker_weights = model.tracker_model.state_dict()
    view_weights = view.state_dict()
    assert all(torch.equal(v, view_weights[k]) for k, v in tracker_weights.items())
