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
import tritonclient.grpc as grpcclient
from sam3_video_support import assert_matches, frames, predictor_run, transformers_run
from tritonclient.utils import InferenceServerException

from triton_sam.client.video import SAM2VideoTritonClient
from triton_sam.repository.writer import embedded_repository
from triton_sam.serving.protocol import parse_error
from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.protocol.tenancy import TENANT_HEADER

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(1800)]
_DTYPES = {"object": "BYTES", "int32": "INT32"}


@pytest.fixture(scope="module")
def sam3_video_server(sam3_video_build, embedded_triton):
    repo, _ = sam3_video_build
    return embedded_triton(embedded_repository(repo), startup_timeout_s=180.0)


def raw(server, command: str, tenant: str, session: str | None = None, **tensors):
    """One request straight to sam3_tracker as ``tenant``; its status and session id."""
    items = {"command": np.array([command.encode()], object)}
    if session is not None:
        items["session_id"] = np.array([session.encode()], object)
    items |= {k: np.asarray(v) for k, v in tensors.items()}
    inputs = []
    for name, value in items.items():
        tensor = grpcclient.InferInput(name, [1, *value.shape], _DTYPES[value.dtype.name])
        tensor.set_data_from_numpy(value[None])
        inputs.append(tensor)
    outputs = ["status", "out_session_id"]
    client = grpcclient.InferenceServerClient(server.grpc_url.split("://")[-1])
    try:
        result = client.infer(
            protocol.SAM3_TRACKER_MODEL,
            inputs,
            outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
            headers={TENANT_HEADER: tenant},
        )
        return {n: result.as_numpy(n)[0] for n in outputs}
    finally:
        client.close()


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
