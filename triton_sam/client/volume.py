"""Track one object through z of a volume whose slices are larger than SAM's input.

An EM volume's slices are 10,000 px and more a side; the tracker (SAM2.1's video predictor,
served as ``sam2_tracker``) sees each frame at 1024 px. Resizing a whole slice to 1024 would
lose the membranes the annotator clicks on, so the tracker is given a *window* of the slices
instead, at full resolution, and the window follows the object:

- the first window is centred on the prompts (:func:`~triton_sam.serving.tiles.window_around`);
  every frame of one tracking session is the same window of a slice, so the tracker's memory
  sees a still camera;
- when the object's mask comes within ``margin`` pixels of the window's edge where the slice
  goes on, the session stops there and a new one starts on that slice, with a window centred
  on the mask, prompted with the mask itself (``add_new_mask``): the object is followed
  across the whole slice, and each session's memory starts from the mask it handed over;
- tracking goes on to the volume's end in each direction, as upstream's propagation does
  (an object can come back after slices where it is hidden); ``stop_after_empty=k`` stops a
  direction after ``k`` slices in a row with an empty mask instead;
- a correction (:meth:`VolumeTracker.correct`: clicks on any slice's tracked mask) refines
  that slice's mask as upstream refines a tracked frame, and propagates again from it.

An object that moves more than ``margin`` pixels from one slice to the next can be cut at the
window's edge on the slice where the window moves on (the mask handed over is the cut one):
choose the margin above the largest step an object takes between slices.

A volume whose slices fit in one window is one session over whole slices, prompted and
propagated (forwards, then backwards) exactly as ``SAM2VideoTritonClient`` is used on it
today, so its masks are the same.

Masks go out slice by slice as the window's crop (a :class:`WindowMask`), and
:func:`write_labels` paints them into a label volume region by region (a zarr array writes
only the chunks a window touches), so neither side ever holds a whole slice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from triton_sam.client.video_source import VideoSource
from triton_sam.errors import InputValidationError
from triton_sam.serving.tiles import Block, window_around

DEFAULT_WINDOW = (1024, 1024)  # the tracker's input: a window's pixels are never resampled
DEFAULT_MARGIN = 96  # pixels: larger than an object moves between two EM slices


@dataclass(frozen=True)
class WindowMask:
    """One slice's mask: the pixels of ``window`` (a block of the slice), ``mask`` bool."""

    z: int
    window: Block
    mask: np.ndarray

    @property
    def empty(self) -> bool:
        return not self.mask.any()


def window_source(
    volume, window: Block, to_rgb: Callable[[np.ndarray], np.ndarray] | None = None
) -> VideoSource:
    """The frames of a tracking session: ``window`` of every slice of ``volume`` (any array
    with numpy slicing: numpy, zarr, dask, a tifffile store), read when the tracker needs
    them. ``to_rgb`` maps a slice's pixels to uint8 (None: they must be uint8)."""

    def pixels(z: int) -> np.ndarray:
        crop = np.asarray(volume[(z, *window.slices())])
        if to_rgb is not None:
            return to_rgb(crop)
        if crop.dtype != np.uint8:
            raise InputValidationError(
                "volume",
                f"got {crop.dtype} slices; pass to_rgb (a pixel mapping to uint8), or a uint8 "
                "volume",
            )
        return crop

    rows, cols = window.shape
    return VideoSource(int(volume.shape[0]), rows, cols, True, pixels, lambda z: None)


class VolumeTracker:
    """One object through z of ``volume`` on the server's tracker, on windows that follow it.

    Args:
        client: a :class:`~triton_sam.client.video.SAM2VideoTritonClient` (or any object with
            its ``init_state`` / ``add_new_points_or_box`` / ``add_new_mask`` /
            ``propagate_in_video`` / ``close_state``).
        volume: (Z, Y, X) or (Z, Y, X, C) array, numpy-sliceable (zarr, dask, numpy...).
        window: (rows, cols) of a window; a slice smaller than that is one window.
        margin: pixels from a window edge at which the window moves on.
        to_rgb: the pixel mapping of a slice's crop to uint8 (None: uint8 volumes).
        stop_after_empty: stop a direction after this many empty slices in a row (None: go
            on to the volume's end, as upstream).
    """

    def __init__(
        self,
        client,
        volume,
        *,
        window: tuple[int, int] = DEFAULT_WINDOW,
        margin: int = DEFAULT_MARGIN,
        to_rgb: Callable[[np.ndarray], np.ndarray] | None = None,
        stop_after_empty: int | None = None,
    ) -> None:
        if len(volume.shape) not in (3, 4):
            raise InputValidationError(
                "volume", f"got shape {tuple(volume.shape)}, expected (Z, Y, X) or (Z, Y, X, C)"
            )
        if min(window) < 1 or margin < 0 or 2 * margin >= min(window):
            raise InputValidationError(
                "window", f"got window {window} and margin {margin}; expected 2 * margin < window"
            )
        self.client, self.volume, self.to_rgb = client, volume, to_rgb
        self.slice_shape = (int(volume.shape[1]), int(volume.shape[2]))
        self.window = (min(window[0], self.slice_shape[0]), min(window[1], self.slice_shape[1]))
        self.margin = margin
        self.stop_after_empty = stop_after_empty
        self.sessions = 0  # tracking sessions opened (one per window)

    def track(
        self, z: int, points=None, labels=None, box=None, *, obj_id: int = 1
    ) -> Iterator[WindowMask]:
        """Prompt slice ``z`` (points (X, Y) and labels, and/or a box, in slice pixels) and
        follow the object through the volume: yields the prompted slice's mask, then each
        slice forwards, then each slice backwards, as the tracker answers them."""
        if not 0 <= z < self.volume.shape[0]:
            raise InputValidationError("z", f"got {z}, expected 0..{self.volume.shape[0] - 1}")
        window = window_around(_prompt_rc(points, box), self.slice_shape, self.window)
        state = self._open(window)
        try:
            _, ids, logits = self.client.add_new_points_or_box(
                state, z, obj_id, points=_shift(points, window), labels=labels,
                box=_shift_box(box, window),
            )  # fmt: skip
            yield WindowMask(z, window, _mask_of(ids, logits, obj_id))
            for reverse in (False, True):
                yield from self._follow(state, window, z, obj_id, reverse)
        finally:
            self.client.close_state(state)

    def correct(
        self, current: WindowMask, points, labels, *, obj_id: int = 1
    ) -> Iterator[WindowMask]:
        """Correct one slice's mask with clicks and propagate again from that slice.

        ``current`` is the slice's mask as tracking gave it (a :class:`WindowMask` that
        :meth:`track` or an earlier correction yielded); ``points`` ((X, Y) slice pixels) and
        ``labels`` (1 adds, 0 removes) refine it as a click on a tracked frame refines it
        upstream: the mask goes in first (``add_new_mask``), then the clicks with
        ``clear_old_points=False``, so the decoder sees the mask as its previous logits. The
        window is centred on the mask and the clicks. Yields the corrected slice's mask,
        then each slice forwards, then backwards (write them over the old ones).
        """
        if not 0 <= current.z < self.volume.shape[0]:
            raise InputValidationError("current", f"slice {current.z} is not in the volume")
        rc = _prompt_rc(points, None)
        if not current.empty:
            rows, cols = np.flatnonzero(current.mask.any(1)), np.flatnonzero(current.mask.any(0))
            corners = np.array([[rows[0], cols[0]], [rows[-1], cols[-1]]]) + current.window.begin
            rc = np.concatenate([rc, corners])
        window = window_around(rc, self.slice_shape, self.window)
        state = self._open(window)
        try:
            self.client.add_new_mask(state, current.z, obj_id, _recut(current, window))
            _, ids, logits = self.client.add_new_points_or_box(
                state, current.z, obj_id, points=_shift(points, window), labels=labels,
                clear_old_points=False,
            )  # fmt: skip
            yield WindowMask(current.z, window, _mask_of(ids, logits, obj_id))
            for reverse in (False, True):
                yield from self._follow(state, window, current.z, obj_id, reverse)
        finally:
            self.client.close_state(state)

    def _follow(self, state, window, z, obj_id, reverse) -> Iterator[WindowMask]:
        """Propagate from ``z`` one way in ``state`` (the window of ``window``), handing over
        to a new window whenever the mask reaches an edge where the slice goes on."""
        owned = None  # a session this call opened (closed when it hands over or ends)
        empty_run = 0
        try:
            while True:
                moved = None
                for frame, ids, logits in self.client.propagate_in_video(
                    state, start_frame_idx=z, reverse=reverse
                ):
                    if frame == z:
                        continue  # the prompted (or handed-over) slice, already yielded
                    current = WindowMask(frame, window, _mask_of(ids, logits, obj_id))
                    yield current
                    empty_run = empty_run + 1 if current.empty else 0
                    if self.stop_after_empty is not None and empty_run >= self.stop_after_empty:
                        return
                    moved = self._next_window(current)
                    if moved is not None:
                        break
                if moved is None:
                    return
                if owned is not None:
                    self.client.close_state(owned)
                z, window = current.z, moved
                state = owned = self._open(window)
                self.client.add_new_mask(state, z, obj_id, _recut(current, window))
        finally:
            if owned is not None:
                self.client.close_state(owned)

    def _open(self, window: Block):
        self.sessions += 1
        return self.client.init_state(window_source(self.volume, window, self.to_rgb))

    def _next_window(self, current: WindowMask) -> Block | None:
        """A window centred on the mask when it reaches an inner edge of ``current``'s window
        (None: it stays clear of them, or the window cannot move that way)."""
        if current.empty:
            return None
        rows, cols = np.flatnonzero(current.mask.any(1)), np.flatnonzero(current.mask.any(0))
        w = current.window
        near = (
            (rows[0] < self.margin and w.begin[0] > 0)
            or (cols[0] < self.margin and w.begin[1] > 0)
            or (rows[-1] >= w.shape[0] - self.margin and w.end[0] < self.slice_shape[0])
            or (cols[-1] >= w.shape[1] - self.margin and w.end[1] < self.slice_shape[1])
        )
        if not near:
            return None
        corners = np.array([[rows[0], cols[0]], [rows[-1], cols[-1]]]) + np.array(w.begin)
        moved = window_around(corners, self.slice_shape, self.window)
        return None if moved == w else moved


def write_labels(labels, found: WindowMask, value: int) -> None:
    """Paint ``found`` into ``labels`` ((Z, Y, X), any sliceable array: a zarr array writes
    only the chunks the window touches): its pixels become ``value``, and pixels of the window
    that held ``value`` and are outside the mask are cleared (a correction shrinks it)."""
    where = (found.z, *found.window.slices())
    region = np.asarray(labels[where])
    region[(region == value) & ~found.mask] = 0
    region[found.mask] = value
    labels[where] = region


def _mask_of(ids, logits, obj_id) -> np.ndarray:
    if obj_id not in ids:
        return np.zeros(logits.shape[-2:], bool)
    return logits[ids.index(obj_id), 0] > 0


def _recut(current: WindowMask, window: Block) -> np.ndarray:
    """``current``'s mask placed in ``window`` (what lies outside it is dropped)."""
    out = np.zeros(window.shape, bool)
    shared = current.window.intersect(window)
    if shared is not None:
        out[shared.slices_in(window)] = current.mask[shared.slices_in(current.window)]
    return out


def _prompt_rc(points, box) -> np.ndarray:
    """(row, col) of every prompt point and box corner: what the first window is centred on."""
    rc = []
    if points is not None:
        rc.append(np.asarray(points, np.float64).reshape(-1, 2)[:, ::-1])
    if box is not None:
        rc.append(np.asarray(box, np.float64).reshape(2, 2)[:, ::-1])
    if not rc:
        raise InputValidationError("points", "no prompt: give points with labels, a box, or both")
    return np.concatenate(rc)


def _shift(points, window: Block):
    if points is None:
        return None
    return np.asarray(points, np.float32).reshape(-1, 2) - [window.begin[1], window.begin[0]]


def _shift_box(box, window: Block):
    if box is None:
        return None
    offset = [window.begin[1], window.begin[0]] * 2
    return np.asarray(box, np.float32).reshape(4) - np.asarray(offset, np.float32)
