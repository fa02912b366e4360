"""The concept-video model's per-frame responses and settings override (pure numpy): every
field of an answer, masks that decode back, and refusals naming ``settings.<key>``."""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np
import pytest

from triton_sam.serving.bounds import RequestError
from triton_sam.serving.concept_video.results import FrameResult
from triton_sam.serving.concept_video.settings import ConceptVideoSettings
from triton_sam.serving.concept_video.wire import frame_response, parse_settings, progress_response
from triton_sam.serving.masks import decode_rle
from triton_sam.serving.protocol import concept_video as protocol

BASE = ConceptVideoSettings()


def test_every_setting_has_bounds_and_every_bound_a_setting() -> None:
    assert {f.name for f in fields(ConceptVideoSettings)} == set(protocol.SETTING_BOUNDS)


def test_settings_override_only_what_is_given() -> None:
    text = json.dumps({"new_det_thresh": 0.6, "hotstart_delay": 0, "use_nms": False,
                       "max_num_objects": 3, "score_threshold_detection": 1})  # fmt: skip
    got = parse_settings(text.encode(), BASE)
    assert (got.new_det_thresh, got.hotstart_delay, got.use_nms, got.max_num_objects) == (
        0.6, 0, False, 3,
    )  # fmt: skip
    assert got.score_threshold_detection == 1.0 and isinstance(got.score_threshold_detection, float)
    assert got.assoc_iou_thresh == BASE.assoc_iou_thresh
    assert parse_settings(None, BASE) is BASE and parse_settings(b"", BASE) is BASE


@pytest.mark.parametrize(
    "text, field",
    [
        ("[1]", "settings"),
        ("{not json", "settings"),
        ('{"fill_hole_area": 16}', "settings.fill_hole_area"),
        ('{"new_det_thresh": 1.5}', "settings.new_det_thresh"),
        ('{"new_det_thresh": NaN}', "settings.new_det_thresh"),
        ('{"new_det_thresh": "0.5"}', "settings.new_det_thresh"),
        ('{"hotstart_delay": 2.5}', "settings.hotstart_delay"),
        ('{"hotstart_delay": true}', "settings.hotstart_delay"),
        ('{"use_nms": 1}', "settings.use_nms"),
        ('{"max_num_objects": 65}', "settings.max_num_objects"),
        ('{"max_num_objects": 0}', "settings.max_num_objects"),
        ('{"hotstart_delay": 4}', "settings.hotstart_unmatch_thresh"),  # 8 > 4
    ],
)
def test_settings_refusals_name_the_field(text: str, field: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_settings(text, BASE)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def _result() -> FrameResult:
    masks = np.zeros((2, 9, 11), bool)
    masks[0, 1:4, 2:6] = True
    masks[1, 5:9, 0:3] = True
    return FrameResult(
        frame_idx=7, object_ids=np.array([2, 5]), scores=np.array([0.9, 0.75], np.float32),
        boxes=np.array([[2, 1, 5, 3], [0, 5, 2, 8]], np.float32), masks=masks,
        prompt_ids=np.array([0, 1]),
    )  # fmt: skip


def test_frame_response_rle() -> None:
    result = _result()
    out = frame_response(
        result, tracker_scores={2: 0.5}, removed_since_last={9, 4}, progress=(12, 40)
    )
    assert out[protocol.FRAME_INDEX].tolist() == [7]
    assert out[protocol.OBJECT_IDS].tolist() == [2, 5]
    assert out[protocol.OBJECT_IDS].dtype == np.int32
    assert out[protocol.PROMPT_IDS].tolist() == [0, 1]
    np.testing.assert_array_equal(out[protocol.SCORES], result.scores)
    assert out[protocol.TRACKER_SCORES].tolist() == [0.5, 0.0]
    np.testing.assert_array_equal(out[protocol.BOXES], result.boxes)
    assert out[protocol.REMOVED_OBJECT_IDS].tolist() == [4, 9]
    assert out[protocol.PROGRESS].tolist() == [12, 40]
    assert protocol.MASKS_LOGITS not in out
    for counts, mask in zip(out[protocol.MASKS_RLE], result.masks, strict=True):
        np.testing.assert_array_equal(decode_rle(counts, (9, 11)), mask)


def test_frame_response_logits_and_refusal() -> None:
    result = _result()
    low = {2: np.full((4, 4), 1.5, np.float32), 5: np.full((4, 4), -2.0, np.float32), 8: None}
    out = frame_response(
        result, tracker_scores={}, removed_since_last=(), progress=(1, 1),
        mask_format="logits", low_res_masks=low, low_res_hw=(4, 4),
    )  # fmt: skip
    assert out[protocol.MASKS_LOGITS].shape == (2, 4, 4)
    assert out[protocol.MASKS_LOGITS][:, 0, 0].tolist() == [1.5, -2.0]
    assert protocol.MASKS_RLE not in out
    with pytest.raises(RequestError, match="^mask_format: got 'png'"):
        frame_response(result, tracker_scores={}, removed_since_last=(), progress=(1, 1),
                       mask_format="png")  # fmt: skip


def test_progress_response() -> None:
    assert {k: v.tolist() for k, v in progress_response(3, 9).items()} == {
        protocol.PROGRESS: [3, 9]
    }
