"""The layers the plugin works with, made beside the image (Qt-free napari calls).

As in micro-sam's annotator: one points layer whose ``label`` feature is ``positive`` or
``negative`` (green / red, ``T`` toggles the label new points get), a shapes layer for boxes,
and labels layers for the objects, the hover preview and segment-everything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.napari.prompts import NEGATIVE, POINT_LABELS, POSITIVE

POINTS = "SAM points"
BOXES = "SAM boxes"
OBJECTS = "SAM objects"
PREVIEW = "SAM preview"
EVERYTHING = "SAM everything"
POINT_COLOURS = ("limegreen", "red")  # positive, negative


@dataclass
class PromptLayers:
    """The layers of one image: prompts in, masks out."""

    points: Any
    boxes: Any
    objects: Any
    preview: Any


def spatial_shape(image: Any) -> tuple[int, ...]:
    """(rows, cols) or (z, rows, cols) of an image layer (an RGB layer's channels left out)."""
    shape = tuple(int(s) for s in image.data.shape)
    return shape[:-1] if image.rgb else shape


def _kept(viewer: Any, name: str, fits: Callable[[Any], bool]) -> Any | None:
    """The layer called ``name`` when it ``fits`` the image; one that does not (another
    image's shape) is removed, so the caller makes it anew."""
    if name not in viewer.layers:
        return None
    if fits(viewer.layers[name]):
        return viewer.layers[name]
    viewer.layers.remove(name)
    return None


def _labels(viewer: Any, name: str, shape: tuple[int, ...], **kwargs: Any) -> Any:
    layer = _kept(viewer, name, lambda layer: layer.data.shape == shape)
    if layer is None:
        layer = viewer.add_labels(np.zeros(shape, np.uint32), name=name, **kwargs)
    return layer


def ensure_layers(viewer: Any, image: Any) -> PromptLayers:
    """The prompt and mask layers for ``image``, made if missing (or of another shape)."""
    shape = spatial_shape(image)
    ndim = len(shape)
    same_ndim = lambda layer: layer.ndim == ndim  # noqa: E731
    points = _kept(viewer, POINTS, same_ndim)
    if points is None:
        points = viewer.add_points(
            np.empty((0, ndim)),
            ndim=ndim,
            name=POINTS,
            features={"label": np.array([], dtype=object)},
            feature_defaults={"label": POSITIVE},
            face_color="label",
            face_color_cycle=list(POINT_COLOURS),
            size=max(4, max(shape[-2:]) // 60),
        )
    boxes = _kept(viewer, BOXES, same_ndim)
    if boxes is None:
        boxes = viewer.add_shapes(
            ndim=ndim, name=BOXES, face_color="transparent", edge_color="yellow", edge_width=2
        )
    objects = _labels(viewer, OBJECTS, shape)
    preview = _labels(viewer, PREVIEW, shape[-2:], opacity=0.4)
    viewer.layers.selection.active = points
    return PromptLayers(points, boxes, objects, preview)


def set_new_point_label(points: Any, label: str) -> None:
    """The label (``positive`` / ``negative``) the next points get."""
    if label not in POINT_LABELS:
        raise ValueError(f"label: got {label!r}, expected one of {POINT_LABELS}")
    points.feature_defaults = {"label": label}


def toggle_new_point_label(points: Any) -> str:
    """Swap the label new points get; returns the new one."""
    current = str(points.feature_defaults["label"].iloc[0])
    label = NEGATIVE if current == POSITIVE else POSITIVE
    set_new_point_label(points, label)
    return label


def point_labels(points: Any) -> list[str]:
    """The ``label`` feature of each point."""
    if len(points.data) == 0:
        return []
    return [str(v) for v in points.features["label"]]
