"""Pure functions that validate user prompts and build decoder inputs (no I/O).

Shared by the sync and async clients so the two cannot drift. Coordinates come in as
(X, Y) pixels of the original image and leave in the encoder's input frame, in the order the
family's official predictor uses (``FamilySpec.box_before_points`` / ``pad_with_box``): for
SAM2, box corners (labels 2, 3) first, then clicks, then one padding point (label -1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.client import model_frame
from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec
from triton_sam.serving import bounds, prompt_frame

PADDING_LABEL = -1.0
BOX_LABELS = (2.0, 3.0)
CLICK_LABELS = frozenset({0, 1})


def _as_float_array(value: Any, field: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputValidationError(field, f"expected numbers, got {type(value).__name__}") from e
    if not np.isfinite(array).all():
        raise InputValidationError(field, "contains NaN or infinity")
    return array


def validate_points(
    point_coords: Any, point_labels: Any, orig_hw: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Check clicks: Nx2 (X, Y) inside the image and N labels in {0, 1}.

    Also accepts the batched forms 1xNx2 / 1xN. Returns None when both are None.

    Raises:
        InputValidationError: naming ``point_coords`` or ``point_labels``.
    """
    if point_coords is None and point_labels is None:
        return None
    if point_coords is None or point_labels is None:
        missing = "point_labels" if point_labels is None else "point_coords"
        raise InputValidationError(missing, "point_coords and point_labels must be given together")
    coords = _as_float_array(point_coords, "point_coords")
    labels = _as_float_array(point_labels, "point_labels")
    if coords.ndim == 3 and coords.shape[0] == 1:
        coords = coords[0]
    if labels.ndim == 2 and labels.shape[0] == 1:
        labels = labels[0]
    if coords.ndim != 2 or coords.shape[1] != 2 or coords.shape[0] == 0:
        raise InputValidationError(
            "point_coords", f"shape {coords.shape}, expected (N, 2) (X, Y) pixels with N >= 1"
        )
    if labels.shape != (coords.shape[0],):
        raise InputValidationError(
            "point_labels", f"shape {labels.shape}, expected ({coords.shape[0]},): one per point"
        )
    if not set(np.unique(labels).tolist()) <= CLICK_LABELS:
        raise InputValidationError(
            "point_labels", f"values {sorted(set(labels.tolist()))}, expected 1 (fg) or 0 (bg)"
        )
    _check_inside(coords, orig_hw, "point_coords")
    return coords, labels


def validate_box(box: Any, orig_hw: tuple[int, int]) -> np.ndarray | None:
    """Check a box: XYXY pixels, shape (4,) or (1, 4), x0 <= x1, y0 <= y1, inside the image."""
    if box is None:
        return None
    array = _as_float_array(box, "box")
    if array.shape == (1, 4):
        array = array[0]
    if array.shape != (4,):
        raise InputValidationError(
            "box", f"shape {array.shape}, expected (4,) as [x0, y0, x1, y1] pixels (one box)"
        )
    x0, y0, x1, y1 = array
    if x1 < x0 or y1 < y0:
        raise InputValidationError("box", f"{array.tolist()} is inverted: expected x0<=x1, y0<=y1")
    _check_inside(array.reshape(2, 2), orig_hw, "box")
    return array


def validate_mask_input(mask_input: Any, mask_size: int) -> np.ndarray | None:
    """Check previous low-res logits: (S, S), (1, S, S) or (1, 1, S, S), S = mask_size."""
    if mask_input is None:
        return None
    array = _as_float_array(mask_input, "mask_input")
    if array.shape not in {(mask_size,) * 2, (1,) + (mask_size,) * 2, (1, 1) + (mask_size,) * 2}:
        raise InputValidationError(
            "mask_input",
            f"shape {array.shape}, expected ({mask_size}, {mask_size}) low-res logits, "
            "e.g. Prediction.low_res_logits[0, i] of a previous predict",
        )
    return array.reshape(1, 1, mask_size, mask_size)


@dataclass(frozen=True)
class _Checked:
    """Prompts that passed validation, each None when not given: clicks (coords [N, 2],
    labels [N]) and a box [4] in original pixels, previous low-res logits [1, 1, S, S]."""

    points: tuple[np.ndarray, np.ndarray] | None
    box_xyxy: np.ndarray | None
    mask: np.ndarray | None


def _check_inside(coords: np.ndarray, orig_hw: tuple[int, int], field: str) -> None:
    h, w = orig_hw
    outside = (coords[:, 0] < 0) | (coords[:, 0] > w) | (coords[:, 1] < 0) | (coords[:, 1] > h)
    if outside.any():
        raise InputValidationError(
            field, f"{coords[outside].tolist()} outside the {w}x{h} (W x H) image"
        )


def build_decoder_prompts(
    *,
    point_coords: Any,
    point_labels: Any,
    box: Any,
    mask_input: Any,
    orig_hw: tuple[int, int],
    family: FamilySpec,
) -> dict[str, np.ndarray]:
    """Validate prompts and build the decoder's prompt tensors (batch dimension 1).

    Returns:
        For the ``point_list`` layout (``family.prompt_layout``): ``point_coords`` [1,N,2]
        float32 in the model input frame, ``point_labels`` [1,N] float32, ``mask_input``
        [1,1,S,S] float32, ``has_mask_input`` [1,1] float32. For ``hf_points_boxes``: see
        ``_hf_points_boxes_prompts``.

    Raises:
        InputValidationError: naming the offending argument.
    """
    checked = _Checked(
        validate_points(point_coords, point_labels, orig_hw),
        validate_box(box, orig_hw),
        validate_mask_input(mask_input, family.preprocessing.mask_size),
    )
    if checked.points is None and checked.box_xyxy is None:
        raise InputValidationError(
            "point_coords", "no prompt: give point_coords with point_labels, a box, or both"
        )
    built = _LAYOUTS[family.prompt_layout].build(checked, orig_hw, family)
    # The server's bounds (one definition: triton_sam.serving.bounds), checked before sending.
    try:
        bounds.check_prompts(built)
    except bounds.RequestError as e:
        raise InputValidationError(e.field, str(e).removeprefix(f"{e.field}: ")) from None
    return built


def _point_list_prompts(
    checked: _Checked, orig_hw: tuple[int, int], family: FamilySpec
) -> dict[str, np.ndarray]:
    """``point_list`` layout: point_coords/point_labels (box as corners 2/3), mask_input."""
    pre = family.preprocessing
    # One builder for both sides: the session model builds original-pixel prompts with it.
    point_coords, point_labels = prompt_frame.point_list(
        checked.points,
        checked.box_xyxy,
        orig_hw,
        pre,
        box_before_points=family.box_before_points,
        pad_with_box=family.pad_with_box,
    )
    mask = checked.mask
    has_mask = mask is not None
    size = pre.mask_size
    return {
        "point_coords": point_coords,
        "point_labels": point_labels,
        "mask_input": (mask if has_mask else np.zeros((1, 1, size, size))).astype(np.float32),
        "has_mask_input": np.array([[1.0 if has_mask else 0.0]], dtype=np.float32),
    }


def _hf_points_boxes_prompts(
    checked: _Checked, orig_hw: tuple[int, int], family: FamilySpec
) -> dict[str, np.ndarray]:
    """``hf_points_boxes`` layout (transformers' prompt tensors; the graph pads).

    Returns ``input_points`` [1,1,N,2] float32 (clicks only, N may be 0), ``input_labels``
    [1,1,N] int64, ``input_boxes`` [1,nb,4] float32 (nb = 0 or 1), all in the input frame.

    Raises:
        InputValidationError: ``mask_input`` was given (this decoder has no mask input).
    """
    if checked.mask is not None:
        raise InputValidationError(
            "mask_input",
            f"the {family.family!r} decoder (pre-exported onnx-community layout) takes no mask "
            "input; export the model with `triton-sam setup` for mask refinement",
        )
    pre = family.preprocessing
    coords, labels = np.zeros((0, 2)), np.zeros((0,))
    if checked.points is not None:
        clicks, labels = checked.points
        coords = model_frame.transform_coords(clicks, orig_hw, pre)
    boxes = np.zeros((0, 4))
    if checked.box_xyxy is not None:
        boxes = model_frame.transform_boxes(checked.box_xyxy[None], orig_hw, pre).reshape(1, 4)
    return {
        "input_points": coords.astype(np.float32).reshape(1, 1, -1, 2),
        "input_labels": labels.astype(np.int64).reshape(1, 1, -1),
        "input_boxes": boxes.astype(np.float32)[None],
    }


def _check_multimask(multimask_output: Any) -> None:
    if not isinstance(multimask_output, bool | np.bool_):
        raise InputValidationError(
            "multimask_output", f"got {type(multimask_output).__name__}, expected bool"
        )


def output_names(multimask_output: bool, family: FamilySpec | None = None) -> tuple[str, str]:
    """The (masks, scores) decoder outputs to request; only those cross the wire.

    Args:
        multimask_output: three candidate masks instead of one.
        family: the family whose decoder is asked (default: the ``point_list`` layout).
    """
    _check_multimask(multimask_output)
    layout = family.prompt_layout if family is not None else "point_list"
    return _LAYOUTS[layout].outputs(bool(multimask_output))


def select_outputs(
    outputs: dict[str, np.ndarray], multimask_output: bool, family: FamilySpec
) -> tuple[np.ndarray, np.ndarray]:
    """(low-res logits [B,M,s,s], scores [B,M]) from the outputs :func:`output_names` named.

    ``point_list`` decoders return exactly that. ``hf_points_boxes`` decoders return the three
    multimask outputs per point batch ([B,1,3,s,s], [B,1,3]); single-mask output is the
    highest-scoring of them (that graph has no token 0).
    """
    _check_multimask(multimask_output)
    return _LAYOUTS[family.prompt_layout].select(outputs, bool(multimask_output))


def resolve_family(family: FamilySpec, decoder_inputs: set[str]) -> FamilySpec:
    """The family among ``family`` and its ``alternates`` whose decoder takes ``decoder_inputs``.

    Raises:
        UnsupportedModelError: none matches (the message lists what each one expects).
    """
    from triton_sam.errors import UnsupportedModelError
    from triton_sam.models.registry import get_family

    candidates = [family, *(get_family(name) for name in family.alternates)]
    for candidate in candidates:
        if {t.name for t in candidate.decoder_inputs} == decoder_inputs:
            return candidate
    expected = {c.family: sorted(t.name for t in c.decoder_inputs) for c in candidates}
    raise UnsupportedModelError(
        f"model_type: the server's decoder takes {sorted(decoder_inputs)}; "
        f"{family.family!r} expects one of {expected}"
    )


def layout_on_server(
    family: FamilySpec, session_model: str, decoder_inputs: Callable[[], set[str]]
) -> tuple[FamilySpec, str]:
    """(family, session model) for the tensor contract the server's decoder has.

    Families served under several contracts (SAM3: our export or the imported onnx-community
    pair) are resolved with ``decoder_inputs()`` (the names the server reports; only asked
    for such families); the default session model follows the resolved layout.

    Raises:
        UnsupportedModelError: the server's decoder matches none of them.
    """
    if not family.alternates:
        return family, session_model
    resolved = resolve_family(family, decoder_inputs())
    if resolved is not family and session_model == family.session_model:
        session_model = resolved.session_model
    return resolved, session_model


def _point_list_outputs(multimask: bool) -> tuple[str, str]:
    if multimask:
        return "multimask_masks", "multimask_iou_predictions"
    return "masks", "iou_predictions"


def _point_list_select(out: dict[str, np.ndarray], multimask: bool) -> tuple[np.ndarray, ...]:
    masks, scores = _point_list_outputs(multimask)
    return out[masks], out[scores]


def _hf_select(out: dict[str, np.ndarray], multimask: bool) -> tuple[np.ndarray, ...]:
    masks, scores = out["pred_masks"][:, 0], out["iou_scores"][:, 0]  # point batch 0
    if multimask:
        return masks, scores
    best = np.argmax(scores, axis=1)
    rows = np.arange(len(best))
    return masks[rows, best][:, None], scores[rows, best][:, None]


class _Layout:
    """How one prompt layout builds decoder inputs and reads the decoder's outputs."""

    def __init__(self, build: Any, outputs: Any, select: Any) -> None:
        self.build, self.outputs, self.select = build, outputs, select


_LAYOUTS: dict[str, _Layout] = {
    "point_list": _Layout(_point_list_prompts, _point_list_outputs, _point_list_select),
    "hf_points_boxes": _Layout(
        _hf_points_boxes_prompts, lambda _multimask: ("pred_masks", "iou_scores"), _hf_select
    ),
}
