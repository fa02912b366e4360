"""The volume tracker's windows: they follow an object across slices larger than a window.

The tracker here is a stand-in that answers, on each frame it is given, the bright pixels of
that frame (what a perfect tracker answers for a bright object on a dark background), and
records every frame it was sent. So the expected labels are exact: the object on every slice.
"""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.client.volume import VolumeTracker, WindowMask, window_source, write_labels
from triton_sam.errors import InputValidationError
from triton_sam.serving.tiles import Block


class BrightTracker:
    """The calls of SAM2VideoTritonClient the volume tracker makes, answered from pixels."""

    def __init__(self):
        self.opened, self.closed, self.frames_read, self.masks_given = 0, 0, [], []
        self.calls = []  # (call, frame) in order

    def init_state(self, source):
        self.opened += 1
        return {"source": source, "prompted": False}

    def close_state(self, state):
        self.closed += 1

    def _answer(self, state, frame):
        pixels = state["source"].pixels(frame)
        self.frames_read.append(pixels.shape)
        logits = np.where(pixels > 127, 1.0, -1.0).astype(np.float32)[None, None]
        return frame, [7], logits

    def add_new_points_or_box(
        self, state, frame, obj_id, points=None, labels=None, box=None, clear_old_points=True
    ):
        assert obj_id == 7
        self.calls.append(("points" if clear_old_points else "points on the mask", frame))
        pts = np.asarray(points).reshape(-1, 2)
        h, w = state["source"].height, state["source"].width
        assert (pts >= 0).all() and (pts[:, 0] < w).all() and (pts[:, 1] < h).all()
        state["prompted"] = True
        return self._answer(state, frame)

    def add_new_mask(self, state, frame, obj_id, mask):
        assert mask.shape == (state["source"].height, state["source"].width)
        self.masks_given.append(int(mask.sum()))
        self.calls.append(("mask", frame))
        state["prompted"] = True
        return self._answer(state, frame)

    def propagate_in_video(self, state, start_frame_idx=None, reverse=False):
        assert state["prompted"]
        last = state["source"].num_frames - 1
        frames = range(start_frame_idx, -1, -1) if reverse else range(start_frame_idx, last + 1)
        for frame in frames:
            yield self._answer(state, frame)


def moving_disk(z=12, size=(600, 900), step=(15, 30), radius=40, start=(150, 100)):
    """A bright disk moving ``step`` pixels per slice (row, col)."""
    volume = np.zeros((z, *size), np.uint8)
    rows, cols = np.ogrid[: size[0], : size[1]]
    for k in range(z):
        r, c = start[0] + step[0] * k, start[1] + step[1] * k
        volume[k][(rows - r) ** 2 + (cols - c) ** 2 <= radius**2] = 255
    return volume


def test_the_window_follows_the_object_through_every_slice():
    volume = moving_disk()
    tracker = BrightTracker()
    vt = VolumeTracker(tracker, volume, window=(256, 256), margin=48)
    labels = np.zeros(volume.shape, np.uint32)
    found = list(vt.track(4, points=[[100 + 30 * 4, 150 + 15 * 4]], labels=[1], obj_id=7))
    for item in found:
        write_labels(labels, item, 7)
    assert sorted(item.z for item in found) == list(range(12))  # each slice once
    assert np.array_equal(labels == 7, volume > 127)  # the whole object on every slice
    assert vt.sessions > 2  # it moved on both ways
    assert tracker.closed == tracker.opened  # every session closed
    assert {shape for shape in tracker.frames_read} == {(256, 256)}  # never a whole slice


def test_a_volume_of_small_slices_is_one_session_over_whole_slices():
    volume = moving_disk(z=5, size=(200, 240), step=(5, 5), radius=20, start=(60, 60))
    tracker = BrightTracker()
    vt = VolumeTracker(tracker, volume, window=(256, 256))
    found = list(vt.track(2, points=[[70, 70]], labels=[1], obj_id=7))
    assert vt.sessions == 1 and tracker.masks_given == []
    assert [item.z for item in found] == [2, 3, 4, 1, 0]  # upstream's order
    assert all(item.window == Block((0, 0), (200, 240)) for item in found)


def test_a_correction_refines_the_slices_mask_and_propagates_again_from_it():
    """The clicks go onto the slice's mask (mask first, then the clicks without clearing it),
    on a window holding both, and tracking runs again both ways from that slice."""
    volume = moving_disk()
    tracker = BrightTracker()
    vt = VolumeTracker(tracker, volume, window=(256, 256), margin=48)
    tracked = {m.z: m for m in vt.track(4, points=[[220, 210]], labels=[1], obj_id=7)}
    tracker.calls.clear()
    opened = tracker.opened
    wrong = tracked[6]  # the user finds slice 6 wrong: its mask shrunk to a corner of the disk
    shrunk = WindowMask(6, wrong.window, np.zeros_like(wrong.mask))
    shrunk.mask[np.nonzero(wrong.mask)[0][0], np.nonzero(wrong.mask)[1][0]] = True
    disk_centre = [100 + 30 * 6, 150 + 15 * 6]  # (X, Y) on slice 6
    labels = np.zeros(volume.shape, np.uint32)
    found = list(vt.correct(shrunk, points=[disk_centre], labels=[1], obj_id=7))
    for item in found:
        write_labels(labels, item, 7)
    assert tracker.calls[:2] == [("mask", 6), ("points on the mask", 6)]
    assert found[0].z == 6 and found[0].window.contains(np.array([disk_centre[::-1]]))[0]
    assert sorted(item.z for item in found) == list(range(12))
    assert np.array_equal(labels == 7, volume > 127)
    assert tracker.opened > opened and tracker.closed == tracker.opened


def test_stop_after_empty_ends_a_direction():
    volume = moving_disk(z=10, size=(200, 200), step=(0, 0), radius=20, start=(100, 100))
    volume[6:] = 0  # the object ends at slice 6
    tracker = BrightTracker()
    vt = VolumeTracker(tracker, volume, window=(256, 256), stop_after_empty=2)
    found = list(vt.track(0, points=[[100, 100]], labels=[1], obj_id=7))
    assert [item.z for item in found] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_write_labels_shrinks_a_corrected_object_and_keeps_others():
    labels = np.zeros((1, 4, 4), np.uint8)
    labels[0, :, :2] = 3  # another object
    labels[0, 1:3, 2:4] = 5
    window = Block((0, 1), (4, 4))
    mask = np.zeros((4, 3), bool)
    mask[1, 2] = True
    mask[0, 0] = True  # on a pixel of object 3: the newest mask is painted over it
    write_labels(labels, window_mask(0, window, mask), 5)
    assert (labels == 5).sum() == 2 and labels[0, 1, 3] == 5 and labels[0, 0, 1] == 5
    assert (labels == 3).sum() == 7  # object 3 is never cleared where the mask is not


def window_mask(z, window, mask):
    from triton_sam.client.volume import WindowMask

    return WindowMask(z, window, mask)


def test_non_uint8_slices_need_a_mapping():
    volume = np.zeros((2, 10, 10), np.uint16)
    source = window_source(volume, Block((0, 0), (10, 10)))
    with pytest.raises(InputValidationError, match="to_rgb"):
        source.pixels(0)
    mapped = window_source(volume, Block((0, 0), (5, 5)), lambda a: (a // 256).astype(np.uint8))
    assert mapped.pixels(1).shape == (5, 5)


def test_a_margin_too_large_for_the_window_is_refused():
    with pytest.raises(InputValidationError, match="margin"):
        VolumeTracker(BrightTracker(), np.zeros((2, 50, 50), np.uint8), window=(64, 64), margin=40)
