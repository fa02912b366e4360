"""Segment everything's driver: one job through ``embed`` / ``decode`` callbacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import params as contract
from .instances import Instances, box_area, near_crop_edge, nms, uncropped_runs
from .params import Cancelled, EverythingParams, check_image, defaults
from .plan import CropJob, batches, graph_feeds, plan

# -- driver ---------------------------------------------------------------------------------
Embed = Callable[[tuple[int, int, int, int]], Any]
Decode = Callable[[Any, dict], dict]


class Generator:
    """Runs one segment-everything job through ``embed`` / ``decode`` callbacks.

    Args:
        params: checked parameters (:func:`parse_params`).
        family: ``"sam1"`` or ``"sam2"`` (the records' number types follow the official one).
        embed: ``(x0, y0, x1, y1) -> features`` of that crop of the image.
        decode: ``(features, feeds) -> outputs`` of the everything-decoder graph.
        progress: called ``(done_batches, total_batches)`` after each batch.
        cancelled: polled before each embed and each batch; True raises :class:`Cancelled`.
    """

    def __init__(
        self,
        params: EverythingParams,
        *,
        family: str,
        embed: Embed,
        decode: Decode,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        defaults(family)
        self.params = params
        self.family = family
        self.embed = embed
        self.decode = decode
        self.progress = progress
        self.cancelled = cancelled
        # SAM2's generator keeps points as float32 tensors; SAM1's as float64 numpy.
        self.point_dtype = np.float32 if family == "sam2" else np.float64

    def total_batches(self, image_hw: tuple[int, int]) -> int:
        """Decoder runs a job on an image of ``image_hw`` takes (progress' denominator)."""
        jobs = plan(self.params, image_hw)
        return sum(len(batches(j, self.params.points_per_batch)) for j in jobs)

    def run(self, image_hw: tuple[int, int]) -> list[dict]:
        """The job's instances as COCO records, in the official generator's order."""
        return self.instances(image_hw).records(image_hw)

    def instances(self, image_hw: tuple[int, int]) -> Instances:
        """The job's instances as columns (before the records are written)."""
        image_hw = (int(image_hw[0]), int(image_hw[1]))
        check_image(self.family, self.params, image_hw)
        jobs = plan(self.params, image_hw)
        total = sum(len(batches(j, self.params.points_per_batch)) for j in jobs)
        done = 0
        per_crop = []
        for job in jobs:
            self._check_cancelled()
            features = self.embed(job.box)
            parts = []
            for points in batches(job, self.params.points_per_batch):
                self._check_cancelled()
                outputs = self.decode(features, graph_feeds(self.params, points, job.hw))
                parts.append(self._batch(outputs, points, job, image_hw))
                done += 1
                if self.progress is not None:
                    self.progress(done, total)
            del features
            per_crop.append(self._crop(Instances.concat(parts, self.point_dtype), job))
        data = Instances.concat(per_crop, self.point_dtype)
        if len(jobs) > 1:
            # Prefer masks from smaller crops: score 1 / area, float32 as torch's 1 / int.
            scores = (1.0 / box_area(data.crop_boxes).astype(np.float32)).astype(np.float32)
            data = data.take(nms(data.boxes, scores, self.params.crop_nms_thresh))
        return data

    def _check_cancelled(self) -> None:
        if self.cancelled is not None and self.cancelled():
            raise Cancelled("cancelled between batches")

    def _batch(
        self, outputs: dict, points: np.ndarray, job: CropJob, image_hw: tuple[int, int]
    ) -> Instances:
        masks = np.asarray(outputs[contract.OUT_MASKS], bool)
        boxes = np.asarray(outputs[contract.OUT_BOXES], np.int64).reshape(-1, 4)
        keep = ~near_crop_edge(boxes, job.box, image_hw)
        index = np.asarray(outputs[contract.OUT_PROMPT_INDEX], np.int64).reshape(-1)[keep]
        return Instances(
            [uncropped_runs(m, job.box, image_hw) for m in masks[keep]],
            boxes[keep],
            np.asarray(outputs[contract.OUT_IOU], np.float32).reshape(-1)[keep],
            np.asarray(outputs[contract.OUT_STABILITY], np.float32).reshape(-1)[keep],
            np.asarray(points, self.point_dtype)[index],
            np.zeros((int(keep.sum()), 4), np.int64),
        )

    def _crop(self, data: Instances, job: CropJob) -> Instances:
        data = data.take(nms(data.boxes, data.iou, self.params.box_nms_thresh))
        x0, y0 = job.box[0], job.box[1]
        data.boxes = data.boxes + np.array([x0, y0, x0, y0], np.int64)
        data.points = (data.points + np.array([x0, y0], data.points.dtype)).astype(self.point_dtype)
        data.crop_boxes = np.tile(np.array(job.box, np.int64), (len(data), 1))
        return data
