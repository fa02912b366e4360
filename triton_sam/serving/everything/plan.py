"""Segment everything's plan: the crops of an image, their point grids, the decoder's feeds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import params as contract
from .params import EverythingParams


# -- plan: crops and point grids ------------------------------------------------------------
@dataclass(frozen=True)
class CropJob:
    """One crop of a job.

    Attributes:
        box: (x0, y0, x1, y1) in pixels of the original image (x1, y1 exclusive).
        layer: crop layer (0 = the whole image).
        points: float64 [N, 2] (X, Y) in pixels of the crop: the layer's grid times the
            crop's size, as the official generator computes them.
    """

    box: tuple[int, int, int, int]
    layer: int
    points: np.ndarray

    @property
    def hw(self) -> tuple[int, int]:
        """(H, W) of the crop."""
        x0, y0, x1, y1 = self.box
        return y1 - y0, x1 - x0


def point_grid(n_per_side: int) -> np.ndarray:
    """float64 [n*n, 2] points evenly spaced in [0, 1]^2, X fastest (``build_point_grid``)."""
    offset = 1 / (2 * n_per_side)
    side = np.linspace(offset, 1 - offset, n_per_side)
    xs = np.tile(side[None, :], (n_per_side, 1))
    ys = np.tile(side[:, None], (1, n_per_side))
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)


def layer_grids(n_per_side: int, n_layers: int, scale_per_layer: int) -> list[np.ndarray]:
    """One grid per crop layer (``build_all_layer_point_grids``)."""
    return [point_grid(int(n_per_side / (scale_per_layer**i))) for i in range(n_layers + 1)]


def crop_boxes(
    image_hw: tuple[int, int], n_layers: int, overlap_ratio: float
) -> tuple[list[list[int]], list[int]]:
    """Crop boxes (x0, y0, x1, y1) and their layers (``generate_crop_boxes``)."""
    im_h, im_w = image_hw
    short_side = min(im_h, im_w)
    boxes, layers = [[0, 0, im_w, im_h]], [0]

    def crop_len(orig_len: int, n_crops: int, overlap: int) -> int:
        return int(math.ceil((overlap * (n_crops - 1) + orig_len) / n_crops))

    for i_layer in range(n_layers):
        n_crops = 2 ** (i_layer + 1)
        overlap = int(overlap_ratio * short_side * (2 / n_crops))
        crop_w = crop_len(im_w, n_crops, overlap)
        crop_h = crop_len(im_h, n_crops, overlap)
        x0s = [int((crop_w - overlap) * i) for i in range(n_crops)]
        y0s = [int((crop_h - overlap) * i) for i in range(n_crops)]
        for x0 in x0s:  # itertools.product order: x outer, y inner
            for y0 in y0s:
                boxes.append([x0, y0, min(x0 + crop_w, im_w), min(y0 + crop_h, im_h)])
                layers.append(i_layer + 1)
    return boxes, layers


def plan(params: EverythingParams, image_hw: tuple[int, int]) -> list[CropJob]:
    """The crops of a job in the official order, each with its points in crop pixels."""
    grids = layer_grids(
        params.points_per_side, params.crop_n_layers, params.crop_n_points_downscale_factor
    )
    boxes, layers = crop_boxes(image_hw, params.crop_n_layers, params.crop_overlap_ratio)
    jobs = []
    for box, layer in zip(boxes, layers, strict=True):
        h, w = box[3] - box[1], box[2] - box[0]
        points = grids[layer] * np.array([[w, h]])
        jobs.append(CropJob(box=tuple(box), layer=layer, points=points))
    return jobs


def batches(job: CropJob, points_per_batch: int) -> list[np.ndarray]:
    """The crop's points cut into batches (``batch_iterator``)."""
    n = len(job.points)
    return [job.points[i : i + points_per_batch] for i in range(0, n, points_per_batch)]


def graph_feeds(params: EverythingParams, points: np.ndarray, crop_hw: tuple[int, int]) -> dict:
    """Every everything-decoder input but the features, for one batch of points.

    The stability cut-offs are added in float64 and rounded once to float32, as torch
    compares the float32 logits with ``mask_threshold +- offset`` computed in Python.
    """
    f32 = np.float32
    return {
        contract.IN_POINTS: np.asarray(points, np.float64).reshape(-1, 2),
        contract.IN_CROP_HW: np.array(crop_hw, np.int64),
        contract.IN_PRED_IOU_THRESH: np.array([params.pred_iou_thresh], f32),
        contract.IN_STABILITY_THRESH: np.array([params.stability_score_thresh], f32),
        contract.IN_STABILITY_HIGH: np.array(
            [params.mask_threshold + params.stability_score_offset], f32
        ),
        contract.IN_STABILITY_LOW: np.array(
            [params.mask_threshold - params.stability_score_offset], f32
        ),
        contract.IN_MASK_THRESHOLD: np.array([params.mask_threshold], f32),
        contract.IN_MULTIMASK: np.array([params.multimask_output], bool),
        contract.IN_USE_M2M: np.array([params.use_m2m], bool),
    }
