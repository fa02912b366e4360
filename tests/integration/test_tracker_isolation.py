"""A hostile lab member against another user's tracking session, on the embedded Triton.

The victim A tracks a clip with ``SAM2VideoTritonClient`` (default tenant, as without the
proxy). The attacker B sends raw tritonclient requests that bypass our clients, as tenant
``b`` (the header the proxy sets, sent straight to Triton, which forwards it to the model)
and as A's own tenant. Each attack is refused with its typed error, and A's results after the
attacks are bit-identical to A's run on the same server with nobody else on it, in the same
session (no re-creation). The tracker holds 3 sessions, 2 per tenant, and evicts only
sessions idle for 60 s (the default).
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from video_support import CLICK, raw_tracker_request

from triton_sam.client.video import SAM2VideoTritonClient
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.video_config import TrackerOptions, write_video_models
from triton_sam.repository.writer import embedded_repository
from triton_sam.serving.protocol import parse_error
from triton_sam.serving.protocol import tracker as protocol

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(1800)]

TRACKED = 2  # frames propagated after frame 0 (about 2 s each on a CPU)


@pytest.fixture(scope="module")
def isolation_server(sam2_video_export, embedded_triton, tmp_path_factory):
    repo = tmp_path_factory.mktemp("isolation") / "model_repository"
    write_video_models(
        repo,
        sam2_video_export.graphs,
        sam2_video_export.config,
        RepositoryOptions(),
        TrackerOptions(max_sessions=3, max_tenant_sessions=2, feature_cache_frames=4),
    )
    # EmbeddedTriton forwards the tenant header, as serve, compose and Kubernetes do.
    return embedded_triton(embedded_repository(repo), startup_timeout_s=180.0)


def raw(server, command: str, session: str | None = None, tenant: str | None = None, **tensors):
    """One request straight to the tracker as ``tenant`` (None: no header); its outputs."""
    outputs = ("status", "out_session_id", "object_ids")
    model = protocol.TRACKER_MODEL
    return raw_tracker_request(server, model, command, session, tenant, outputs, **tensors)


def raw_init(server, tenant: str | None, **extra) -> str:
    out = raw(
        server,
        "init",
        tenant=tenant,
        num_frames=np.array([2], np.int32),
        video_hw=np.array([8, 8], np.int32),
        **extra,
    )
    return out["out_session_id"][0].decode()


def refusal(fn, *args, **kwargs) -> tuple[str, str, str]:
    """(code, text, status) of a request the tracker refuses with its typed envelope."""
    with pytest.raises(InferenceServerException) as info:
        fn(*args, **kwargs)
    status, message = str(info.value.status()), info.value.message()
    parsed = parse_error(status, message)
    assert parsed is not None, f"not a typed refusal: {status} {message}"
    return parsed[0], parsed[1], status


def victim_run(server, video_clip, attack=None):
    """A's scenario (a click on frame 0, then TRACKED frames), ``attack(state)`` between the
    click and the propagation; A's outputs and final state."""
    with SAM2VideoTritonClient(server.grpc_url) as client:
        state = client.init_state(video_clip)
        issued = state.session_id
        steps = [client.add_new_points_or_box(state, 0, 1, points=[CLICK], labels=[1])]
        if attack is not None:
            attack(state)
        steps += list(client.propagate_in_video(state, max_frame_num_to_track=TRACKED))
        info = client.session_info(state)
        client.close_state(state)
    assert state.session_id == issued and state.resets == 0  # never lost, never re-created
    return steps, [state.object_scores[f] for f, _, _ in steps], info


@pytest.fixture(scope="module")
def alone(isolation_server, video_clip):
    """A's run with nobody else on the server."""
    return victim_run(isolation_server, video_clip)


def assert_bit_identical(ours, reference) -> None:
    (steps, scores, info), (ref_steps, ref_scores, ref_info) = ours, reference
    assert [(f, ids) for f, ids, _ in steps] == [(f, ids) for f, ids, _ in ref_steps]
    for (_, _, masks), (_, _, ref) in zip(steps, ref_steps, strict=True):
        np.testing.assert_array_equal(masks, ref)
    for a, b in zip(scores, ref_scores, strict=True):
        np.testing.assert_array_equal(a, b)
    assert info == ref_info


def test_issued_ids_are_random_and_a_client_chosen_one_is_refused(isolation_server):
    ids = [raw_init(isolation_server, "ids") for _ in range(2)]
    assert len(set(ids)) == 2 and all(len(i) >= 22 for i in ids)  # 128 bits, base64
    for sid in ids:
        raw(isolation_server, "close", sid, "ids")
    mine = np.array([b"mine"], object)
    code, text, _ = refusal(raw_init, isolation_server, "ids", session_id=mine)
    assert code == protocol.ERR_INVALID_INPUT and text.startswith("session_id:")


def test_attacks_on_a_session_are_refused_and_its_owner_never_notices(
    isolation_server, video_clip, alone
):
    server = isolation_server
    seen: dict[str, object] = {}

    def attack(state) -> None:
        victim = state.session_id
        seen["victim"] = victim
        # 1. B holds A's id but is another tenant: every command is a plain miss, worded as
        # the miss of an id never issued, and never echoing the id.
        never = refusal(raw, server, "info", "x" * 22, "b")
        frame = {"frame_index": np.array([0], np.int32)}
        point = {
            **frame,
            "object_id": np.array([1], np.int32),
            "points": np.array([[5.0, 5.0]], np.float32),
            "labels": np.array([1], np.int32),
        }
        attacks = [
            ("info", {}),
            ("get", frame),
            ("track", frame),
            ("add_points", point),
            ("remove_object", {"object_id": np.array([1], np.int32)}),
            ("clear_prompts", {**frame, "object_id": np.array([1], np.int32)}),
            ("reset", {}),
            ("close", {}),
        ]
        for command, tensors in attacks:
            result = refusal(raw, server, command, victim, "b", **tensors)
            assert result == never, command
            assert result[0] == protocol.ERR_SESSION_NOT_FOUND and victim not in result[1]
        # 2. B, in A's tenant without A's id, guesses names: misses.
        for guess in ("user_session_1", "0", victim[:-1], victim.upper()):
            assert refusal(raw, server, "info", guess)[0] == protocol.ERR_SESSION_NOT_FOUND
        # 3. B replaces A's session with an init under A's id, in either tenant: refused.
        for tenant in ("b", None):
            code, text, _ = refusal(
                raw_init, server, tenant, session_id=np.array([victim.encode()], object)
            )
            assert code == protocol.ERR_INVALID_INPUT and text.startswith("session_id:")
        # 4. B fills the server to evict A (3 sessions held, 2 per tenant, 60 s idle rule):
        # B gets its quota, then Overloaded (UNAVAILABLE: retry later), and so does C.
        mine = [raw_init(server, "b") for _ in range(2)]
        for tenant in ("b", "b", "c", "c", None):
            code, _, status = refusal(raw_init, server, tenant)
            assert code == protocol.ERR_OVERLOADED and status == "StatusCode.UNAVAILABLE"
        # 5. B's own status is about B's session only: nothing server-wide.
        status = json.loads(raw(server, "info", mine[0], "b")["status"][0])
        assert list(status) == ["session"]
        assert sorted(status["session"]) == sorted(protocol.STATUS_KEYS)
        assert status["session"]["num_frames"] == 2 and status["session"]["objects"] == []
        for sid in mine:
            raw(server, "close", sid, "b")
        seen["attacked"] = True

    attacked = victim_run(server, video_clip, attack)
    assert seen.get("attacked")
    assert_bit_identical(attacked, alone)
    # the server is ready, and A's id reached neither its log nor its metrics
    client = grpcclient.InferenceServerClient(server.grpc_url.split("://")[-1])
    try:
        assert client.is_server_ready() and client.is_model_ready(protocol.TRACKER_MODEL)
    finally:
        client.close()
    with urllib.request.urlopen(f"{server.metrics_url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert "triton_sam_tracker_refusals" in metrics and seen["victim"] not in metrics
    assert seen["victim"] not in server.log_path.read_text(errors="replace")
