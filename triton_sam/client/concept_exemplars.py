"""Exemplar prompts of a concept call, client side: boxes around examples of the concept
(or counter-examples) on the current image, and ids of exemplars the server keeps from
earlier calls, checked as the server will check them before anything is sent (no I/O).

The server (``triton_sam/serving/concept_exemplars.py``) encodes a call's boxes on its image
and answers the id it keeps them under; ``exemplar_ids`` applies them to any later image of
the same tenant without resending the first image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.serving.protocol import concept as protocol


@dataclass(frozen=True)
class Exemplars:
    """Checked exemplar prompts of one call.

    Attributes:
        boxes: float32 [G, 4] (x0, y0, x1, y1) in pixels of the current image, or None.
        labels: int32 [G] 1 positive / 0 negative, or None (with ``boxes``: all positive).
        ids: ids of exemplars the server keeps (answered as ``exemplar_id``), maybe empty.
    """

    boxes: np.ndarray | None
    labels: np.ndarray | None
    ids: tuple[str, ...]

    def __bool__(self) -> bool:
        return self.boxes is not None or bool(self.ids)


def check_exemplars(
    boxes: Any,
    box_labels: Any,
    exemplar_ids: Sequence[str] | None,
    hw: tuple[int, int],
    *,
    max_boxes: int = protocol.MAX_BOXES,
) -> Exemplars:
    """Validate exemplar prompts as the server will, before anything is sent.

    Args:
        boxes: [G, 4] (x0, y0, x1, y1) in pixels of the image (``hw``), or None.
        box_labels: [G] of 1 (an example of the concept) or 0 (a counter-example), or None
            (all positive).
        exemplar_ids: ids the server answered as ``exemplar_id``, or None.
        hw: (H, W) of the current image.
        max_boxes: the server's bound (the protocol's default).

    Raises:
        InputValidationError: naming ``boxes[i]`` (not finite, outside the image, x1 <= x0 or
            y1 <= y0), ``boxes`` (shape, count), ``box_labels`` (without boxes, count, values)
            or ``exemplar_ids`` (count, type, length).
    """
    ids = _check_ids(exemplar_ids)
    if boxes is None:
        if box_labels is not None:
            raise InputValidationError("box_labels", "given without boxes; pass boxes too")
        return Exemplars(None, None, ids)
    found = np.asarray(boxes, dtype=np.float64)
    if found.ndim == 1 and found.shape[0] == 4:
        found = found[None]  # one box
    if found.ndim != 2 or found.shape[-1] != 4 or not 1 <= len(found) <= max_boxes:
        raise InputValidationError(
            "boxes",
            f"shape {list(found.shape)}, expected [G, 4] (x0, y0, x1, y1) with G from 1 to "
            f"{max_boxes}",
        )
    h, w = hw
    for i, (x0, y0, x1, y1) in enumerate(found):
        box = f"({x0:g}, {y0:g}, {x1:g}, {y1:g})"
        if not np.isfinite(found[i]).all():
            raise InputValidationError(f"boxes[{i}]", f"{box} is not finite")
        if min(x0, y0) < 0 or x1 > w or y1 > h:
            raise InputValidationError(
                f"boxes[{i}]", f"{box} is outside the image, expected 0 <= x <= {w}, 0 <= y <= {h}"
            )
        if not (x0 < x1 and y0 < y1):
            raise InputValidationError(f"boxes[{i}]", f"{box} is empty, expected x0 < x1, y0 < y1")
    labels = None
    if box_labels is not None:
        labels = np.asarray(box_labels).reshape(-1)
        if labels.size != len(found) or not np.isin(labels, (0, 1)).all():
            raise InputValidationError(
                "box_labels",
                f"got {labels.tolist()}, expected one 1 (positive) or 0 (negative) per box "
                f"({len(found)})",
            )
        labels = labels.astype(np.int32)
    return Exemplars(found.astype(np.float32), labels, ids)


def _check_ids(exemplar_ids: Sequence[str] | None) -> tuple[str, ...]:
    if exemplar_ids is None:
        return ()
    ids = (exemplar_ids,) if isinstance(exemplar_ids, str) else tuple(exemplar_ids)
    if not 1 <= len(ids) <= protocol.MAX_EXEMPLAR_IDS:
        raise InputValidationError(
            "exemplar_ids", f"got {len(ids)} ids, expected 1 to {protocol.MAX_EXEMPLAR_IDS}"
        )
    for i, value in enumerate(ids):
        if not isinstance(value, str) or not 1 <= len(value) <= protocol.EXEMPLAR_ID_MAX_BYTES:
            raise InputValidationError(
                f"exemplar_ids[{i}]", f"got {value!r}, expected an exemplar_id the server answered"
            )
    return ids
