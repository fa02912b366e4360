"""Unit tier for the tracking orchestration (numpy only, no torch, no server).

The orchestration runs on a fake graph runner that records every call, so each test checks
one of upstream's decisions (which graph, which flags, which memories) without a model.
Numerical parity with SAM2VideoPredictor is tests/parity/test_sam2_video_parity.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from triton_sam.serving.protocol import tracker as protocol
from triton_sam.serving.protocol.tracker import TrackingError
from triton_sam.serving.resample import antialias_resize
from triton_sam.serving.tracking.config import TrackerConfig
from triton_sam.serving.tracking.memory import select_closest_cond_frames, select_memories
from triton_sam.serving.tracking.state import Session, from_bfloat16, to_bfloat16
from triton_sam.serving.tracking.tracker import COND, NON_COND, Tracker

CONFIG = TrackerConfig()


# -- memory selection -------------------------------------------------------------------------
def test_forward_selection_takes_cond_frames_then_the_six_previous_frames():
    cond = {0: "c0"}
    non_cond = {t: f"n{t}" for t in range(1, 7)}
    sel = select_memories(CONFIG, 7, cond, non_cond, num_frames=10)
    assert sel.memories == ["c0", "n1", "n2", "n3", "n4", "n5", "n6"]
    assert sel.memory_tpos == [0, 1, 2, 3, 4, 5, 6]
    # pointers: the past cond frame (offset 7), then frames 6..1 (offsets 1..6); frame 0 is
    # a cond frame, not a non-cond one, so it is not listed twice
    assert sel.pointers == ["c0", "n6", "n5", "n4", "n3", "n2", "n1"]
    np.testing.assert_array_equal(
        sel.pointer_tpos, np.array([7, 1, 2, 3, 4, 5, 6], np.float32) / np.float32(9)
    )
    assert sel.pointer_tpos.dtype == np.float32


def test_reverse_selection_looks_ahead_and_signs_cond_offsets():
    cond = {9: "c9", 0: "c0"}
    non_cond = {4: "n4", 5: "n5", 6: "n6"}
    sel = select_memories(CONFIG, 3, cond, non_cond, num_frames=10, reverse=True)
    assert sel.memories == ["c9", "c0", "n6", "n5", "n4"]  # insertion order of cond frames
    assert sel.memory_tpos == [0, 0, 4, 5, 6]
    # only cond frames ahead (9), offset (3 - 9) * -1 = 6; frame 0 lies behind
    assert sel.pointers == ["c9", "n4", "n5", "n6"]
    np.testing.assert_array_equal(sel.pointer_tpos * 9, np.array([6, 1, 2, 3], np.float32))


def test_no_pointer_when_the_only_cond_frame_is_ahead():
    sel = select_memories(CONFIG, 3, {5: "c5"}, {}, num_frames=10)
    assert sel.memories == ["c5"] and sel.pointers == []
    assert sel.pointer_tpos.shape == (0,)


def test_memory_stride_picks_every_rth_frame_plus_the_last():
    config = TrackerConfig(memory_temporal_stride_for_eval=2)
    non_cond = {t: t for t in range(1, 10)}
    sel = select_memories(config, 10, {0: "c"}, non_cond, num_frames=20)
    # t_pos 1 would be frame 0, a cond frame (not a recent one): skipped
    assert sel.memories == ["c", 2, 4, 6, 8, 9]
    assert sel.memory_tpos == [0, 2, 3, 4, 5, 6]


def test_unselected_cond_frames_count_as_recent_frames():
    cond = {0: "c0", 4: "c4", 8: "c8"}
    selected, unselected = select_closest_cond_frames(5, cond, 2)
    assert list(selected) == [4, 8] and list(unselected) == [0]
    config = TrackerConfig(max_cond_frames_in_attn=2)
    sel = select_memories(config, 6, cond, {5: "n5"}, num_frames=10)
    assert sel.memories[:2] == ["c4", "c8"]
    assert "n5" in sel.memories


def test_selection_without_cond_frame_is_refused():
    with pytest.raises(ValueError, match="conditioning frame"):
        select_memories(CONFIG, 1, {}, {0: "x"}, num_frames=3)


# -- bfloat16 storage -------------------------------------------------------------------------
def test_bfloat16_rounds_to_nearest_even_like_torch():
    bits = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x3F80C000, 0xBF808001], np.uint32)
    got = to_bfloat16(bits.view(np.float32))
    np.testing.assert_array_equal(
        got, np.array([0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xBF81], np.uint16)
    )
    assert np.isnan(from_bfloat16(to_bfloat16(np.array([np.nan], np.float32))))[0]


def test_bfloat16_round_trip_is_exact_for_bfloat16_values():
    values = from_bfloat16(np.arange(0, 0x7F80, 7, dtype=np.uint16))
    np.testing.assert_array_equal(from_bfloat16(to_bfloat16(values)), values)


# -- config and protocol ------------------------------------------------------------------------
def test_config_round_trips_and_refuses_unknown_or_mistyped_settings():
    config = TrackerConfig(num_maskmem=5, only_obj_ptrs_in_the_past_for_eval=False)
    assert TrackerConfig.from_json(config.to_json()) == config
    data = json.loads(config.to_json())
    with pytest.raises(ValueError, match="unknown settings"):
        TrackerConfig.from_json(json.dumps({**data, "new_knob": 1}))
    with pytest.raises(ValueError, match="num_maskmem"):
        TrackerConfig.from_json(json.dumps({**data, "num_maskmem": "7"}))


def test_use_multimask_follows_sam2_base():
    assert CONFIG.use_multimask(True, 1) and CONFIG.use_multimask(False, 0)
    assert not CONFIG.use_multimask(True, 2)  # a box counts as two points
    assert not TrackerConfig(multimask_output_for_tracking=False).use_multimask(False, 0)


def test_error_codes_are_structural():
    message = protocol.error_message(protocol.ERR_FRAME_OUT_OF_RANGE, "frame_index: got 9")
    assert protocol.error_code(f"[StatusCode.INVALID_ARGUMENT] {message}") == "FrameOutOfRange"
    assert protocol.error_code("some other failure") is None
    assert set(protocol.ERROR_STATUS) >= {protocol.ERR_SESSION_NOT_FOUND, protocol.ERR_INTERNAL}


# -- the orchestration on a fake runner ---------------------------------------------------------
class FakeRunner:
    """Returns fixed outputs per graph and records (graph, inputs) of every call."""

    def __init__(self, score: float = 1.0) -> None:
        self.calls: list[tuple[str, dict[str, np.ndarray]]] = []
        self.score = score

    def run(self, graph, inputs, outputs):
        self.calls.append((graph, {k: np.array(v) for k, v in inputs.items()}))
        shapes = {name: shape for name, _, shape in protocol.GRAPHS[graph][1]}
        result = {n: np.full((1, *shapes[n]), 0.25, np.float32) for n in outputs}
        if "object_score_logits" in result:
            result["object_score_logits"][:] = self.score
        if "low_res_masks" in result:
            result["low_res_masks"][:] = np.float32(40.0 * len(self.calls))  # clipped at 32
        return result

    def graphs(self) -> list[str]:
        return [g for g, _ in self.calls]

    def last(self, graph):
        return [inputs for g, inputs in self.calls if g == graph][-1]


def make(num_frames=6, hw=(30, 40), score=1.0):
    runner = FakeRunner(score)
    tracker = Tracker(runner, CONFIG)
    session = Session(num_frames, hw)
    for t in range(num_frames):
        session.frames[t] = np.zeros((*hw, 3), np.uint8)
    return tracker, session, runner


def propagate(tracker, session, **kwargs):
    """``propagate_in_video`` as the service and the in-process predictor run it: the
    processing order, then one ``track`` step per frame."""
    order = tracker.processing_order(session, **kwargs)
    return [(t, *tracker.track(session, t, kwargs.get("reverse", False))[:2]) for t in order]


def test_first_click_decodes_without_memory_and_with_three_masks():
    tracker, session, runner = make()
    frame, ids, masks = tracker.add_new_points_or_box(
        session, 0, 7, np.array([[10.0, 15.0]]), np.array([1])
    )
    assert (frame, ids, masks.shape) == (0, [7], (1, 1, 256, 256))
    assert runner.graphs() == ["video_encoder", "video_decoder"]
    dec = runner.last("video_decoder")
    assert dec["add_no_mem_embed"][0, 0] == 1 and dec["multimask_output"][0, 0] == 1
    assert dec["has_mask_input"][0, 0] == 0
    # (X / W * 1024, Y / H * 1024), then the padding point the prompt encoder would add
    np.testing.assert_array_equal(dec["point_coords"][0], [[256.0, 512.0], [0.0, 0.0]])
    np.testing.assert_array_equal(dec["point_labels"][0], [1, -1])
    assert 0 in session.objects[7].temp_outputs[COND]


def test_box_goes_first_and_gives_a_single_mask():
    tracker, session, runner = make()
    tracker.add_new_points_or_box(
        session, 2, 1, np.array([[5.0, 5.0]]), np.array([0]), box=np.array([1, 2, 20, 25])
    )
    dec = runner.last("video_decoder")
    np.testing.assert_array_equal(dec["point_labels"][0], [2, 3, 0, -1])
    assert dec["multimask_output"][0, 0] == 0


def test_propagation_encodes_prompted_memories_once_then_tracks_with_memory():
    tracker, session, runner = make()
    tracker.add_new_points_or_box(session, 0, 1, np.array([[5.0, 5.0]]), np.array([1]))
    runner.calls.clear()
    results = propagate(tracker, session, max_frame_num_to_track=2)
    assert [f for f, _, _ in results] == [0, 1, 2]
    encoders = [inputs for g, inputs in runner.calls if g == "memory_encoder"]
    assert [e["is_mask_from_pts"][0, 0] for e in encoders] == [1.0, 0.0, 0.0]
    attention = runner.last("memory_attention")  # frame 2: cond frame 0 + frame 1
    assert attention["memory"].shape == (1, 2, 64, 64, 64)
    np.testing.assert_array_equal(attention["memory_tpos"], [[0, 6]])
    assert attention["obj_ptrs"].shape == (1, 2, 256)
    dec = runner.last("video_decoder")
    np.testing.assert_array_equal(dec["point_labels"][0], [-1, -1])  # no prompt: two pads
    assert dec["multimask_output"][0, 0] == 1 and dec["add_no_mem_embed"][0, 0] == 0
    assert session.objects[1].outputs[NON_COND].keys() == {1, 2}
    assert session.objects[1].frames_tracked == {0: False, 1: False, 2: False}


def test_correction_on_a_tracked_frame_feeds_back_clipped_logits():
    tracker, session, runner = make()
    tracker.add_new_points_or_box(session, 0, 1, np.array([[5.0, 5.0]]), np.array([1]))
    propagate(tracker, session)
    tracker.add_new_points_or_box(session, 3, 1, np.array([[8.0, 9.0]]), np.array([0]))
    dec = runner.last("video_decoder")
    assert dec["has_mask_input"][0, 0] == 1 and dec["add_no_mem_embed"][0, 0] == 0
    assert dec["mask_input"].max() == protocol.MASK_INPUT_LIMIT  # the fake logits were > 32
    assert runner.graphs()[-2] == "memory_attention"
    assert 3 in session.objects[1].temp_outputs[NON_COND]


def test_absent_object_scores_are_passed_on_untouched():
    tracker, session, _ = make(score=-3.0)
    tracker.add_new_points_or_box(session, 0, 1, np.array([[5.0, 5.0]]), np.array([1]))
    _, _, scores = tracker.track(session, 1)
    np.testing.assert_array_equal(scores, [-3.0])


def test_mask_prompt_uses_the_mask_as_logits():
    tracker, session, runner = make(hw=(64, 64))
    mask = np.zeros((64, 64), bool)
    mask[16:48, 16:48] = True
    _, _, masks = tracker.add_new_mask(session, 0, 5, mask)
    assert runner.graphs()[-1] == "mask_prompt"
    sent = runner.last("mask_prompt")["mask"]
    assert sent.shape == (1, 1, 1024, 1024) and set(np.unique(sent)) == {0.0, 1.0}
    expected = antialias_resize(sent * 20 - 10, (256, 256))
    np.testing.assert_array_equal(masks[0:1], expected)
    assert masks[0, 0, 128, 128] == 10 and masks[0, 0, 5, 5] == -10


def test_processing_order_is_upstreams():
    tracker, session, _ = make(num_frames=6)
    tracker.add_new_points_or_box(session, 2, 1, np.array([[5.0, 5.0]]), np.array([1]))
    assert tracker.processing_order(session) == [2, 3, 4, 5]
    assert tracker.processing_order(session, reverse=True) == [2, 1, 0]
    assert tracker.processing_order(session, 5, 2, reverse=True) == [5, 4, 3]
    assert tracker.processing_order(session, 0, reverse=True) == []


def test_objects_are_tracked_independently_in_insertion_order():
    tracker, session, _ = make()
    tracker.add_new_points_or_box(session, 0, 9, np.array([[5.0, 5.0]]), np.array([1]))
    _, ids, masks = tracker.add_new_points_or_box(session, 1, 4, box=np.array([1, 1, 9, 9]))
    assert ids == [9, 4]
    assert (masks[0] == protocol.NO_OBJ_SCORE).all()  # object 9 has nothing on frame 1
    ids, removed = tracker.remove_object(session, 9)
    assert ids == [4] and [frame for frame, _ in removed] == [0]
    tracker.remove_object(session, 4)
    assert session.obj_ids == []


@pytest.mark.parametrize(
    ("call", "code", "field"),
    [
        (lambda t, s: t.track(s, 6), protocol.ERR_FRAME_OUT_OF_RANGE, "frame_index"),
        (lambda t, s: t.track(s, 1), protocol.ERR_NO_PROMPTS, None),
        (
            lambda t, s: t.remove_object(s, 3, strict=True),
            protocol.ERR_OBJECT_NOT_FOUND,
            "object_id",
        ),
        (
            lambda t, s: t.add_new_points_or_box(s, 0, 1, np.zeros((1, 2)), np.array([2])),
            protocol.ERR_INVALID_INPUT,
            "labels",
        ),
        (
            lambda t, s: t.add_new_points_or_box(s, 0, 1, np.array([[np.nan, 1.0]]), np.array([1])),
            protocol.ERR_INVALID_INPUT,
            "points",
        ),
        (
            lambda t, s: t.add_new_points_or_box(
                s, 0, 1, box=np.array([0, 0, 5, 5]), clear_old_points=False
            ),
            protocol.ERR_INVALID_INPUT,
            "box",
        ),
        (
            lambda t, s: t.add_new_mask(s, 0, 1, np.zeros((2, 3, 4))),
            protocol.ERR_INVALID_INPUT,
            "mask",
        ),
    ],
)
def test_bad_requests_raise_typed_tracking_errors(call, code, field):
    tracker, session, _ = make()
    with pytest.raises(TrackingError) as info:
        call(tracker, session)
    assert info.value.code == code and info.value.field == field


def test_a_frame_never_uploaded_is_reported_as_such():
    tracker, session, _ = make()
    del session.frames[3]
    with pytest.raises(TrackingError) as info:
        tracker.features(session, 3)
    assert info.value.code == protocol.ERR_FRAME_MISSING


def test_feature_cache_is_bounded():
    tracker, session, runner = make()
    session.feature_cache_frames = 2
    for t in (0, 1, 2, 0):
        tracker.features(session, t)
    assert runner.graphs().count("video_encoder") == 4  # frame 0 was evicted by frame 2
    assert list(session.features) == [2, 0]


# -- the service and its bounded store ----------------------------------------------------------
class Clock:
    """A monotonic clock the tests move by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def service(max_sessions=2, clock=None, evict_idle_s=0, **bounds):
    from triton_sam.serving.tracking.service import TrackingService
    from triton_sam.serving.tracking.sessions import SessionStore

    store = SessionStore(
        max_sessions=max_sessions, evict_idle_s=evict_idle_s, clock=clock or Clock(), **bounds
    )
    return TrackingService(FakeRunner(), CONFIG, store)


def call(svc, command, session, tenant="", **tensors):
    inputs = {protocol.COMMAND: np.array([command.encode()], object), **tensors}
    if session is not None:
        inputs[protocol.SESSION_ID] = np.array([session.encode()], object)
    return svc.handle(inputs, tenant)


def init(svc, tenant="", frames=4, hw=(8, 8)) -> str:
    """A new session of ``tenant``; its issued id."""
    out = call(
        svc,
        "init",
        None,
        tenant,
        num_frames=np.array([frames], np.int32),
        video_hw=np.array(hw, np.int32),
    )
    return out[protocol.OUT_SESSION_ID][0].decode()


def refused(code, fn, *args, **kwargs) -> TrackingError:
    with pytest.raises(TrackingError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, str(info.value)
    return info.value


def status(svc, session, tenant=""):
    return json.loads(call(svc, "info", session, tenant)[protocol.OUT_STATUS][0])


def test_init_issues_unique_unguessable_ids():
    import base64

    svc = service(max_sessions=64)
    ids = [init(svc) for _ in range(64)]
    assert len(set(ids)) == 64
    for sid in ids:  # URL-safe base64 of 16 random bytes: 128 bits, nothing readable
        assert len(base64.urlsafe_b64decode(sid + "==")) == protocol.SESSION_ID_BYTES == 16
    assert not any(a[:6] == b[:6] for a, b in zip(ids, ids[1:], strict=False))  # no counter


def test_init_with_a_client_chosen_id_is_refused():
    svc = service()
    error = refused(
        protocol.ERR_INVALID_INPUT,
        call,
        svc,
        "init",
        "my-session",
        num_frames=np.array([4], np.int32),
        video_hw=np.array([8, 8], np.int32),
    )
    assert error.field == "session_id" and "issues" in str(error)
    assert len(svc.store) == 0


@pytest.mark.parametrize("session", [None, "", "x" * 257])
def test_other_commands_need_a_well_formed_id(session):
    svc = service()
    error = refused(protocol.ERR_INVALID_INPUT, call, svc, "info", session)
    assert error.field == "session_id"


def test_an_id_never_issued_or_issued_to_another_tenant_is_the_same_miss():
    svc = service()
    mine = init(svc, "a")
    frame = {"frame_index": np.array([0], np.int32), "frame": np.zeros((8, 8, 3), np.uint8)}
    call(svc, "add_frame", mine, "a", **frame)
    errors = [
        refused(protocol.ERR_SESSION_NOT_FOUND, call, svc, command, sid, tenant, **tensors)
        for sid, tenant in ((mine, "b"), (mine, ""), ("never-issued", "a"), (mine[:-1], "a"))
        for command, tensors in (("info", {}), ("close", {}), ("add_frame", frame), ("reset", {}))
    ]
    assert len({(e.field, str(e)) for e in errors}) == 1  # nothing tells them apart
    assert all(mine not in str(e) for e in errors)  # the id is never echoed
    assert status(svc, mine, "a")["session"]["frames_uploaded"] == 1  # untouched


def test_status_speaks_of_the_callers_session_only():
    svc = service(max_sessions=4)
    others = [init(svc, "b") for _ in range(2)]
    call(svc, "close", others[0], "b")
    mine = init(svc, "a", frames=3)
    info = status(svc, mine, "a")
    assert list(info) == ["session"]
    assert sorted(info["session"]) == sorted(protocol.STATUS_KEYS)
    assert info["session"] == {
        "bytes": 0,
        "frames_tracked": 0,
        "frames_uploaded": 0,
        "num_frames": 3,
        "objects": [],
    }
    out = call(svc, "close", mine, "a")
    assert protocol.OUT_STATUS not in out  # nothing to report once closed


def test_an_idle_session_is_evicted_for_another_tenant_and_its_owner_sees_a_miss():
    clock = Clock()
    svc = service(max_sessions=2, clock=clock, evict_idle_s=60)
    a1, a2 = init(svc, "a"), init(svc, "a")
    clock.now += 30
    status(svc, a1, "a")  # a1 in use, a2 idle for 30 s
    refused(protocol.ERR_OVERLOADED, init, svc, "b")  # nobody idle for 60 s yet
    assert set(svc.store.tenant_sessions("a")) == {a1, a2} and svc.store.refusals == 1
    clock.now += 31
    b1 = init(svc, "b")  # a2 has been idle 61 s: it makes room
    assert svc.store.tenant_sessions("a") == [a1] and svc.store.evictions == 1
    refused(protocol.ERR_SESSION_NOT_FOUND, status, svc, a2, "a")
    assert status(svc, b1, "b")["session"]["num_frames"] == 4


def test_a_session_in_active_use_is_never_evicted_by_another_tenant():
    clock = Clock()
    svc = service(max_sessions=3, clock=clock, evict_idle_s=60)
    victim = init(svc, "a")
    for _ in range(20):  # bounded: 20 attempts over 20 minutes of fake time
        clock.now += 59
        status(svc, victim, "a")  # the owner keeps working
        try:
            init(svc, "b")
        except TrackingError as e:
            assert e.code == protocol.ERR_OVERLOADED
    assert victim in svc.store.tenant_sessions("a")
    assert len(svc.store.tenant_sessions("b")) == 2  # b's own idle ones made room for b


def test_a_tenant_at_its_quota_evicts_its_own_idle_session_first():
    clock = Clock()
    svc = service(max_sessions=4, clock=clock, evict_idle_s=60, max_tenant_sessions=2)
    a = init(svc, "a")
    b1, b2 = init(svc, "b"), init(svc, "b")
    clock.now += 120  # everyone idle
    b3 = init(svc, "b")  # at its quota: b's least recently used goes, not a's
    assert svc.store.tenant_sessions("b") == [b2, b3]
    assert svc.store.tenant_sessions("a") == [a]
    refused(protocol.ERR_SESSION_NOT_FOUND, status, svc, b1, "b")
    status(svc, b2, "b")
    refused(protocol.ERR_OVERLOADED, init, svc, "b")  # b2, b3 in use: no idle one of b's
    assert len(svc.store) == 3  # the free server slot is not b's to take


def test_a_tenants_bytes_quota_evicts_its_own_idle_sessions_or_refuses():
    clock = Clock()
    svc = service(max_sessions=4, clock=clock, evict_idle_s=60, max_tenant_bytes=600)
    frame = np.zeros((8, 8, 3), np.uint8)  # 192 bytes
    old, new = init(svc, "a"), init(svc, "a")
    for t in (0, 1):
        call(svc, "add_frame", old, "a", frame_index=np.array([t], np.int32), frame=frame)
    call(svc, "add_frame", new, "a", frame_index=np.array([0], np.int32), frame=frame)
    kwargs = {"frame_index": np.array([1], np.int32), "frame": frame}
    refused(protocol.ERR_OVERLOADED, call, svc, "add_frame", new, "a", **kwargs)  # old in use
    clock.now += 61
    status(svc, new, "a")
    call(svc, "add_frame", new, "a", **kwargs)  # old was idle: evicted for its own tenant
    assert svc.store.tenant_sessions("a") == [new]


def test_a_session_above_its_byte_bound_is_refused_and_kept():
    svc = service(max_session_bytes=500)
    sid = init(svc)
    frame = np.zeros((8, 8, 3), np.uint8)  # 192 bytes
    for t in (0, 1):
        call(svc, "add_frame", sid, frame_index=np.array([t], np.int32), frame=frame)
    kwargs = {"frame_index": np.array([2], np.int32), "frame": frame}
    error = refused(protocol.ERR_LIMIT, call, svc, "add_frame", sid, **kwargs)
    assert error.field == "session_id"
    assert sorted(svc.store.get("", sid).frames) == [0, 1]


def test_service_answers_a_prompt_with_masks_and_scores():
    svc = service()
    sid = init(svc, hw=(30, 40))
    call(
        svc,
        "add_frame",
        sid,
        frame_index=np.array([0], np.int32),
        frame=np.zeros((30, 40, 3), np.uint8),
    )
    out = call(
        svc,
        "add_points",
        sid,
        frame_index=np.array([0], np.int32),
        object_id=np.array([3], np.int32),
        points=np.array([[5.0, 5.0]], np.float32),
        labels=np.array([1], np.int32),
    )
    assert out[protocol.OUT_MASKS].shape == (1, 1, 256, 256)
    assert (
        out[protocol.OUT_OBJECT_IDS].tolist() == [3] and out[protocol.OUT_OBJECT_SCORES][0] == 1.0
    )
    order = call(svc, "preflight", sid)[protocol.OUT_FRAMES]
    assert order.tolist() == [0, 1, 2, 3]
    info = status(svc, sid)["session"]
    assert info["frames_uploaded"] == 1 and info["objects"] == [3]


# -- the video client against the service, in-process ----------------------------------------
class ServiceTransport:
    """Stands in for the client's Transport: runs the service in-process as one tenant,
    answers errors in the protocol's envelope, records what each request carried."""

    def __init__(self, svc, tenant="") -> None:
        self.svc, self.tenant = svc, tenant
        self.requests: list[tuple[dict[str, np.ndarray], str | None]] = []

    def infer(self, model, inputs, outputs, *, idempotent=False, routing_key=None):
        from triton_sam.errors import ServerError

        self.requests.append((dict(inputs), routing_key))
        try:
            out = self.svc.handle({k: v[0] for k, v in inputs.items()}, self.tenant)
        except TrackingError as e:
            raise ServerError(protocol.error_message(e.code, str(e))) from e
        return {n: np.asarray(out[n])[None] for n in outputs if n in out}

    def start_infer(self, model, inputs, outputs, *, routing_key=None):
        """A cancellable request (a tracked frame), answered at once."""
        answer = self.infer(model, inputs, outputs, routing_key=routing_key)
        return type("Answered", (), {"wait": lambda _self: answer, "cancel": lambda _self: None})()

    def commands(self) -> list[tuple[str, str | None]]:
        """(command, session id sent or None) of every request."""
        return [
            (
                inputs["command"].reshape(-1)[0].decode(),
                inputs["session_id"].reshape(-1)[0].decode() if "session_id" in inputs else None,
            )
            for inputs, _ in self.requests
        ]


def video_client(transport):
    from triton_sam.client.video import SAM2VideoTritonClient

    client = object.__new__(SAM2VideoTritonClient)  # no server to check for readiness
    client.model, client.transport, client.bytes_sent = protocol.TRACKER_MODEL, transport, 0
    return client


def test_the_video_client_uses_the_issued_id_and_recovers_from_an_eviction():
    clock = Clock()
    svc = service(max_sessions=1, clock=clock, evict_idle_s=60)
    transport = ServiceTransport(svc)
    client = video_client(transport)
    state = client.init_state(np.zeros((3, 8, 8), np.uint8))
    first = state.session_id
    assert first in svc.store.tenant_sessions("") and first not in repr(state)
    client.add_new_points_or_box(state, 0, 1, points=[[4, 4]], labels=[1])
    clock.now += 61  # idle: another tenant's init may take its place
    other = init(svc, "b")
    assert svc.store.tenant_sessions("") == [] and svc.store.tenant_sessions("b") == [other]
    clock.now += 61
    frame, ids, masks = client.get_frame_masks(state, 0)  # lost: re-created, replayed
    assert state.resets == 1 and state.session_id not in (first, "")
    assert (frame, ids, masks.shape) == (0, [1], (1, 1, 8, 8))
    sent = transport.commands()
    assert all(sid is None for command, sid in sent if command == "init")
    assert {sid for command, sid in sent if command != "init"} == {first, state.session_id}
    assert {key for _, key in transport.requests} == {state.routing_key}  # never the id
    assert first not in state.routing_key and state.session_id not in state.routing_key


def test_the_video_client_maps_overloaded_to_a_retryable_error():
    from triton_sam.errors import ServerOverloadedError

    svc = service(max_sessions=1, evict_idle_s=60)
    init(svc, "")
    with pytest.raises(ServerOverloadedError) as info:
        video_client(ServiceTransport(svc)).init_state(np.zeros((2, 8, 8), np.uint8))
    assert "retry later" in str(info.value)


def local_predictor():
    from triton_sam.client.video_local import OnnxVideoPredictor

    predictor = object.__new__(OnnxVideoPredictor)  # no graphs on disk: the fake runner
    predictor.tracker, predictor.feature_cache_frames = Tracker(FakeRunner(), CONFIG), 4
    return predictor


def test_the_video_client_and_the_local_predictor_answer_upstreams_calls_alike():
    from triton_sam.errors import NoPromptsError

    video = np.zeros((5, 8, 12), np.uint8)
    answers = []
    for predictor in (video_client(ServiceTransport(service())), local_predictor()):
        state = predictor.init_state(video)
        with pytest.raises(NoPromptsError):
            list(predictor.propagate_in_video(state))
        steps = [
            predictor.add_new_points_or_box(state, 2, 7, points=[[3, 4]], labels=[1]),
            predictor.add_new_points_or_box(state, 1, 9, box=[1, 1, 6, 5]),
            *predictor.propagate_in_video(state, max_frame_num_to_track=1),
            *predictor.propagate_in_video(state, start_frame_idx=3, reverse=True),
        ]
        answers.append([(frame, ids, masks.shape) for frame, ids, masks in steps])
    assert answers[0] == answers[1]
    assert [frame for frame, _, _ in answers[0]] == [2, 1, 1, 2, 3, 2, 1, 0]
    assert answers[0][-1][1:] == ([7, 9], (2, 1, 8, 12))
