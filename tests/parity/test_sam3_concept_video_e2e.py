"""Concept tracking in video end to end on real graphs: our in-process pipeline
(``triton_sam.serving.concept_video.pipeline.ConceptVideo``: the concept graphs detect, the
SAM3 tracker's graphs track, onnxruntime) against transformers' ``Sam3VideoModel`` +
``Sam3VideoProcessor`` on the seeded small model of ``tests/concept_video_e2e_support.py``
(3 frames, "cat"), with one ViT run per frame (the ``video_vision`` graph feeding both) and
with the two families' own vision graphs: the same answered frames, object ids, prompts and
boxes; scores and low-resolution logits within the tolerances below; masks equal except where
upstream's logit is within the logit bound of 0.

Tolerances (the families' own, not new ones):
- logits: 2^-10 of the object's largest |logit| (at least 2^-10 x 0.01), the SAM3 tracker
  parity's bound (``sam3_video_support.RELATIVE_TOLERANCE``). A detection mask (an object's
  birth frame) is the decoder's output, exported within 1e-4 of its range
  (``concept_graphs.MASK_RANGE_FRACTION``), under this bound; a tracked mask carries the
  tracker's bfloat16 memories, where a difference in the last float32 bits can move a memory
  value by one bfloat16 ulp.
- scores (detection probability at birth): the decoder export's relative bound
  (``concept_graphs.DECODER_TOLERANCE``, 1e-3).
- thresholds: every query's probability on every frame lies at least ``SCORE_MARGIN`` (1e-3)
  from each threshold, so no detection crosses one by a float32 difference.
"""

from __future__ import annotations

import pytest
from concept_video_e2e_support import (
    SCORE_MARGIN,
    closest_to_threshold,
    frame_errors,
    pipeline,
    transformers_run,
)

from triton_sam.export.concept_graphs import DECODER_TOLERANCE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def exported(concept_video_export):
    return concept_video_export


def test_reference_is_not_vacuous():
    reference = transformers_run()
    assert closest_to_threshold(reference) >= SCORE_MARGIN
    # detections on every frame; an object answered on every frame, tracked after its birth
    assert reference.detections == [2, 2, 1]
    assert [f.object_ids.tolist() for f in reference.frames] == [[0], [0], [0]]


@pytest.mark.parametrize("shared_vision", [True, False], ids=["one_vit", "two_vision_graphs"])
def test_pipeline_matches_sam3_video_model(exported, shared_vision):
    reference = transformers_run()
    video = pipeline(exported, shared_vision=shared_vision)
    ours = list(video.propagate())
    # one ViT run per frame: the tracker's own encoder never ran
    assert (video.tracker.graph_calls["video_encoder"] == 0) == shared_vision
    rows = frame_errors(ours, reference)
    for row in rows:
        print(row)
    assert [row["mask_flips_outside"] for row in rows] == [0] * len(rows)
    assert all(row["logit_error"] <= row["logit_bound"] for row in rows), rows
    assert all(row["score_error"] <= DECODER_TOLERANCE.max_rel for row in rows), rows
