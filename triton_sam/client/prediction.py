"""The result of one decoder call, and the pure step that builds it (shared by all clients)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from triton_sam.client import postprocess
from triton_sam.models.spec import Preprocessing


@dataclass(frozen=True)
class Prediction:
    """Masks for one prompt.

    Attributes:
        masks: float32 [1, M, H, W] mask logits at the original image size (H, W);
            ``masks[0, i] > 0`` is the i-th binary mask. M = 1, or 3 with multimask output.
        iou_predictions: float32 [1, M] predicted IoU of each mask.
        low_res_logits: float32 [1, M, 256, 256] logits as the family's official predictor
            returns them (clipped to [-32, 32] by ``SAM2ImagePredictor``, unclipped by
            ``SamPredictor``); pass ``low_res_logits[0, i]`` as the next call's
            ``mask_input`` to refine mask i.
    """

    masks: np.ndarray
    iou_predictions: np.ndarray
    low_res_logits: np.ndarray


def make_prediction(
    low_res: np.ndarray, scores: np.ndarray, orig_hw: tuple[int, int], pre: Preprocessing
) -> Prediction:
    """Upsample decoder logits [1,M,s,s] to the original size, the way upstream does."""
    low_res = np.asarray(low_res, dtype=np.float32)
    return Prediction(
        masks=postprocess.postprocess_masks(low_res, orig_hw, pre),
        iou_predictions=np.asarray(scores, dtype=np.float32),
        low_res_logits=postprocess.clamp_low_res(low_res, pre.low_res_logit_limit),
    )
