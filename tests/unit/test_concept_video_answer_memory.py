"""A concept-video frame's answer holds one bit per pixel per object, not the objects' masks
at the frame's size: the memory of an answer grows with the number of objects only by their
packed masks (``PackedFrameResult``), and its RLE equals the masks read all at once."""

from __future__ import annotations

import tracemalloc

import numpy as np

from triton_sam.serving.concept_video.results import postprocess_frame
from triton_sam.serving.masks import decode_rle

HW = (512, 640)


def _answer(num_objects: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    logits = {o: (rng.standard_normal((72, 72)) * 4).astype(np.float32) for o in range(num_objects)}
    return postprocess_frame(
        frame_idx=0,
        obj_id_to_mask=logits,
        obj_id_to_score={o: 0.9 for o in logits},
        obj_id_to_tracker_score={o: float(rng.uniform(0.1, 1)) for o in logits},
        obj_id_to_prompt_id={o: o % 2 for o in logits},  # two prompts: overlaps resolved
        hidden_obj_ids=[],
        hw=HW,
    )


def _peak_bytes(num_objects: int) -> int:
    tracemalloc.start()
    try:
        _answer(num_objects).rle()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_answer_memory_grows_by_packed_masks_only() -> None:
    pixels = HW[0] * HW[1]
    grown = _peak_bytes(20) - _peak_bytes(4)
    # 16 more objects may add their packed masks (pixels / 8 bytes each) and their RLE counts;
    # masks held at the frame's size would add >= 1 byte per pixel each (bool), 5 as float32
    assert grown < 16 * pixels / 8 * 1.5, grown / pixels


def test_rle_equals_the_masks_read_at_once() -> None:
    for seed in (0, 1, 2):
        answer = _answer(6, seed)
        masks = answer.masks
        assert masks.shape == (6, *HW)
        for prompt in (0, 1):  # within a prompt no pixel has two owners
            assert masks[answer.prompt_ids == prompt].sum(axis=0).max() <= 1
        for mask, counts in zip(masks, answer.rle(), strict=True):
            np.testing.assert_array_equal(decode_rle(counts, HW), mask)
