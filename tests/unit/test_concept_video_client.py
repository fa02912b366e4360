"""SAM3ConceptVideoClient's reading of the streamed responses, without a server: the
responses are built by the server's own ``wire.frame_response`` from known answers, the
client's transport is replaced by a list of them. Answered frames come back as the answers
(masks from their RLE at the video's size), progress-only responses only report progress,
and ``labels=`` writes each answered frame into an OME-Zarr label volume that reads back."""

from __future__ import annotations

import numpy as np
import zarr

from triton_sam.client.concept_labels import OmeZarrLabelWriter
from triton_sam.client.concept_video import SAM3ConceptVideoClient
from triton_sam.serving.concept_video.results import FrameResult
from triton_sam.serving.concept_video.wire import frame_response, progress_response
from triton_sam.serving.protocol import concept_video as protocol

HW = (13, 17)


def _answer(frame: int) -> FrameResult:
    masks = np.zeros((2, *HW), bool)
    masks[0, 1:5, frame : frame + 4] = True
    masks[1, 6:12, 9:15] = True
    return FrameResult(
        frame_idx=frame, object_ids=np.array([0, 3]), scores=np.float32([0.9, 0.7]),
        boxes=np.float32([[frame, 1, frame + 3, 4], [9, 6, 14, 11]]), masks=masks,
        prompt_ids=np.array([0, 1]),
    )  # fmt: skip


class _Offline(SAM3ConceptVideoClient):
    """The client with its transport replaced by the responses given."""

    def __init__(self, responses):
        self.responses, self._hw, self.sent = responses, {"s": HW}, []

    def _stream(self, command, session, tensors):
        self.sent.append((command, session, dict(tensors)))
        yield from self.responses


def test_frames_progress_and_labels(tmp_path):
    answers = [_answer(0), _answer(1)]
    responses = [progress_response(1, 3)]
    for done, answer in zip((2, 3), answers, strict=True):
        responses.append(frame_response(
            answer, tracker_scores={0: 0.5}, removed_since_last=[2] if done == 3 else [],
            progress=(done, 3),
        ))  # fmt: skip
    responses.append({protocol.FRAMES_ANSWERED: np.int32([2]), protocol.PROGRESS: np.int32([3, 3])})
    client = _Offline(responses)
    seen = []
    image = np.zeros((2, *HW), np.uint8)
    writer = OmeZarrLabelWriter(tmp_path / "v.zarr", {0: "cell", 1: "nucleus"}, image.shape,
                                image=image)  # fmt: skip
    frames = list(
        client.propagate(
            "s", settings={"hotstart_delay": 1}, progress=lambda d, t: seen.append((d, t)),
            labels=writer,
        )
    )  # fmt: skip
    assert seen == [(1, 3), (2, 3), (3, 3), (3, 3)]
    assert [f.result.frame_idx for f in frames] == [0, 1]
    for frame, answer in zip(frames, answers, strict=True):
        np.testing.assert_array_equal(frame.result.masks, answer.masks)
        np.testing.assert_array_equal(frame.result.object_ids, answer.object_ids)
        np.testing.assert_array_equal(frame.result.prompt_ids, answer.prompt_ids)
        np.testing.assert_array_equal(frame.result.boxes, answer.boxes)
        np.testing.assert_array_equal(frame.tracker_scores, np.float32([0.5, 0.0]))
    assert frames[1].removed_object_ids.tolist() == [2]
    command, session, tensors = client.sent[0]
    assert (command, session) == (protocol.CMD_PROPAGATE, "s")
    assert tensors[protocol.SETTINGS][0] == b'{"hotstart_delay": 1}'
    # label volumes: object id + 1 per voxel, one volume per prompt
    root = zarr.open_group(tmp_path / "v.zarr", mode="r")
    for k, prompt_id in enumerate((0, 1)):  # object row k is prompt k's only object
        volume = root[f"labels/prompt-{prompt_id}/0"][:]
        for z, answer in enumerate(answers):
            expected = np.where(answer.masks[k], answer.object_ids[k] + 1, 0)
            np.testing.assert_array_equal(volume[z], expected)
