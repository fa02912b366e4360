"""Masks -> a napari labels layer, each write one step of the layer's own undo (Qt-free).

Writes go through ``Labels.data_setitem`` inside ``Labels.block_history()``, the calls napari's
own brush uses, so Ctrl-Z in the viewer (and ``layer.undo()``) takes back a whole segmentation
at once. A write never overwrites another object: pixels already labelled with a different id
keep it, as painting with napari's "preserve labels" does, so a committed object is safe from
the next one's prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from triton_sam import EverythingResult


def _index(mask: np.ndarray, z: int | None) -> tuple[np.ndarray, ...]:
    rows, cols = np.nonzero(mask)
    return (rows, cols) if z is None else (np.full(rows.shape, z), rows, cols)


def _set(layer: Any, mask: np.ndarray, value: int, z: int | None) -> None:
    if mask.any():
        layer.data_setitem(_index(mask, z), value, refresh=False)


def replace_object(layer: Any, masks: Mapping[int | None, np.ndarray], object_id: int) -> int:
    """Make ``object_id`` cover ``masks`` on their slices, as one undo step.

    Args:
        layer: a napari ``Labels`` layer, (rows, cols) or (z, rows, cols).
        masks: bool [rows, cols] per slice (key None for a 2-D layer); the object's pixels
            elsewhere on those slices become background.
        object_id: the label value (> 0).

    Returns:
        Pixels now labelled ``object_id`` on those slices.
    """
    painted = 0
    with layer.block_history():
        for z, mask in masks.items():
            current = np.asarray(layer.data if z is None else layer.data[z])
            _set(layer, (current == object_id) & ~mask, 0, z)
            free = mask & ((current == 0) | (current == object_id))
            _set(layer, free & (current != object_id), object_id, z)
            painted += int(free.sum())
    layer.refresh()
    return painted


def everything_labels(result: EverythingResult) -> np.ndarray:
    """Instances as one label image: instance k is label k + 1, painted largest first so
    smaller instances stay on top (the rule of the overlay ``triton-sam everything`` draws
    and of the tiled path's label blocks).

    Returns:
        uint32 [H, W], 0 where no instance is.
    """
    labels = np.zeros(result.image_size, np.uint32)
    masks = result.masks()
    for k in sorted(range(len(result)), key=lambda k: -result.instances[k]["area"]):
        labels[masks[k]] = k + 1
    return labels


def add_instances(layer: Any, instances: np.ndarray, first_id: int, z: int | None) -> int:
    """Instances (bool [K, rows, cols], each a new object) as ids ``first_id`` ..., one undo
    step; returns the next free id."""
    with layer.block_history():
        for k, mask in enumerate(instances):
            current = np.asarray(layer.data if z is None else layer.data[z])
            _set(layer, mask & (current == 0), first_id + k, z)
    layer.refresh()
    return first_id + len(instances)
