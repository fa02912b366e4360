"""Label Studio's interactive context -> SAM prompts in pixels (pure, no I/O).

When an annotator clicks with a smart KeyPointLabels or draws a smart RectangleLabels, Label
Studio posts ``params.context.result``: a list of regions, each with ``original_width`` /
``original_height`` (the image's natural size), ``image_rotation``, ``type``
(``keypointlabels`` / ``rectanglelabels``), ``value`` with ``x``, ``y`` (and ``width``,
``height`` for a rectangle) in PERCENT of the original size from its top-left corner, the label
under ``value[type]``, and, for a keypoint, ``is_positive`` (Alt-click sends a negative one).

Pixels here are (X, Y) of the original image, as the clients take them: ``x_px = x% * W / 100``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from triton_sam.errors import InputValidationError

KEYPOINT, RECTANGLE = "keypointlabels", "rectanglelabels"
# More clicks than this on one object is a script, not an annotator.
MAX_POINTS = 64


@dataclass(frozen=True)
class Prompt:
    """One interactive request's prompts.

    Attributes:
        points: float32 [N, 2], (X, Y) pixels of the original image (N may be 0).
        labels: int32 [N], 1 = foreground, 0 = background.
        box: float32 [4] ``x0, y0, x1, y1`` pixels, or None.
        size: ``(width, height)`` of the original image, as Label Studio gave it.
        label: the label the annotator chose (results are given this label).
    """

    points: np.ndarray
    labels: np.ndarray
    box: np.ndarray | None
    size: tuple[int, int]
    label: str | None

    @property
    def multimask(self) -> bool:
        """Ask SAM for three candidates (the best is kept) only for one click alone: the case
        that is ambiguous (part or whole), as SAM's authors advise."""
        return self.box is None and len(self.points) == 1


def parse_context(context: object, *, field: str = "params.context") -> Prompt | None:
    """The prompts of an interactive request.

    Args:
        context: ``params.context`` of a ``/predict`` body (None or without ``result`` for a
            plain prediction).
        field: the name errors use for ``context``.

    Returns:
        The prompts, or None when there is no interaction (no context or an empty result).

    Raises:
        InputValidationError: naming the region's field: a rotated image or box (SAM's boxes
            are axis-aligned), sizes that differ between regions, two boxes, percentages outside
            0-100, no point and no box, too many points.
    """
    if context is None:
        return None
    if not isinstance(context, dict):
        raise InputValidationError(field, f"expected an object, got {type(context).__name__}")
    regions = context.get("result")
    if not regions:
        return None
    if not isinstance(regions, list):
        raise InputValidationError(f"{field}.result", "expected a list of regions")
    points, labels, boxes, size, label = [], [], [], None, None
    for i, region in enumerate(regions):
        where = f"{field}.result[{i}]"
        kind, value, region_size = _region(region, where)
        if size is not None and region_size != size:
            raise InputValidationError(
                f"{where}.original_width", f"{region_size} differs from {size} of result[0]"
            )
        size = region_size
        x, y = _percent(value, "x", where), _percent(value, "y", where)
        px, py = x * size[0] / 100.0, y * size[1] / 100.0
        if kind == KEYPOINT:
            points.append((px, py))
            labels.append(1 if region.get("is_positive", True) else 0)
        else:
            _no_rotation(value.get("rotation", 0), f"{where}.value.rotation")
            w, h = _percent(value, "width", where), _percent(value, "height", where)
            boxes.append((px, py, px + w * size[0] / 100.0, py + h * size[1] / 100.0))
        label = _label(value, kind, where) or label
    if len(boxes) > 1:
        raise InputValidationError(f"{field}.result", f"{len(boxes)} rectangles, expected one")
    if len(points) > MAX_POINTS:
        raise InputValidationError(f"{field}.result", f"{len(points)} keypoints, at most 64")
    assert size is not None
    return Prompt(
        points=np.asarray(points, dtype=np.float32).reshape(-1, 2),
        labels=np.asarray(labels, dtype=np.int32),
        box=np.asarray(boxes[0], dtype=np.float32) if boxes else None,
        size=size,
        label=label,
    )


def _region(region: object, where: str) -> tuple[str, dict, tuple[int, int]]:
    if not isinstance(region, dict):
        raise InputValidationError(where, "expected a region object")
    kind = region.get("type")
    if kind not in (KEYPOINT, RECTANGLE):
        raise InputValidationError(
            f"{where}.type", f"got {kind!r}, expected {KEYPOINT!r} or {RECTANGLE!r}"
        )
    value = region.get("value")
    if not isinstance(value, dict):
        raise InputValidationError(f"{where}.value", "expected an object with x, y")
    _no_rotation(region.get("image_rotation", 0), f"{where}.image_rotation")
    size = tuple(
        _size(region.get(k), f"{where}.{k}") for k in ("original_width", "original_height")
    )
    return kind, value, size  # type: ignore[return-value]


def _size(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 2**16:
        raise InputValidationError(field, f"got {value!r}, expected the image size in pixels")
    if value != int(value):
        raise InputValidationError(field, f"got {value!r}, expected whole pixels")
    return int(value)


def _percent(value: dict, key: str, where: str) -> float:
    number = value.get(key)
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise InputValidationError(f"{where}.value.{key}", f"got {number!r}, expected a number")
    if not 0.0 <= number <= 100.0:
        raise InputValidationError(
            f"{where}.value.{key}", f"got {number}, expected percent of the image (0-100)"
        )
    return float(number)


def _no_rotation(rotation: object, field: str) -> None:
    # Label Studio rotates the image (image_rotation) or a box (value.rotation) in degrees;
    # SAM takes an axis-aligned box on the unrotated image, so anything else is refused, not
    # approximated.
    if isinstance(rotation, bool) or not isinstance(rotation, (int, float)):
        raise InputValidationError(field, f"got {rotation!r}, expected 0 (degrees)")
    if rotation % 360 != 0:
        raise InputValidationError(field, f"got {rotation} degrees, only 0 is supported")


def _label(value: dict, kind: str, where: str) -> str | None:
    labels = value.get(kind)
    if labels is None:
        return None
    if not isinstance(labels, list) or not all(isinstance(v, str) for v in labels):
        raise InputValidationError(f"{where}.value.{kind}", "expected a list of label names")
    return labels[0] if labels else None
