"""``SAM2VideoPredictor``'s API on the exported graphs, in-process with onnxruntime.

The same orchestration the tracker model runs in Triton (:mod:`triton_sam.serving.tracking`), driven
locally: the "ORT in-process" baseline of the video benchmark, the fast way to test the
orchestration, and a torch-free way to track on one machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from triton_sam.client.video_api import Masks, PointsPrompt, Propagation, VideoPredictorAPI
from triton_sam.client.video_source import VideoSource, open_video
from triton_sam.serving.protocol.tracker import TrackingError
from triton_sam.serving.resample import bilinear
from triton_sam.serving.tracking.config import TrackerConfig
from triton_sam.serving.tracking.runners import OnnxRuntimeRunner
from triton_sam.serving.tracking.state import Session
from triton_sam.serving.tracking.tracker import Tracker

CONFIG_FILENAME = "tracker_config.json"


@dataclass
class LocalVideoState:
    """What :meth:`OnnxVideoPredictor.init_state` returns (upstream's ``inference_state``).

    Attributes:
        session: the orchestration's per-video state.
        source: the frames.
    """

    session: Session
    source: VideoSource

    @property
    def num_frames(self) -> int:
        return self.session.num_frames

    @property
    def obj_ids(self) -> list[int]:
        return self.session.obj_ids

    @property
    def video_hw(self) -> tuple[int, int]:
        return self.session.video_hw


class OnnxVideoPredictor(VideoPredictorAPI[LocalVideoState]):
    """Track objects through a video or volume with the exported graphs (SAM2.1's
    ``export_video`` or SAM3's ``export_sam3_video``), in-process.

    Args:
        graphs_dir: a directory with the five ``<graph>.onnx`` files of ``export_video`` or
            ``export_sam3_video`` and its ``tracker_config.json``.
        intra_op_threads: onnxruntime threads per graph (0 = its default).
        feature_cache_frames: encoded frames kept per video.

    Raises:
        FileNotFoundError: a graph or the config is missing.
    """

    def __init__(
        self,
        graphs_dir: str | os.PathLike[str],
        *,
        intra_op_threads: int = 0,
        feature_cache_frames: int = 4,
    ) -> None:
        folder = Path(graphs_dir)
        config_path = folder / CONFIG_FILENAME
        if not config_path.is_file():
            raise FileNotFoundError(f"{config_path}: missing; export with export_video()")
        config = TrackerConfig.from_json(config_path.read_text())
        runner = OnnxRuntimeRunner(folder, intra_op_threads=intra_op_threads)
        self.tracker = Tracker(runner, config)
        self.feature_cache_frames = feature_cache_frames

    # add_new_points_or_box and propagate_in_video: VideoPredictorAPI, run by _add_points and
    # _propagate below
    def init_state(self, video: object) -> LocalVideoState:
        """Load every frame of ``video`` (see :func:`open_video`) and encode frame 0."""
        source = open_video(video)
        session = Session(
            source.num_frames, (source.height, source.width), self.feature_cache_frames
        )
        for i in range(source.num_frames):
            session.frames[i] = source.pixels(i)
        self.tracker.features(session, 0)  # upstream warms the backbone on frame 0
        return LocalVideoState(session, source)

    def add_new_mask(
        self, state: LocalVideoState, frame_idx: int, obj_id: int, mask: np.ndarray
    ) -> Masks:
        """A binary mask [H, W] on a frame; returns as :meth:`add_new_points_or_box`."""
        frame_idx, ids, low_res = _call(
            self.tracker.add_new_mask, state.session, frame_idx, obj_id, mask
        )
        return frame_idx, ids, self._video_res(state, low_res)

    def remove_object(
        self, state: LocalVideoState, obj_id: int, strict: bool = False
    ) -> tuple[list[int], list[tuple[int, np.ndarray]]]:
        """Remove an object; returns (remaining ids, [(frame, masks at video res)])."""
        ids, updated = _call(self.tracker.remove_object, state.session, obj_id, strict=strict)
        return ids, [(t, self._video_res(state, m)) for t, m in updated]

    def reset_state(self, state: LocalVideoState) -> None:
        """Remove every object and result (the frames stay loaded)."""
        self.tracker.reset_state(state.session)

    def close_state(self, state: LocalVideoState) -> None:
        """Free the video's frames and features (the client's method of the same name)."""
        state.session.frames.clear()
        state.session.features.clear()

    # -- the two calls of VideoPredictorAPI ---------------------------------------------------
    def _add_points(self, state: LocalVideoState, prompt: PointsPrompt) -> Masks:
        frame_idx, ids, low_res = _call(
            self.tracker.add_new_points_or_box,
            state.session,
            prompt.frame_idx,
            prompt.obj_id,
            None if prompt.points is None else np.asarray(prompt.points, np.float32),
            None if prompt.labels is None else np.asarray(prompt.labels),
            clear_old_points=prompt.clear_old_points,
            normalize_coords=prompt.normalize_coords,
            box=None if prompt.box is None else np.asarray(prompt.box, np.float32),
        )
        return frame_idx, ids, self._video_res(state, low_res)

    def _propagate(self, state: LocalVideoState, run: Propagation) -> Iterator[Masks]:
        order = _call(
            self.tracker.processing_order,
            state.session,
            run.start_frame_idx,
            run.max_frame_num_to_track,
            run.reverse,
        )
        for frame_idx in order:
            ids, low_res, _ = _call(self.tracker.track, state.session, frame_idx, run.reverse)
            yield frame_idx, ids, self._video_res(state, low_res)

    @staticmethod
    def _video_res(state: LocalVideoState, low_res: np.ndarray) -> np.ndarray:
        return bilinear(low_res, state.session.video_hw)


def _call(fn, *args, **kwargs):
    """Run an orchestration call, turning its errors into the package's typed errors."""
    try:
        return fn(*args, **kwargs)
    except TrackingError as e:
        from triton_sam.client.video_errors import tracking_error

        raise tracking_error(e.code, str(e), e.field) from e


__all__ = ["CONFIG_FILENAME", "LocalVideoState", "OnnxVideoPredictor"]
