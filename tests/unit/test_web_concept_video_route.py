"""``POST /web/concept-video/{model}`` driven as ASGI, with a stand-in for the gRPC stream.

The stand-in replaces :func:`triton_sam.web.concept_video.responses` (what the route calls),
so the test sees the tensors the route builds from the page's JSON, which tenant header it
passes on, the JSON and NDJSON it answers, the server's refusals as typed answers, and that a
browser going away closes the stream. The real model's answers are the integration test's
(tests/integration/test_sam3_concept_video_web.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
from asgi_support import asgi_post
from starlette.applications import Starlette

from triton_sam.gateway.errors import GatewayError
from triton_sam.serving.protocol import concept_video as protocol
from triton_sam.serving.protocol import error_message
from triton_sam.serving.protocol.tenancy import TENANT_HEADER
from triton_sam.web import concept_video as route

MODEL = protocol.MODEL
LISTED = [{"name": MODEL, "kind": "concept_video"}, {"name": "sam3_concept", "kind": "concept"}]


async def _listed() -> list[dict[str, Any]]:
    return LISTED


def _post(body: Any, model: str = MODEL, **kw: Any) -> tuple[int, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    app = Starlette(routes=route.concept_video_routes("triton:8001", _listed))
    return asyncio.run(asgi_post(app, f"/web/concept-video/{model}", raw, **kw))


def _stand_in(monkeypatch, answers: list[Any], seen: dict[str, Any]) -> None:
    """``responses`` yielding ``answers`` (a GatewayError is raised where it stands)."""

    async def fake(endpoint, model, inputs, headers, timeout_s=route.COMMAND_TIMEOUT_S):
        seen.update(address=endpoint.address, model=model, inputs=inputs, headers=headers)
        try:
            for answer in answers:
                if isinstance(answer, GatewayError):
                    raise answer
                yield answer
                await asyncio.sleep(0)
        finally:
            seen["closed"] = True

    monkeypatch.setattr(route, "responses", fake)


def test_init_and_add_frame_build_the_models_tensors_with_the_tenant(monkeypatch) -> None:
    seen: dict[str, Any] = {}
    status_json = json.dumps({"session": {"frames_uploaded": 0}}).encode()
    _stand_in(
        monkeypatch,
        [{protocol.OUT_SESSION_ID: np.array([b"s-1"], object),
          protocol.OUT_STATUS: np.array([status_json], object)}],
        seen,
    )  # fmt: skip
    status, body = _post(
        {"command": "init", "num_frames": 3, "video_hw": [240, 320]},
        headers={TENANT_HEADER: "lab-a"},
    )
    assert status == 200, body
    assert json.loads(body) == {"session_id": "s-1", "status": {"session": {"frames_uploaded": 0}}}
    assert seen["address"] == "triton:8001" and seen["model"] == MODEL
    assert seen["headers"] == {TENANT_HEADER: "lab-a"}
    assert seen["inputs"][protocol.COMMAND].tolist() == [b"init"]
    assert seen["inputs"][protocol.NUM_FRAMES].tolist() == [3]
    assert seen["inputs"][protocol.VIDEO_HW].tolist() == [240, 320]

    png = b"\x89PNG not really"
    _stand_in(monkeypatch, [{protocol.OUT_STATUS: np.array([b"{}"], object)}], seen)
    body = {"command": "add_frame", "session_id": "s-1", "frame_index": 2,
            "frame_bytes": base64.b64encode(png).decode()}  # fmt: skip
    status, answer = _post(body)
    assert status == 200 and json.loads(answer) == {"status": {}}
    assert seen["headers"] is None  # the default tenant: no header
    assert seen["inputs"][protocol.FRAME_BYTES].tolist() == [png]
    assert seen["inputs"][protocol.FRAME_INDEX].tolist() == [2]
    assert protocol.FRAME not in seen["inputs"]  # the server decodes the file


def test_propagate_streams_one_line_per_response_then_the_totals(monkeypatch) -> None:
    seen: dict[str, Any] = {}
    frame = {
        protocol.FRAME_INDEX: np.array([0], np.int32),
        protocol.OBJECT_IDS: np.array([0, 3], np.int32),
        protocol.PROMPT_IDS: np.array([0, 0], np.int32),
        protocol.SCORES: np.array([0.5, 0.75], np.float32),
        protocol.TRACKER_SCORES: np.array([1.0, 0.25], np.float32),
        protocol.BOXES: np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.float32),
        protocol.MASKS_RLE: np.array([b"abc", b"de"], object),
        protocol.REMOVED_OBJECT_IDS: np.array([1], np.int32),
        protocol.PROGRESS: np.array([2, 3], np.int32),
    }
    answers = [
        {protocol.PROGRESS: np.array([1, 3], np.int32)},
        frame,
        {protocol.FRAMES_ANSWERED: np.array([1], np.int32),
         protocol.PROGRESS: np.array([3, 3], np.int32)},
    ]  # fmt: skip
    _stand_in(monkeypatch, answers, seen)
    settings = {"new_det_thresh": 0.6}
    status, body = _post({"command": "propagate", "session_id": "s-1", "settings": settings})
    assert status == 200, body
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert lines == [
        {"progress": [1, 3]},
        {
            "progress": [2, 3],
            "frame": {
                "frame_index": 0, "object_ids": [0, 3], "prompt_ids": [0, 0],
                "scores": [0.5, 0.75], "tracker_scores": [1.0, 0.25],
                "boxes": [[0, 1, 2, 3], [4, 5, 6, 7]], "masks_rle": ["abc", "de"],
                "removed_object_ids": [1],
            },
        },
        {"done": {"frames_answered": 1, "progress": [3, 3]}},
    ]  # fmt: skip
    assert json.loads(seen["inputs"][protocol.SETTINGS][0]) == settings
    assert seen["inputs"][protocol.START_FRAME].tolist() == [0]
    assert seen["inputs"][protocol.MAX_FRAMES].tolist() == [-1]
    assert seen["inputs"][protocol.REVERSE].tolist() == [False]


def test_the_servers_refusals_are_typed_answers(monkeypatch) -> None:
    message = error_message(protocol.ERR_SESSION_NOT_FOUND, "session_id: no such session")
    seen: dict[str, Any] = {}
    _stand_in(monkeypatch, [route.refusal(f"[StatusCode.NOT_FOUND] {message}")], seen)
    status, body = _post({"command": "info", "session_id": "s-1"})
    assert status == 404
    assert json.loads(body) == {
        "code": "SessionNotFound", "field": "session_id", "message": "session_id: no such session"
    }  # fmt: skip
    # Refused before the first response: the propagation's answer is the typed JSON too.
    limit = error_message(protocol.ERR_INVALID_INPUT, "settings.max_num_objects: got 65")
    _stand_in(monkeypatch, [route.refusal(limit)], seen)
    status, body = _post({"command": "propagate", "session_id": "s-1"})
    assert status == 400 and json.loads(body)["field"] == "settings.max_num_objects"
    # Refused mid-stream (a session evicted meanwhile): an error line after the progress.
    progress = {protocol.PROGRESS: np.array([1, 3], np.int32)}
    _stand_in(monkeypatch, [progress, route.refusal(message)], seen)
    status, body = _post({"command": "propagate", "session_id": "s-1"})
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert status == 200 and lines[0] == {"progress": [1, 3]}
    assert lines[1] == {
        "error": {"code": "SessionNotFound", "message": "session_id: no such session"}
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body"),
        ([1], "body"),
        ({"command": "track"}, "command"),
        ({"command": "init", "num_frames": 3}, "video_hw"),
        ({"command": "init", "num_frames": 3, "video_hw": [1, 2, 3]}, "video_hw"),
        ({"command": "init", "num_frames": "3", "video_hw": [1, 2]}, "num_frames"),
        ({"command": "info", "session_id": ""}, "session_id"),
        ({"command": "info", "session_id": "s", "tenant": "b"}, "tenant"),
        ({"command": "add_frame", "session_id": "s", "frame_index": 0, "frame_bytes": "!"},
         "frame_bytes"),
        ({"command": "add_prompt", "session_id": "s", "text": "cat"}, "text"),
        ({"command": "add_prompt", "session_id": "s", "text": ["a"] * 17}, "text"),
        ({"command": "propagate", "session_id": "s", "reverse": 1}, "reverse"),
        ({"command": "propagate", "session_id": "s", "settings": [1]}, "settings"),
    ],
)  # fmt: skip
def test_bad_bodies_are_400_naming_the_field(body: Any, field: str) -> None:
    status, raw = _post(body)
    assert status == 400, raw
    assert json.loads(raw)["field"] == field, raw


def test_bounds_the_body_the_frame_and_the_model() -> None:
    status, _ = _post(b" " * (route.MAX_BODY_BYTES + 1))
    assert status == 413
    big = "A" * (4 * -(-route.MAX_FRAME_BYTES // 3) + 4)
    body = {"command": "add_frame", "session_id": "s", "frame_index": 0, "frame_bytes": big}
    status, raw = _post(body)
    assert status == 413 and json.loads(raw)["field"] == "frame_bytes"
    for model in ("sam3_concept", "x"):  # listed but another kind; not listed
        status, _ = _post({"command": "info", "session_id": "s"}, model=model)
        assert status == 404


def test_the_browser_going_away_closes_the_stream(monkeypatch) -> None:
    seen: dict[str, Any] = {}

    async def fake(endpoint, model, inputs, headers, timeout_s=None):
        try:
            yield {protocol.PROGRESS: np.array([1, 100], np.int32)}
            await asyncio.sleep(30)
        finally:
            seen["closed"] = True

    async def run() -> None:
        app = Starlette(routes=route.concept_video_routes("triton:8001", _listed))
        body = json.dumps({"command": "propagate", "session_id": "s"}).encode()
        await asgi_post(app, f"/web/concept-video/{MODEL}", body, disconnect_after=1)
        await asyncio.sleep(0.1)

    monkeypatch.setattr(route, "responses", fake)
    asyncio.run(run())
    assert seen.get("closed") is True
