"""The prompt matrix every parity test shares, and how a prediction is compared with upstream.

Importable from any test module (pytest puts ``tests/`` on ``sys.path`` for its conftest).
"""

from __future__ import annotations

import numpy as np


def prompt_matrix(width: int, height: int) -> dict[str, dict]:
    """name -> ``predict`` kwargs on a ``width`` x ``height`` image: a click, clicks with a
    negative, a box, box + click, and multimask for a click and a box. (mask_input
    refinement is each parity test's own: it chains two predictions.)"""
    click = [[0.3 * width, 0.42 * height]]
    negative = [[0.7 * width, 0.55 * height]]
    box = [0.12 * width, 0.15 * height, 0.5 * width, 0.7 * height]
    return {
        "click": dict(point_coords=click, point_labels=[1]),
        "clicks_with_negative": dict(point_coords=click + negative, point_labels=[1, 0]),
        "box": dict(box=box),
        "box_and_click": dict(box=box, point_coords=click, point_labels=[1]),
        "multimask": dict(point_coords=click, point_labels=[1], multimask_output=True),
        "box_multimask": dict(box=box, multimask_output=True),
    }


def predictor_predict(predictor, **kwargs):
    """(masks, scores, low-res logits) of an official predictor (SamPredictor,
    SAM2ImagePredictor) for the kwargs of :func:`prompt_matrix`."""
    kwargs = {k: (np.asarray(v) if k != "multimask_output" else v) for k, v in kwargs.items()}
    kwargs.setdefault("multimask_output", False)
    return predictor.predict(return_logits=True, **kwargs)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def assert_same(
    ours,
    ref_masks: np.ndarray,
    ref_scores: np.ndarray,
    ref_low_res: np.ndarray,
    *,
    hw: tuple[int, int],
    score_atol: float,
    logit_atol: float,
    min_iou: float,
) -> None:
    """``ours`` (a Prediction, batch 1) equals upstream's [M,H,W] logits, [M] scores and
    [M,s,s] low-res logits within the stated tolerances; binary masks overlap >= min_iou."""
    assert ours.masks.shape == (1, *ref_masks.shape)
    assert ours.masks.shape[-2:] == hw
    np.testing.assert_allclose(ours.iou_predictions[0], ref_scores, atol=score_atol, rtol=0)
    np.testing.assert_allclose(ours.masks[0], ref_masks, atol=logit_atol, rtol=0)
    np.testing.assert_allclose(ours.low_res_logits[0], ref_low_res, atol=logit_atol, rtol=0)
    for i in range(ref_masks.shape[0]):
        assert iou(ours.masks[0, i] > 0, ref_masks[i] > 0) >= min_iou
