"""Into the model input frame: the image (encoder input) and the prompts (decoder points).

Numpy only (no torch: clients stay light); mask post-processing is ``client/postprocess.py``.

Each function reproduces the official predictors through the family's upstream rule
(:func:`resize_rule`: :class:`SamPredictorRule`, :class:`Sam2TransformsRule`,
:class:`Sam3ProcessorRule`, chosen once from ``Preprocessing``):

- ``"square"`` (SAM2, SAM3) follows ``sam2.utils.transforms.SAM2Transforms``: ToTensor
  (uint8 / 255), torchvision ``Resize((S, S))`` on the float tensor (bilinear, antialiased),
  Normalize; prompts scaled by ``S / w`` and ``S / h``; masks upsampled with
  ``F.interpolate(..., orig_hw, mode="bilinear", align_corners=False)``.
- ``"longest_side"`` (SAM1) follows ``segment_anything``: ``ResizeLongestSide.apply_image``
  (PIL bilinear on uint8), ``Sam.preprocess`` (normalise on the 0-255 scale, zero-pad
  bottom/right), ``ResizeLongestSide.apply_coords`` and ``Sam.postprocess_masks``.

Coordinates are (X, Y) pixels; sizes are (H, W). Parity with upstream is measured in
``tests/parity/test_transforms_parity.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from threadpoolctl import ThreadpoolController

from triton_sam.client.image_io import EXPECTED_ARRAY, check_rgb_array
from triton_sam.errors import ConfigError, InputValidationError
from triton_sam.models.spec import Preprocessing
from triton_sam.serving import rules

# -- threading of the resizes ---------------------------------------------------------------
_F = TypeVar("_F", bound=Callable[..., Any])


@functools.cache
def _blas_controller() -> ThreadpoolController:
    return ThreadpoolController()  # inspects the loaded libraries once (~ms)


def single_threaded_blas(fn: _F) -> _F:
    """Run ``fn`` with the BLAS library (numpy's OpenBLAS) on the calling thread only.

    The resizes are dozens of small matrix products. A multi-threaded BLAS wakes its workers
    for each one and then lets them spin for ~0.1 s (OpenBLAS's default thread timeout):
    measured on a shared 2-core machine, a mask upsampling took 2.6 ms single-threaded and
    2.8-120 ms threaded (waking sleeping workers behind other processes), and the spinning
    worker burnt ~100 ms of CPU per click, which a server on the same machine (the embedded
    one) lost from its decoder. Each output element is computed the same way either way
    (checked bit for bit), so only the threading changes.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _blas_controller().limit(limits=1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


# -- geometry -------------------------------------------------------------------------------
def resized_hw(orig_hw: tuple[int, int], pre: Preprocessing) -> tuple[int, int]:
    """Size (H, W) the image occupies in the model input frame, before padding.

    ``"square"``: (S, S). ``"longest_side"``: ``ResizeLongestSide.get_preprocess_shape``
    (longest side -> S, the other rounded half up).

    Raises:
        InputValidationError: ``orig_hw`` is not two positive ints, or the image is so thin
            that its short side would resize to 0 pixels.
    """
    return rule_call(pre, "resized_hw", check_hw(orig_hw), pre.image_size)


def transform_coords(
    coords: np.ndarray, orig_hw: tuple[int, int], pre: Preprocessing
) -> np.ndarray:
    """Map points from the original image to the model input frame.

    ``"square"``: ``x / w * S``, ``y / h * S`` in float32, as ``SAM2Transforms`` computes on
    a float32 tensor. ``"longest_side"``: ``ResizeLongestSide.apply_coords`` in float64,
    then float32 as ``SamPredictor`` feeds it to the model.

    Args:
        coords: ...x2 array, (X, Y) pixels of the original image.
        orig_hw: (H, W) of the original image.
        pre: the family's preprocessing.

    Returns:
        float32 array of the same shape, (X, Y) in the model input frame.

    Raises:
        InputValidationError: ``coords`` is not numeric ...x2 or not finite; bad ``orig_hw``.
    """
    points = _as_float_array(coords, "coords", "...x2 (X, Y) pixels")
    if points.ndim == 0 or points.shape[-1] != 2:
        raise InputValidationError(
            "coords", f"got shape {points.shape}; expected ...x2 (X, Y) pixels"
        )
    return rule_call(pre, "coords", points, check_hw(orig_hw), pre.image_size)


def transform_boxes(boxes: np.ndarray, orig_hw: tuple[int, int], pre: Preprocessing) -> np.ndarray:
    """Map boxes from the original image to corner points in the model input frame.

    Args:
        boxes: Bx4 (or 4) array, (X0, Y0, X1, Y1) pixels of the original image.
        orig_hw: (H, W) of the original image.
        pre: the family's preprocessing.

    Returns:
        float32 Bx2x2: per box the top-left and bottom-right (X, Y) in the input frame.

    Raises:
        InputValidationError: ``boxes`` is not numeric with 4 values per box; bad ``orig_hw``.
    """
    arr = _as_float_array(boxes, "boxes", "Bx4 (X0, Y0, X1, Y1) pixels")
    if arr.ndim == 0 or arr.shape[-1] != 4:
        raise InputValidationError(
            "boxes", f"got shape {arr.shape}; expected Bx4 (X0, Y0, X1, Y1) pixels"
        )
    return transform_coords(arr.reshape(-1, 2, 2), orig_hw, pre)


def _as_float_array(values: object, field: str, expected: str) -> np.ndarray:
    """``np.asarray(values, float64)``, raising ``InputValidationError`` for junk or NaN/inf."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputValidationError(
            field, f"cannot be read as numbers ({e}); expected {expected}"
        ) from e
    if not np.all(np.isfinite(arr)):
        raise InputValidationError(field, f"contains NaN or inf; expected finite {expected}")
    return arr


def check_hw(orig_hw: tuple[int, int]) -> tuple[int, int]:
    """Validate an (H, W) pair of positive ints."""
    try:
        h, w = (int(v) for v in orig_hw)
    except (TypeError, ValueError) as e:
        raise InputValidationError("orig_hw", f"got {orig_hw!r}; expected (H, W) ints") from e
    if h <= 0 or w <= 0:
        raise InputValidationError("orig_hw", f"got {orig_hw!r}; expected (H, W) with H, W >= 1")
    return h, w


# -- resize rules: one per upstream processor (serving/rules.py, shared with the server) ----
SamPredictorRule = rules.SamPredictorRule
Sam2TransformsRule = rules.Sam2TransformsRule
Sam3ProcessorRule = rules.Sam3ProcessorRule
UpstreamRule = rules.UpstreamRule


def resize_rule(pre: Preprocessing) -> UpstreamRule:
    """The upstream processor ``pre`` describes (:func:`triton_sam.serving.rules.rule_for`).

    Raises:
        ConfigError: a combination no upstream processor has (a spec bug, not a user input
            error).
    """
    try:
        return rules.rule_for(pre)
    except rules.UnknownRuleError as e:
        raise ConfigError(str(e)) from e


def rule_call(pre: Preprocessing, method: str, *args: Any) -> Any:
    """``resize_rule(pre).<method>(*args)``, its request errors as InputValidationError."""
    try:
        return getattr(resize_rule(pre), method)(*args)
    except rules.RequestError as e:
        raise InputValidationError(e.field, str(e).split(": ", 1)[1]) from e


# -- preprocessing --------------------------------------------------------------------------
@single_threaded_blas
def preprocess(image: np.ndarray, pre: Preprocessing) -> np.ndarray:
    """Turn an RGB image into the encoder input.

    Args:
        image: HxWx3 uint8 RGB (see ``load_image``).
        pre: the family's preprocessing.

    Returns:
        float32 [1, 3, S, S], S = ``pre.image_size``, normalised with ``pre.pixel_mean`` /
        ``pre.pixel_std`` on the ``pre.pixel_scale`` scale; for ``"longest_side"`` the area
        right of / below the resized image is 0 (padding after normalisation, as upstream).

    Raises:
        InputValidationError: (field ``"image"``) not a non-empty HxWx3 uint8 array, or too
            thin to resize.
    """
    if not isinstance(image, np.ndarray):
        raise InputValidationError(
            "image", f"got {type(image).__name__}; expected {EXPECTED_ARRAY} (see load_image)"
        )
    rgb = check_rgb_array(image)
    return rule_call(pre, "preprocess", rgb, pre)
