"""The served model's request handling (``ConceptVideoService``, what ``sam3_concept_video``
runs inside Triton) on the seeded small model of ``tests/concept_video_e2e_support.py``:
sessions, prompts, the streamed propagation, tenancy, cancel and refusals, in-process on
onnxruntime. The streamed frames equal the in-process pipeline's own answers (which
``test_sam3_concept_video_e2e.py`` matches to ``Sam3VideoModel``) exactly: the same graphs,
the same calls.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from concept_video_e2e_support import NUM_FRAMES, PHRASE, clip, pipeline, service
from concept_video_exemplar_support import BOXES, FRAME, LABELS

from triton_sam.serving.bounds import RequestError
from triton_sam.serving.masks import decode_rle
from triton_sam.serving.protocol import concept_video as p
from triton_sam.serving.protocol.tracker import TrackingError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def exported(concept_video_export):
    return concept_video_export


def _command(name: str, **tensors) -> dict[str, np.ndarray]:
    out = {p.COMMAND: np.array([name.encode()], dtype=object)}
    return out | {k: np.asarray(v) for k, v in tensors.items()}


def _upload(svc, tenant: str = "a", uploaded: int = NUM_FRAMES) -> bytes:
    """A session of ``tenant`` with the clip's first ``uploaded`` frames uploaded."""
    frames = clip()
    answer = svc.handle(
        _command(
            p.CMD_INIT, num_frames=np.int32([NUM_FRAMES]), video_hw=np.int32(frames[0].shape[:2])
        ),
        tenant,
    )
    sid = answer[p.OUT_SESSION_ID]
    for i, frame in enumerate(frames[:uploaded]):
        svc.handle(
            _command(p.CMD_ADD_FRAME, session_id=sid, frame_index=np.int32([i]), frame=frame),
            tenant,
        )
    return sid


def _open(svc, tenant: str = "a") -> bytes:
    """A session of ``tenant`` with the clip uploaded and the phrase added."""
    sid = _upload(svc, tenant)
    ids = svc.handle(
        _command(
            p.CMD_ADD_PROMPT, session_id=sid, text=np.array([PHRASE.encode()] * 2, dtype=object)
        ),
        tenant,
    )
    assert ids[p.OUT_PROMPT_IDS].tolist() == [0, 0]  # a repeated phrase is one prompt
    return sid


def test_streamed_frames_equal_the_pipeline(exported):
    svc = service(exported)
    sid = _open(svc)
    responses = list(svc.propagate(_command(p.CMD_PROPAGATE, session_id=sid), "a"))
    frames = [r for r in responses if p.FRAME_INDEX in r]
    progress_only = [r for r in responses if p.FRAME_INDEX not in r and p.FRAMES_ANSWERED not in r]
    # one response per processed frame: the hold-back (2) keeps frame 0 back on frame 0
    assert [r[p.PROGRESS].tolist() for r in progress_only] == [[1, NUM_FRAMES]]
    assert responses[-1][p.FRAMES_ANSWERED].tolist() == [NUM_FRAMES]
    assert svc.frames_processed == NUM_FRAMES

    _assert_streamed_equal(frames, pipeline(exported, shared_vision=True))


def _assert_streamed_equal(frames: list[dict], video) -> None:
    """The streamed frame responses equal ``video``'s own answers, exactly."""
    ours = [pair for step in video.steps(upstream_rows=False) for pair in step.released]
    assert [int(r[p.FRAME_INDEX][0]) for r in frames] == [out.frame_idx for out, _ in ours]
    for response, (output, result) in zip(frames, ours, strict=True):
        np.testing.assert_array_equal(response[p.OBJECT_IDS], result.object_ids)
        np.testing.assert_array_equal(response[p.PROMPT_IDS], result.prompt_ids)
        np.testing.assert_array_equal(response[p.SCORES], result.scores.astype(np.float32))
        np.testing.assert_array_equal(response[p.BOXES], result.boxes.astype(np.float32))
        tracker_scores = [
            output.obj_id_to_tracker_score.get(int(o), 0.0) for o in result.object_ids
        ]
        np.testing.assert_array_equal(response[p.TRACKER_SCORES], np.float32(tracker_scores))
        masks = [decode_rle(c, video.video_hw) for c in response[p.MASKS_RLE]]
        np.testing.assert_array_equal(np.array(masks).reshape(result.masks.shape), result.masks)
    assert sum(len(r[p.OBJECT_IDS]) for r in frames) > 0  # not vacuous: objects answered


def test_other_tenant_cancel_and_refusals(exported):
    svc = service(exported)
    sid = _open(svc)
    # another tenant holding the id: the same miss as an id never issued
    for call in (
        lambda: svc.propagate(_command(p.CMD_PROPAGATE, session_id=sid), "b"),
        lambda: svc.handle(
            _command(p.CMD_ADD_PROMPT, session_id=sid, text=np.array([b"dog"], dtype=object)), "b"
        ),
    ):
        with pytest.raises(TrackingError) as error:
            call()
        assert (error.value.code, error.value.field) == (p.ERR_SESSION_NOT_FOUND, p.SESSION_ID)
    # refusals naming the field, before any graph runs
    bad = [
        ({p.MASK_FORMAT: np.array([b"png"], dtype=object)}, p.MASK_FORMAT),
        ({p.SETTINGS: np.array([json.dumps({"max_num_objects": 65}).encode()], dtype=object)},
         "settings.max_num_objects"),
        ({p.START_FRAME: np.int32([NUM_FRAMES])}, p.START_FRAME),
    ]  # fmt: skip
    for extra, field in bad:
        with pytest.raises((TrackingError, RequestError)) as error:
            svc.propagate(_command(p.CMD_PROPAGATE, session_id=sid, **extra), "a")
        assert error.value.field == field
    assert svc.frames_processed == 0
    # a cancel after the first response stops before the next frame
    cancel = []
    stream = svc.propagate(_command(p.CMD_PROPAGATE, session_id=sid), "a", lambda: bool(cancel))
    with pytest.raises(TrackingError) as error:
        for response in stream:
            cancel.append(response)  # the client cancels once it has one response
    assert len(cancel) == 1
    assert error.value.code == p.ERR_CANCELLED
    assert svc.frames_processed == 1  # the server's own count
    status = json.loads(svc.handle(_command(p.CMD_INFO, session_id=sid), "a")[p.OUT_STATUS][0])
    assert status["session"]["frames_tracked"] == 1
    assert svc.streaming == 0  # the slot is free again


def _exemplar_command(sid, **tensors) -> dict[str, np.ndarray]:
    given = {
        p.EXEMPLAR_BOXES: np.float32(BOXES),
        p.EXEMPLAR_LABELS: np.int32(LABELS),
        p.FRAME_INDEX: np.int32([FRAME]),
    }
    return _command(p.CMD_ADD_PROMPT, session_id=sid, **(given | tensors))


def test_exemplar_prompt_is_kept_once_per_frame_and_boxes(exported):
    """Boxes alone make one prompt of the phrase "visual"; the same boxes on the same frame are
    the same prompt. (Its frames streamed equal the pipeline's: served, in
    tests/integration/test_sam3_concept_video.py.)"""
    svc = service(exported)
    sid = _upload(svc)
    for _ in range(2):
        assert svc.handle(_exemplar_command(sid), "a")[p.OUT_PROMPT_IDS].tolist() == [0]
    status = json.loads(svc.handle(_command(p.CMD_INFO, session_id=sid), "a")[p.OUT_STATUS][0])
    assert status["session"]["prompts"] == {}
    assert status["session"]["exemplar_prompts"] == [
        {"prompt_id": 0, "phrase": "visual", "frame_index": FRAME, "boxes": 2}
    ]


def test_bad_exemplars_are_refused_naming_the_field(exported):
    svc = service(exported)
    sid = _upload(svc, uploaded=2)  # frame 2 not uploaded
    nan = np.float32([[10, 10, 50, np.nan]])
    bad = [
        ({p.EXEMPLAR_BOXES: nan}, "exemplar_boxes[0]", "is not finite"),
        ({p.EXEMPLAR_BOXES: np.float32([[10, 10, 321, 50]])}, "exemplar_boxes[0]", "outside"),
        ({p.EXEMPLAR_BOXES: np.float32([[10, 10, 50, 50], [30, 40, 30, 60]])},
         "exemplar_boxes[1]", "is empty"),
        ({p.EXEMPLAR_BOXES: np.float32([10, 10, 50, 50])}, "exemplar_boxes", "shape [4]"),
        ({p.EXEMPLAR_BOXES: np.float32([[10, 10, 50, 50]] * 17)}, "exemplar_boxes", "[17, 4]"),
        ({p.EXEMPLAR_LABELS: np.int32([1, 2])}, "exemplar_labels[1]", "got 2"),
        ({p.EXEMPLAR_LABELS: np.int32([1])}, "exemplar_labels", "1 labels for 2 boxes"),
        ({p.FRAME_INDEX: np.int32([NUM_FRAMES])}, "frame_index", "the video has 3 frames"),
        ({p.FRAME_INDEX: np.int32([2])}, "frame_index", "not uploaded"),
    ]  # fmt: skip
    for extra, field, words in bad:
        with pytest.raises((TrackingError, RequestError)) as error:
            svc.handle(_exemplar_command(sid, **extra), "a")
        assert (error.value.field, words in str(error.value)) == (field, True), error.value
    no_boxes = _command(p.CMD_ADD_PROMPT, session_id=sid, frame_index=np.int32([0]))
    with pytest.raises(TrackingError) as error:
        svc.handle(no_boxes, "a")
    assert error.value.field == p.FRAME_INDEX
    status = json.loads(svc.handle(_command(p.CMD_INFO, session_id=sid), "a")[p.OUT_STATUS][0])
    assert (status["session"]["prompts"], status["session"]["exemplar_prompts"]) == ({}, [])
