"""Segment everything's instances: columns of kept masks, NMS, crop edges, COCO records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..masks import compress_counts, rle_counts


# -- NMS ------------------------------------------------------------------------------------
def box_area(boxes: np.ndarray) -> np.ndarray:
    """(x1 - x0) * (y1 - y0) of [N, 4] boxes (torchvision's ``box_area``, no +1)."""
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices kept by greedy NMS, by decreasing score (``torchvision.ops.batched_nms`` with
    one category).

    As torchvision's CPU kernel: boxes and IoU in float32, a stable descending sort (ties
    keep index order), a box suppressed when IoU > threshold (compared in float64: the
    kernel compares the float IoU with a double), NaN IoU (0/0) suppresses nothing.
    """
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    scores = np.asarray(scores, np.float32).reshape(-1)
    order = np.argsort(-scores, kind="stable")
    b = boxes[order]
    x0, y0, x1, y1 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    areas = (x1 - x0) * (y1 - y0)
    alive = np.ones(len(b), bool)
    keep = []
    zero = np.float32(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        for i in range(len(b)):
            if not alive[i]:
                continue
            keep.append(i)
            rest = i + 1 + np.flatnonzero(alive[i + 1 :])
            w = np.maximum(zero, np.minimum(x1[i], x1[rest]) - np.maximum(x0[i], x0[rest]))
            h = np.maximum(zero, np.minimum(y1[i], y1[rest]) - np.maximum(y0[i], y0[rest]))
            inter = w * h
            iou = inter / (areas[i] + areas[rest] - inter)
            alive[rest[iou.astype(np.float64) > iou_threshold]] = False
    return order[np.array(keep, np.int64)]


# -- instances ------------------------------------------------------------------------------
@dataclass
class Instances:
    """Masks kept so far, as columns (masks as uncompressed RLE run lengths).

    Attributes:
        runs: per mask, int64 run lengths (column-major, starting with background) of the
            mask in the ORIGINAL image frame.
        boxes: int64 [K, 4] xyxy, original frame (crop frame while still inside a crop).
        iou: float32 [K]; stability: float32 [K].
        points: [K, 2] the prompt point (float64 for SAM1, float32 for SAM2, as upstream).
        crop_boxes: int64 [K, 4] xyxy.
    """

    runs: list[np.ndarray]
    boxes: np.ndarray
    iou: np.ndarray
    stability: np.ndarray
    points: np.ndarray
    crop_boxes: np.ndarray

    @classmethod
    def empty(cls, point_dtype: Any) -> Instances:
        return cls(
            [],
            np.zeros((0, 4), np.int64),
            np.zeros(0, np.float32),
            np.zeros(0, np.float32),
            np.zeros((0, 2), point_dtype),
            np.zeros((0, 4), np.int64),
        )

    def __len__(self) -> int:
        return len(self.runs)

    def take(self, index: np.ndarray) -> Instances:
        index = np.asarray(index, np.int64)
        return Instances(
            [self.runs[i] for i in index],
            self.boxes[index],
            self.iou[index],
            self.stability[index],
            self.points[index],
            self.crop_boxes[index],
        )

    @classmethod
    def concat(cls, parts: list[Instances], point_dtype: Any) -> Instances:
        if not parts:
            return cls.empty(point_dtype)
        return cls(
            [r for p in parts for r in p.runs],
            np.concatenate([p.boxes for p in parts]),
            np.concatenate([p.iou for p in parts]),
            np.concatenate([p.stability for p in parts]),
            np.concatenate([p.points for p in parts]),
            np.concatenate([p.crop_boxes for p in parts]),
        )

    def records(self, image_hw: tuple[int, int]) -> list[dict]:
        """COCO records as the official generators' ``output_mode="coco_rle"`` writes them."""
        h, w = image_hw
        out = []
        for k, runs in enumerate(self.runs):
            x0, y0, x1, y1 = (int(v) for v in self.boxes[k])
            cx0, cy0, cx1, cy1 = (int(v) for v in self.crop_boxes[k])
            out.append(
                {
                    "segmentation": {"size": [h, w], "counts": compress_counts(runs).decode()},
                    "area": int(runs[1::2].sum()),
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "predicted_iou": float(self.iou[k]),
                    "point_coords": [[float(v) for v in self.points[k]]],
                    "stability_score": float(self.stability[k]),
                    "crop_box": [cx0, cy0, cx1 - cx0, cy1 - cy0],
                }
            )
        return out


def uncropped_runs(mask: np.ndarray, crop_box: tuple[int, ...], image_hw: tuple[int, int]):
    """Run lengths of a crop-frame bool mask placed in the original image (zero elsewhere)."""
    x0, y0, x1, y1 = crop_box
    h, w = image_hw
    if (x0, y0, x1, y1) == (0, 0, w, h):
        return rle_counts(mask)
    full = np.zeros((h, w), bool)
    full[y0:y1, x0:x1] = mask
    return rle_counts(full)


def near_crop_edge(
    boxes: np.ndarray, crop_box: tuple[int, ...], image_hw: tuple[int, int], atol: float = 20.0
) -> np.ndarray:
    """bool [K]: a box (crop frame) within ``atol`` of an edge of the crop that is not an edge
    of the image (``is_box_near_crop_edge``, compared in float32 as torch's ``isclose``)."""
    x0, y0 = crop_box[0], crop_box[1]
    h, w = image_hw
    b = (np.asarray(boxes, np.int64) + np.array([x0, y0, x0, y0])).astype(np.float32)
    crop = np.asarray(crop_box, np.float32)[None]
    image = np.array([[0, 0, w, h]], np.float32)
    near_crop = np.abs(b - crop) <= np.float32(atol)
    near_image = np.abs(b - image) <= np.float32(atol)
    return np.any(near_crop & ~near_image, axis=1)
