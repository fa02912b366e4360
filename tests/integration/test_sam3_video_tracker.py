"""``sam3_tracker`` on the embedded Triton: the SAM3 video graphs (onnxruntime backend) and the
tracker model that calls them, as ``setup-video sam3_tracker`` writes them, driven by
``SAM2VideoTritonClient(model="sam3_tracker")`` with prompts in the frames' pixels.

- the scenario of sam3_video_support.py (clicks and a box for two objects, propagation, a
  correction, propagation again, a third object by a mask) against transformers'
  Sam3TrackerVideoModel on the same weights, within the tolerance stated there; masks come back
  at the video's resolution, so transformers' low-resolution logits are upsampled as the client
  upsamples;
- the same sessions as sam2_tracker: server-issued ids bound to the tenant; another tenant's
  requests on an id are refused as if it did not exist, and the owner's session is intact;
One tritonserver start for the module.
"""

from __future__ import annotations

import numpy as np
import pytest
from sam3_video_support import assert_matches, frames, predictor_run, transformers_run
from tritonclient.utils import InferenceServerException
from video_support import raw_tracker_request

from triton_sam.client.video import SAM2VideoTritonClient
from triton_sam.repository.writer import embedded_repository
from triton_sam.serving.protocol import parse_error
from triton_sam.serving.protocol import tracker as protocol

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def sam3_video_server(sam3_video_build, embedded_triton):
    repo, _ = sam3_video_build
    return embedded_triton(embedded_repository(repo), startup_timeout_s=180.0)


def raw(server, command: str, tenant: str, session: str | None = None, **tensors):
    """One request straight to sam3_tracker as ``tenant``; its status and session id."""
    model = protocol.SAM3_TRACKER_MODEL
    return raw_tracker_request(server, model, command, session, tenant, **tensors)


def test_served_tracking_matches_transformers(sam3_video_server, sam3_video_checkpoint):
    with SAM2VideoTritonClient(
        sam3_video_server.grpc_url, model=protocol.SAM3_TRACKER_MODEL
    ) as client:
        state = client.init_state(frames())
        steps = predictor_run(client, state)
        client.close_state(state)
    assert [masks.shape[-2:] for *_, masks in steps] == [frames()[0].shape[:2]] * len(steps)
    assert_matches(steps, transformers_run(sam3_video_checkpoint))


def test_another_tenant_cannot_use_the_session(sam3_video_server):
    hw = np.array(frames()[0].shape[:2], np.int32)
    init = raw(sam3_video_server, "init", "a", num_frames=np.array([2], np.int32), video_hw=hw)
    session = init["out_session_id"][0].decode()
    assert len(session) >= 22  # 128 random bits, URL-safe base64
    for command in ("info", "close"):
        with pytest.raises(InferenceServerException) as info:
            raw(sam3_video_server, command, "b", session)
        code, text = parse_error(str(info.value.status()), info.value.message())[:2]
        assert code == protocol.ERR_SESSION_NOT_FOUND and session not in text
    status = raw(sam3_video_server, "info", "a", session)["status"][0]
    assert b'"num_frames":2' in status.replace(b" ", b"")
    raw(sam3_video_server, "close", "a", session)


def test_track_command_runs_the_sam3_tracker(sam3_video_server, tmp_path):
    """`triton-sam track --tracker sam3_tracker`: a volume's clicks through SAM3's tracker."""
    from typer.testing import CliRunner

    from triton_sam.bench.counters import read_counters
    from triton_sam.cli import app
    from triton_sam.client.video_source import read_stack

    def served() -> int:  # requests sam3_tracker answered, by the server's statistics
        return read_counters(
            sam3_video_server.http_url, None, protocol.SAM3_TRACKER_MODEL
        ).inference_count

    before = served()
    z, y, x = 3, 40, 50
    zz, yy, xx = np.mgrid[0:z, 0:y, 0:x]
    volume = np.where((xx - 20 - zz) ** 2 + (yy - 20) ** 2 < 36, 200, 20).astype(np.uint8)
    np.save(tmp_path / "stack.npy", volume)
    url = sam3_video_server.grpc_url
    args = ["track", str(tmp_path / "stack.npy"), "--click", "21,20,1,3", "--tracker",
            "sam3_tracker", "--out", str(tmp_path / "out"), "--url", url]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    labels = read_stack(tmp_path / "out" / "masks.tif")
    assert labels.shape == (z, y, x) and set(np.unique(labels)) <= {0, 3}
    assert "3 frames" in result.output
    assert served() > before  # the command's session was sam3_tracker's, not sam2_tracker's
