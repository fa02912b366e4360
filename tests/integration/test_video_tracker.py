"""The sam2_tracker model and SAM2VideoTritonClient on the embedded Triton.

One server for the module: the five tracking graphs of the parity checkpoint (python target:
what the embedded server runs today) and the tracker with small bounds (2 sessions, any
session but the one in use evictable at once), so eviction is reachable (the rule that
protects sessions in active use is tested in test_tracker_isolation.py). Parity is against the
same SAM2VideoPredictor run as the in-process test (tests/parity/test_sam2_video_parity.py,
tolerances stated there).
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from video_support import BOX, CLICK, assert_same_as_upstream, run_scenario

from triton_sam.bench.counters import read_counters
from triton_sam.client.video import SAM2VideoTritonClient
from triton_sam.client.video_state import TrackerRequest
from triton_sam.errors import (
    FrameIndexError,
    InputValidationError,
    NoPromptsError,
    ObjectNotFoundError,
)
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.video_config import TrackerOptions, write_video_models
from triton_sam.repository.writer import embedded_repository
from triton_sam.serving.protocol import tracker as protocol

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def video_server(sam2_video_export, embedded_triton, tmp_path_factory):
    # The production configs (as compose serves them), on Triton's onnxruntime backend.
    repo = tmp_path_factory.mktemp("video") / "model_repository"
    write_video_models(
        repo,
        sam2_video_export.graphs,
        sam2_video_export.config,
        RepositoryOptions(),
        TrackerOptions(max_sessions=2, feature_cache_frames=4, evict_idle_s=0),
    )
    return embedded_triton(embedded_repository(repo), startup_timeout_s=180.0)


def client_scores(state, frame):
    return state.object_scores[frame]


def assert_ready(server) -> None:
    c = grpcclient.InferenceServerClient(server.grpc_url.split("://")[-1])
    try:
        assert c.is_server_ready() and c.is_model_ready(protocol.TRACKER_MODEL)
    finally:
        c.close()


def test_tracking_through_triton_matches_sam2_video_predictor(
    video_server, video_clip, upstream_video_run
):
    with SAM2VideoTritonClient(video_server.grpc_url, protocol="grpc") as client:
        state = client.init_state(video_clip)
        try:
            ours = run_scenario(client, state, client_scores)
        finally:
            client.close_state(state)
    assert_same_as_upstream(ours, upstream_video_run)


def test_prompts_over_http_match_sam2_video_predictor(video_server, video_clip, upstream_video_run):
    """The scenario's prompts (a click, a box) over HTTP: the same values as over gRPC. The
    whole scenario over HTTP ran the same tracking a second time (~1 min of CI) for what only
    the wire changes; propagation over HTTP, both ways, is in
    test_a_grayscale_volume_is_tracked_slice_by_slice."""
    with SAM2VideoTritonClient(video_server.http_url, protocol="http") as client:
        state = client.init_state(video_clip)
        try:
            step = client.add_new_points_or_box(state, 0, 1, points=[CLICK], labels=[1])
            ours = [("click", *step, client_scores(state, 0))]
            step = client.add_new_points_or_box(state, 0, 2, box=BOX)
            ours.append(("box", *step, client_scores(state, 0)))
        finally:
            client.close_state(state)
    assert_same_as_upstream(ours, upstream_video_run[: len(ours)])


def test_bad_calls_raise_typed_errors_and_the_server_stays_ready(video_server, video_clip):
    with SAM2VideoTritonClient(video_server.grpc_url) as client:
        state = client.init_state(video_clip)
        try:
            with pytest.raises(NoPromptsError):
                list(client.propagate_in_video(state))
            with pytest.raises(FrameIndexError) as info:
                client.add_new_points_or_box(state, 99, 1, points=[CLICK], labels=[1])
            assert info.value.field == "frame_index"
            with pytest.raises(InputValidationError) as info:
                client.add_new_points_or_box(state, 0, 1, points=[CLICK], labels=[7])
            assert info.value.field == "labels"
            with pytest.raises(ObjectNotFoundError):
                client.remove_object(state, 42, strict=True)
            with pytest.raises(InputValidationError) as info:
                client.add_new_mask(state, 0, 1, np.ones((3, 3), bool))
            assert info.value.field == "mask"
        finally:
            client.close_state(state)
        with pytest.raises(InputValidationError) as info:
            client.init_state(np.zeros((4, 5), np.uint8))  # a 2-D "volume"
        assert info.value.field == "video"
    assert_ready(video_server)


def raw(server, command, session=None, **tensors):
    """One request straight to the tracker, bypassing the client (which validates first);
    its status, or for init the issued session id."""
    c = grpcclient.InferenceServerClient(server.grpc_url.split("://")[-1])
    names = {
        "object": "BYTES",
        "int32": "INT32",
        "float32": "FP32",
        "uint8": "UINT8",
        "bool": "BOOL",
    }
    items = [("command", np.array([[command.encode()]], object))]
    if session is not None:
        items += [("session_id", np.array([[session.encode()]], object))]
    items += [(k, np.asarray(v)[None]) for k, v in tensors.items()]
    inputs = []
    for name, value in items:
        tensor = grpcclient.InferInput(name, list(value.shape), names[value.dtype.name])
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    try:
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("status", "out_session_id")]
        result = c.infer(protocol.TRACKER_MODEL, inputs, outputs=outputs)
        if command == "init":
            return result.as_numpy("out_session_id").reshape(-1)[0].decode()
        return json.loads(result.as_numpy("status").reshape(-1)[0])
    finally:
        c.close()


@pytest.mark.parametrize(
    ("command", "tensors", "code"),
    [
        ("track", {"frame_index": np.array([0], np.int32)}, "SessionNotFound"),
        ("teleport", {}, "InvalidInput"),
        (
            "init",
            {"num_frames": np.array([10**6], np.int32), "video_hw": np.array([8, 8], np.int32)},
            "LimitExceeded",
        ),
        (
            "init",
            {"num_frames": np.array([2], np.int32), "video_hw": np.array([0, 8], np.int32)},
            "InvalidInput",
        ),
    ],
    ids=["unknown-session", "unknown-command", "too-many-frames", "empty-frame-size"],
)
def test_raw_requests_are_validated_on_the_server(video_server, command, tensors, code):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as info:
        raw(video_server, command, session=None if command == "init" else "never-made", **tensors)
    assert protocol.error_code(info.value.message()) == code
    assert_ready(video_server)


def test_raw_frames_of_the_wrong_size_or_type_are_refused(video_server):
    from tritonclient.utils import InferenceServerException

    session = raw(
        video_server,
        "init",
        num_frames=np.array([2], np.int32),
        video_hw=np.array([4, 6], np.int32),
    )
    bad_frames = [
        {"frame": np.zeros((5, 6, 3), np.uint8)},  # another size
        {"frame": np.zeros((4, 6, 2), np.uint8)},  # two channels
        {"frame_bytes": np.array([b"not an image"], object)},
    ]
    for frame in bad_frames:
        with pytest.raises(InferenceServerException) as info:
            raw(video_server, "add_frame", session, frame_index=np.array([0], np.int32), **frame)
        assert protocol.error_code(info.value.message()) == "InvalidInput"
    raw(video_server, "close", session)
    assert_ready(video_server)


def test_a_session_evicted_mid_propagation_is_recreated_transparently(
    video_server, video_clip, upstream_video_run
):
    """The server holds 2 sessions: opening two more evicts this one between two frames;
    the client opens a new session (a new id), replays its prompts and tracked frames, and
    the masks are upstream's."""
    with SAM2VideoTritonClient(video_server.grpc_url) as client:
        state = client.init_state(video_clip)
        first_id = state.session_id
        ours = []
        step = client.add_new_points_or_box(state, 0, 1, points=[CLICK], labels=[1])
        ours.append(("click", *step, client_scores(state, 0)))
        step = client.add_new_points_or_box(state, 0, 2, box=BOX)
        ours.append(("box", *step, client_scores(state, 0)))
        others = []
        for frame, ids, masks in client.propagate_in_video(state, max_frame_num_to_track=2):
            ours.append(("forward", frame, ids, masks, client_scores(state, frame)))
            if frame == 1:  # evict this session: two newer ones fill the server
                others = [client.init_state(np.zeros((1, 8, 8), np.uint8)) for _ in range(2)]
        for other in others:
            client.close_state(other)
        client.close_state(state)
    assert state.resets == 1 and state.session_id != first_id
    assert_same_as_upstream(ours, upstream_video_run[: len(ours)])


def test_cancelled_propagation_runs_nothing_more_on_the_server(video_server, video_clip):
    """gRPC: cancel while a frame is in flight; the server's counters show at most that frame
    ran after the ones consumed, and nothing after the cancel."""
    with SAM2VideoTritonClient(video_server.grpc_url) as client:
        state = client.init_state(video_clip)
        client.add_new_points_or_box(state, 0, 1, points=[CLICK], labels=[1])
        before = client.session_info(state)["session"]["frames_tracked"]
        consumed: list[int] = []
        first = threading.Event()

        def consume():
            for frame, _, _ in client.propagate_in_video(state):
                consumed.append(frame)
                first.set()

        worker = threading.Thread(target=consume)
        worker.start()
        assert first.wait(600)
        time.sleep(0.5)  # the next frame's request is in flight now
        client.cancel_propagation(state)
        worker.join(600)
        assert not worker.is_alive()
        time.sleep(2.0)
        ran = client.session_info(state)["session"]["frames_tracked"] - before
        time.sleep(3.0)
        ran_later = client.session_info(state)["session"]["frames_tracked"] - before
        client.close_state(state)
    counters = read_counters(
        video_server.http_url, video_server.metrics_url, protocol.TRACKER_MODEL
    )
    print(f"consumed {consumed}, frames tracked by the server {ran}, tracker {counters}")
    assert len(consumed) < 8 and len(consumed) <= ran <= len(consumed) + 1
    assert ran_later == ran  # nothing ran after the cancel


def test_reading_a_frame_returns_its_masks_only(video_server, video_clip):
    with SAM2VideoTritonClient(video_server.grpc_url) as client:
        state = client.init_state(video_clip)
        _, _, clicked = client.add_new_points_or_box(state, 0, 1, points=[CLICK], labels=[1])
        request = TrackerRequest(
            protocol.CMD_GET,
            {"frame_index": np.array([0], np.int32)},
            ("masks", "object_ids", "out_frame_index", "object_scores"),
        )
        out = client._command(state, request)
        frame, ids, masks = client.get_frame_masks(state, 0)
        client.close_state(state)
    payload = sum(v.nbytes for v in out.values())
    assert payload <= 256 * 256 * 4 + 64  # one object's low-res logits, no memory bank
    assert (frame, ids) == (0, [1])
    np.testing.assert_array_equal(masks, clicked)


def test_a_grayscale_volume_is_tracked_slice_by_slice(video_server):
    z, y, x = 3, 33, 47
    zz, yy, xx = np.mgrid[0:z, 0:y, 0:x]
    volume = np.where((xx - 20 - 2 * zz) ** 2 + (yy - 15) ** 2 < 49, 220, 30).astype(np.uint8)
    with SAM2VideoTritonClient(video_server.http_url, protocol="http") as client:
        state = client.init_state(volume)
        client.add_new_points_or_box(state, 1, 5, points=[[20, 15]], labels=[1])
        frames = {f: m for f, _, m in client.propagate_in_video(state, start_frame_idx=1)}
        frames |= {
            f: m for f, _, m in client.propagate_in_video(state, start_frame_idx=1, reverse=True)
        }
        info = client.session_info(state)
        client.close_state(state)
    assert sorted(frames) == [0, 1, 2]
    assert all(m.shape == (1, 1, y, x) for m in frames.values())
    assert info["session"]["frames_uploaded"] == 3  # each slice sent once, as uint8 pixels


def test_a_volume_of_small_slices_tracks_as_the_video_client_does(video_server):
    """VolumeTracker on slices that fit a window: the same masks as today's calls, exactly."""
    from triton_sam.client.volume import VolumeTracker

    z, y, x = 4, 40, 52
    zz, yy, xx = np.mgrid[0:z, 0:y, 0:x]
    volume = np.where((xx - 18 - 3 * zz) ** 2 + (yy - 20) ** 2 < 64, 210, 25).astype(np.uint8)
    with SAM2VideoTritonClient(video_server.grpc_url) as client:
        state = client.init_state(volume)
        client.add_new_points_or_box(state, 1, 2, points=[[21, 20]], labels=[1])
        expected = {}
        for reverse in (False, True):
            for f, _, m in client.propagate_in_video(state, start_frame_idx=1, reverse=reverse):
                expected[f] = m[0, 0] > 0
        client.close_state(state)
        tracker = VolumeTracker(client, volume, window=(64, 64), margin=8)
        found = list(tracker.track(1, points=[[21, 20]], labels=[1], obj_id=2))
    assert tracker.sessions == 1
    assert [m.z for m in found] == [1, 2, 3, 0]
    for m in found:
        assert m.window.shape == (y, x)
        np.testing.assert_array_equal(m.mask, expected[m.z])


def test_a_correction_on_a_volume_of_small_slices_is_the_video_clients_refinement(video_server):
    """VolumeTracker.correct on slices that fit a window: the same masks as the calls a user
    of the video client makes to refine a tracked frame (its mask, then clicks on it)."""
    from triton_sam.client.volume import VolumeTracker, WindowMask

    z, y, x = 4, 40, 52
    zz, yy, xx = np.mgrid[0:z, 0:y, 0:x]
    volume = np.where((xx - 18 - 3 * zz) ** 2 + (yy - 20) ** 2 < 64, 210, 25).astype(np.uint8)
    with SAM2VideoTritonClient(video_server.grpc_url) as client:
        tracker = VolumeTracker(client, volume, window=(64, 64), margin=8)
        tracked = {m.z: m for m in tracker.track(1, points=[[21, 20]], labels=[1], obj_id=2)}
        wrong = tracked[2]
        fix = ([[24, 20], [40, 30]], [1, 0])
        state = client.init_state(volume)
        client.add_new_mask(state, 2, 2, wrong.mask)
        _, _, first = client.add_new_points_or_box(
            state, 2, 2, points=fix[0], labels=fix[1], clear_old_points=False
        )
        expected = {2: first[0, 0] > 0}
        for reverse in (False, True):
            for f, _, m in client.propagate_in_video(state, start_frame_idx=2, reverse=reverse):
                expected.setdefault(f, m[0, 0] > 0)
        client.close_state(state)
        found = list(tracker.correct(WindowMask(2, wrong.window, wrong.mask), *fix, obj_id=2))
    assert [m.z for m in found] == [2, 3, 1, 0]
    # the check can tell a correction from none: the clicks changed slice 2's mask
    assert not np.array_equal(expected[2], wrong.mask)
    for m in found:
        np.testing.assert_array_equal(m.mask, expected[m.z])


def test_a_volume_of_large_slices_is_tracked_on_windows(video_server):
    """Slices larger than the window: every frame the server receives is a window."""
    from triton_sam.client.volume import VolumeTracker, write_labels

    z, y, x = 3, 200, 260
    zz, yy, xx = np.mgrid[0:z, 0:y, 0:x]
    volume = np.where((xx - 120 - 20 * zz) ** 2 + (yy - 90) ** 2 < 400, 220, 30).astype(np.uint8)
    labels = np.zeros(volume.shape, np.uint8)
    with SAM2VideoTritonClient(video_server.grpc_url) as client:
        tracker = VolumeTracker(client, volume, window=(96, 96), margin=16)
        for found in tracker.track(0, points=[[120, 90]], labels=[1], obj_id=1):
            assert found.window.shape == (96, 96)
            write_labels(labels, found, 1)
    assert set(np.unique(labels)) <= {0, 1}
    assert tracker.sessions >= 1


def test_track_command_writes_a_label_stack_for_a_volume(video_server, tmp_path):
    from typer.testing import CliRunner

    from triton_sam.cli import app
    from triton_sam.client.video_source import read_stack

    z, y, x = 3, 40, 50
    zz, yy, xx = np.mgrid[0:z, 0:y, 0:x]
    volume = np.where((xx - 20 - zz) ** 2 + (yy - 20) ** 2 < 36, 200, 20).astype(np.uint8)
    np.save(tmp_path / "stack.npy", volume)
    result = CliRunner().invoke(
        app,
        [
            "track",
            str(tmp_path / "stack.npy"),
            "--click",
            "21,20,1,3",
            "--out",
            str(tmp_path / "out"),
            "--url",
            video_server.grpc_url,
        ],
    )
    assert result.exit_code == 0, result.output
    labels = read_stack(tmp_path / "out" / "masks.tif")
    assert labels.shape == (z, y, x) and set(np.unique(labels)) <= {0, 3}
    assert "3 frames" in result.output


def test_volume_notebook_executes(video_server, monkeypatch):
    """examples/volume_tracking.ipynb top to bottom, against this module's server."""
    from pathlib import Path

    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("TRITON_SAM_VIDEO_GRPC_URL", video_server.grpc_url)
    monkeypatch.setenv("TRITON_SAM_VOLUME_Z", "4")  # CI: 4 slices
    nb = nbformat.read(root / "examples" / "volume_tracking.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(root)}}
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1  # slice + XZ view
    assert video_server.grpc_url in "".join(o.get("text", "") for o in outputs)
