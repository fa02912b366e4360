"""``sam3_concept_video`` on the embedded Triton: the seeded small ``Sam3VideoModel`` of
``tests/concept_video_e2e_support.py`` built as ``setup-video sam3_concept_video`` builds it
(the shared vision graph, the detector's text and decoder graphs, the tracker's graphs, the
decoupled python model), driven by ``SAM3ConceptVideoClient`` over gRPC's stream:

- the streamed frames (ids, prompt ids, scores, boxes, masks) equal the in-process
  ``ConceptVideo`` on the same graphs with the served settings, which
  ``tests/parity/test_sam3_concept_video_e2e.py`` matches to ``Sam3VideoModel``;
- another tenant holding the session id is refused as if it did not exist;
- a cancel stops the propagation between frames (counted by the server: ``frames_tracked``);
- a setting out of its bounds is refused naming ``settings.<key>``;
- a prompt of exemplar boxes alone, drawn on frame 1 (``tests/concept_video_exemplar_support.py``,
  which ``tests/parity/test_sam3_concept_video_exemplars.py`` matches to ``Sam3VideoModel``):
  the served frames equal the in-process ones, and an empty box is refused naming
  ``exemplar_boxes[0]``.

One export and one tritonserver start (~2 min on 2 cores), shared with the page's test
(tests/integration/test_sam3_concept_video_web.py) through tests/conftest.py.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import concept_video_exemplar_support as exemplar
import numpy as np
import pytest
from concept_video_e2e_support import NUM_FRAMES, PHRASE, SETTINGS, clip, pipeline

from triton_sam.client.concept_video import SAM3ConceptVideoClient
from triton_sam.errors import InvalidRequestError, ServerError
from triton_sam.serving.concept_video.service import SERVED_SETTINGS
from triton_sam.serving.protocol import concept_video as protocol
from triton_sam.serving.protocol.tenancy import TENANT_HEADER

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(1200)]
# The served bound on objects (each holds a memory bank); the clip has two at most.
SERVED = replace(SETTINGS, max_num_objects=protocol.MAX_OBJECTS)
# What a propagation sends to run with SERVED (the served defaults differ from the clip's).
OVERRIDES = {k: v for k, v in asdict(SERVED).items() if v != getattr(SERVED_SETTINGS, k)}
SERVED_EXEMPLAR = replace(exemplar.SETTINGS, max_num_objects=protocol.MAX_OBJECTS)
EXEMPLAR_OVERRIDES = {
    k: v for k, v in asdict(SERVED_EXEMPLAR).items() if v != getattr(SERVED_SETTINGS, k)
}


@pytest.fixture(scope="module")
def built(concept_video_build):
    """(repository, export): the session's one build (tests/conftest.py)."""
    return concept_video_build


@pytest.fixture(scope="module")
def exported(built):
    return built[1]


@pytest.fixture(scope="module")
def server(concept_video_server):
    return concept_video_server


def _client(server, tenant: str = "a") -> SAM3ConceptVideoClient:
    return SAM3ConceptVideoClient(server.grpc_url, headers={TENANT_HEADER: tenant})


def test_served_frames_equal_the_pipeline(server, exported):
    seen = []
    with _client(server) as client:
        session = client.open(clip())
        assert client.add_prompt(session, [PHRASE]) == [0]
        served = list(
            client.propagate(session, settings=OVERRIDES, progress=lambda d, t: seen.append((d, t)))
        )
        assert client.info(session)["session"]["frames_tracked"] == NUM_FRAMES
        client.close(session)
    # one response per processed frame (the hold-back answers frame 0 on frame 1), totals
    assert seen[0] == (1, NUM_FRAMES) and seen[-1] == (NUM_FRAMES, NUM_FRAMES)
    _assert_served_equal(served, pipeline(exported, SERVED, shared_vision=True))


def test_served_exemplar_frames_equal_the_pipeline(server, exported):
    with _client(server) as client:
        session = client.open(clip())
        boxes = {"boxes": exemplar.BOXES, "frame_index": exemplar.FRAME}
        assert client.add_prompt(session, box_labels=exemplar.LABELS, **boxes) == [0]
        with pytest.raises(InvalidRequestError) as error:
            client.add_prompt(session, boxes=[[10, 10, 10, 50]], frame_index=exemplar.FRAME)
        assert "exemplar_boxes[0]" in str(error.value) and "is empty" in str(error.value)
        served = list(client.propagate(session, settings=EXEMPLAR_OVERRIDES))
        client.close(session)
    prompts = {0: exemplar.our_prompt(protocol.EXEMPLAR_ONLY_PHRASE)}
    _assert_served_equal(
        served, pipeline(exported, SERVED_EXEMPLAR, shared_vision=True, prompts=prompts)
    )


def _assert_served_equal(served: list, video) -> None:
    """The served frames equal ``video``'s own answers, exactly, and some object is found."""
    ours = [result for step in video.steps(upstream_rows=False) for _, result in step.released]
    assert [f.result.frame_idx for f in served] == [r.frame_idx for r in ours]
    for frame, result in zip(served, ours, strict=True):
        np.testing.assert_array_equal(frame.result.object_ids, result.object_ids)
        np.testing.assert_array_equal(frame.result.prompt_ids, result.prompt_ids)
        np.testing.assert_array_equal(frame.result.scores, result.scores.astype(np.float32))
        np.testing.assert_array_equal(frame.result.boxes, result.boxes.astype(np.float32))
        np.testing.assert_array_equal(frame.result.masks, result.masks)
    assert sum(len(f.result.object_ids) for f in served) > 0


def test_tenancy_cancel_and_refusal(server):
    with _client(server) as client:
        session = client.open(clip())
        client.add_prompt(session, [PHRASE])
        with _client(server, "b") as other, pytest.raises(ServerError) as error:
            other.add_prompt(session, ["dog"])
        assert protocol.ERR_SESSION_NOT_FOUND in str(error.value)
        assert session not in str(error.value)
        with pytest.raises(InvalidRequestError) as error:
            list(client.propagate(session, settings={"max_num_objects": 65}))
        assert "settings.max_num_objects" in str(error.value)
        assert client.info(session)["session"]["frames_tracked"] == 0
        client.close(session)
        # A cancel: leave on the first response (frame 0 processed). The server asks before
        # each frame; Triton marks the request cancelled once it notices the closed stream
        # (measured here: by the end of the frame after the one in progress, 3 frames run;
        # twelve leave room for a loaded machine). A cancel that did not reach the server
        # would run all twelve. ``info`` waits for the frame in progress (one lock for frames
        # and commands); the count is read once the server says the propagation ended.
        session = client.open(clip() * 4)
        client.add_prompt(session, [PHRASE])
        with pytest.raises(_Leave):
            list(client.propagate(session, settings=OVERRIDES, progress=_leave))
        ran = _settled(client, session)
        assert 1 <= ran < 4 * NUM_FRAMES
        client.close(session)


class _Leave(Exception):
    pass


def _leave(done: int, total: int) -> None:
    raise _Leave


def _settled(client: SAM3ConceptVideoClient, session: str) -> int:
    """The session's processed frames once its propagation ended (the server's flag)."""
    for _ in range(120):  # each info waits for the frame in progress: seconds at most
        status = client.info(session)["session"]
        if not status["propagating"]:
            return status["frames_tracked"]
    raise AssertionError("the propagation never ended")
