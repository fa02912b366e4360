"""Out of the model frame: decoder logits -> masks at the original image size, as upstream.

Numpy only. The upsampling is the family's upstream rule (``serving/rules.py``, through
:func:`triton_sam.client.model_frame.rule_call`); the low-res logits handed back for
refinement are clipped as the official predictor clips them. Sizes are (H, W).
"""

from __future__ import annotations

import numpy as np

from triton_sam.client.model_frame import check_hw, rule_call, single_threaded_blas
from triton_sam.errors import InputValidationError
from triton_sam.models.spec import Preprocessing

# SAM2ImagePredictor clamps the low-res logits it returns for refinement to this range.
LOW_RES_LOGIT_LIMIT = 32.0


@single_threaded_blas
def postprocess_masks(
    low_res_logits: np.ndarray, orig_hw: tuple[int, int], pre: Preprocessing
) -> np.ndarray:
    """Upsample low-resolution mask logits to the original image size, as upstream does.

    ``"square"``: one bilinear resize (align_corners=False, no antialias) straight to
    (H, W), as ``SAM2Transforms.postprocess_masks`` (without its optional hole filling,
    which SAM2ImagePredictor leaves off by default). ``"longest_side"``: bilinear to S x S,
    crop the unpadded region, bilinear to (H, W), as ``Sam.postprocess_masks``.

    Each resize is separable (W, then H, as torch) and every output pixel reads only 2
    input pixels per axis, so it runs as small banded matrix products: a 4000x3000 output
    costs about one pass over the output.

    Args:
        low_res_logits: float [B, M, h, w] logits (h = w = ``pre.mask_size`` from the
            decoder).
        orig_hw: (H, W) of the original image.
        pre: the family's preprocessing.

    Returns:
        float32 [B, M, H, W] logits; threshold at 0 for binary masks.

    Raises:
        InputValidationError: ``low_res_logits`` is not a 4-d non-empty numeric array, or
            ``orig_hw`` is invalid.
    """
    logits = _check_logits(low_res_logits)
    return rule_call(pre, "upsample", logits, check_hw(orig_hw), pre.image_size)


def clamp_low_res(logits: np.ndarray, limit: float | None = LOW_RES_LOGIT_LIMIT) -> np.ndarray:
    """Clip low-res logits to [-limit, limit] as the official predictor returns them.

    ``SAM2ImagePredictor`` clips to [-32, 32]; ``SamPredictor`` does not clip (``limit=None``,
    see ``Preprocessing.low_res_logit_limit``).

    Args:
        logits: float array of any shape (typically [B, M, 256, 256]).
        limit: the clip bound, or None to return the logits unclipped.

    Returns:
        float32 array of the same shape; feed ``[0, i]`` back as ``mask_input`` to refine
        mask i.
    """
    logits = np.asarray(logits, np.float32)
    return logits if limit is None else np.clip(logits, -limit, limit)


def _check_logits(low_res_logits: np.ndarray) -> np.ndarray:
    """Validate decoder logits as a non-empty float32 [B, M, h, w] array."""
    try:
        logits = np.asarray(low_res_logits, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise InputValidationError(
            "low_res_logits", f"cannot be read as float32 ({e}); expected [B, M, h, w]"
        ) from e
    if logits.ndim != 4 or 0 in logits.shape:
        raise InputValidationError(
            "low_res_logits", f"got shape {logits.shape}; expected non-empty [B, M, h, w]"
        )
    return logits
