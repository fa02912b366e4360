"""Client-side pre- and post-processing, numpy + PIL only (no torch: clients stay light).

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
import io
import os
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from PIL import Image, ImageOps
from threadpoolctl import ThreadpoolController

from triton_sam.errors import ConfigError, InputValidationError
from triton_sam.models.spec import Preprocessing
from triton_sam.serving import intake, rules

ImageLike = str | os.PathLike[str] | bytes | Image.Image | np.ndarray

# Images above this many pixels are refused (SAM resizes to ~1024 px anyway, while a huge
# image costs 12 bytes per pixel in preprocessing and 4 per mask pixel in postprocessing).
# Override per call (load_image(max_pixels=...)) or for every client with this variable;
# 0 means no limit. PIL's own decompression-bomb guard still refuses image files above
# 2 * PIL.Image.MAX_IMAGE_PIXELS (~179 MP) before they are decoded.
DEFAULT_MAX_IMAGE_PIXELS = 64_000_000
MAX_PIXELS_ENV = "TRITON_SAM_MAX_IMAGE_PIXELS"

# SAM2ImagePredictor clamps the low-res logits it returns for refinement to this range.
LOW_RES_LOGIT_LIMIT = 32.0

_EXPECTED_IMAGE = "a path, encoded bytes, a PIL.Image, or an HxWx3 uint8 RGB numpy array"
_EXPECTED_ARRAY = "an HxWx3 uint8 RGB array with H, W >= 1"
# Errors PIL raises for missing, unreadable, truncated or hostile files.
_READ_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


# -- images ---------------------------------------------------------------------------------
_F = TypeVar("_F", bound=Callable[..., Any])


@functools.cache
def _blas_controller() -> ThreadpoolController:
    return ThreadpoolController()  # inspects the loaded libraries once (~ms)


def _single_threaded_blas(fn: _F) -> _F:
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


def load_image(image: ImageLike, *, max_pixels: int | None = None) -> np.ndarray:
    """Load an image as a contiguous HxWx3 uint8 RGB array.

    Files (and encoded bytes: PNG, JPEG, TIFF...) get their EXIF orientation applied (what a
    viewer shows is what is segmented).
    PIL images are taken as they are; grayscale, palette, CMYK, ... are converted to RGB,
    alpha is dropped (not composited), and 16-bit images (``I;16*``, ``I``) are scaled from
    0..65535 to 0..255. Arrays must already be HxWx3 uint8 RGB and are not copied when
    contiguous.

    Images larger than ``max_pixels`` are refused before they are decoded or copied (see
    :data:`DEFAULT_MAX_IMAGE_PIXELS`): downscale them first, SAM works at ~1024 px.

    Args:
        image: a path (str or os.PathLike), the bytes of an encoded image file, a
            PIL.Image, or an HxWx3 uint8 RGB array.
        max_pixels: largest accepted H * W; None reads ``$TRITON_SAM_MAX_IMAGE_PIXELS``,
            else :data:`DEFAULT_MAX_IMAGE_PIXELS`; 0 = no limit.

    Returns:
        HxWx3 uint8 RGB array, C-contiguous.

    Raises:
        InputValidationError: (field ``"image"``) the file is missing, unreadable or corrupt,
            the type is unsupported, the array has the wrong ndim/channels/dtype, a PIL mode
            has no sensible RGB conversion (``F``), the image is empty, or it is larger than
            the pixel limit (the message says how to downscale or raise it).
    """
    limit = _max_pixels(max_pixels)
    if isinstance(image, (str, os.PathLike)):
        return _pil_to_rgb(_open_file(image, limit))
    if isinstance(image, (bytes, bytearray, memoryview)):
        return _pil_to_rgb(_open_file(io.BytesIO(bytes(image)), limit))
    if isinstance(image, Image.Image):
        _check_pixels(image.size, limit)
        return _pil_to_rgb(image)
    if isinstance(image, np.ndarray):
        if image.ndim >= 2:
            _check_pixels((image.shape[1], image.shape[0]), limit)
        return np.ascontiguousarray(_check_rgb_array(image))
    raise InputValidationError(
        "image", f"got an object of type {type(image).__name__}; expected {_EXPECTED_IMAGE}"
    )


def _max_pixels(max_pixels: int | None) -> int:
    """The pixel limit in force: the argument, else the environment, else the default."""
    if max_pixels is None:
        text = os.environ.get(MAX_PIXELS_ENV, "").strip()
        try:
            max_pixels = int(text) if text else DEFAULT_MAX_IMAGE_PIXELS
        except ValueError:
            raise InputValidationError(
                MAX_PIXELS_ENV, f"got {text!r}; expected an integer number of pixels (0 = no limit)"
            ) from None
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 0:
        raise InputValidationError("max_pixels", f"got {max_pixels!r}; expected an integer >= 0")
    return max_pixels


def _check_pixels(size_wh: tuple[int, int], limit: int) -> None:
    """Refuse an image of ``size_wh`` (W, H) above ``limit`` pixels, saying what to do."""
    w, h = size_wh
    if limit and w * h > limit:
        raise InputValidationError("image", _too_large(w, h, limit))


def _too_large(w: int, h: int, limit: int) -> str:
    return (
        f"{w}x{h} (W x H) is {w * h / 1e6:.1f} megapixels, above the limit of "
        f"{limit / 1e6:.1f}; downscale it first (SAM works at ~1024 px, e.g. PIL's "
        f"img.thumbnail((4096, 4096))), or raise the limit with load_image(..., max_pixels=N) "
        f"or the {MAX_PIXELS_ENV} environment variable (0 = no limit)"
    )


def _open_file(source: str | os.PathLike[str] | io.BytesIO, limit: int) -> Image.Image:
    """Decode a file fully (so truncation surfaces here) and apply its EXIF orientation.

    The size is checked from the header, before any pixel is decoded.
    """
    name = "the given bytes" if isinstance(source, io.BytesIO) else repr(os.fspath(source))
    try:
        with Image.open(source) as opened:
            _check_pixels(opened.size, limit)
            opened.load()
            # exif_transpose returns a new image, or a copy when there is nothing to do,
            # so the result outlives the closed file.
            return ImageOps.exif_transpose(opened)
    except Image.DecompressionBombError as e:
        # PIL refuses before we can read the size: its guard is 2 * Image.MAX_IMAGE_PIXELS.
        raise InputValidationError(
            "image",
            f"{name} is refused by PIL's decompression-bomb guard ({e}); downscale it "
            "first (SAM works at ~1024 px), or raise PIL.Image.MAX_IMAGE_PIXELS and "
            f"{MAX_PIXELS_ENV} if you trust the file",
        ) from e
    except _READ_ERRORS as e:
        raise InputValidationError(
            "image",
            f"cannot read an image from {name} ({e}); expected {_EXPECTED_IMAGE}",
        ) from e


def _pil_to_rgb(img: Image.Image) -> np.ndarray:
    """Convert a PIL image of any common mode to an HxWx3 uint8 RGB array (as the server
    does: :func:`triton_sam.serving.intake.pil_to_rgb`)."""
    try:
        return intake.pil_to_rgb(img, field="image")
    except intake.RequestError as e:
        raise InputValidationError("image", str(e).removeprefix("image: ")) from None


def _check_rgb_array(image: np.ndarray, field: str = "image") -> np.ndarray:
    """Return ``image`` if it is a non-empty HxWx3 uint8 array, else raise naming ``field``."""
    if image.ndim != 3 or image.shape[-1] != 3:
        hint = (
            " (drop alpha with image[..., :3])" if image.ndim == 3 and image.shape[-1] == 4 else ""
        )
        raise InputValidationError(
            field, f"got an array of shape {image.shape}; expected {_EXPECTED_ARRAY}{hint}"
        )
    if image.dtype != np.uint8:
        raise InputValidationError(
            field, f"got dtype {image.dtype}; expected {_EXPECTED_ARRAY} (values 0..255)"
        )
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise InputValidationError(
            field, f"got an empty array of shape {image.shape}; expected {_EXPECTED_ARRAY}"
        )
    return image


# -- geometry -------------------------------------------------------------------------------
def resized_hw(orig_hw: tuple[int, int], pre: Preprocessing) -> tuple[int, int]:
    """Size (H, W) the image occupies in the model input frame, before padding.

    ``"square"``: (S, S). ``"longest_side"``: ``ResizeLongestSide.get_preprocess_shape``
    (longest side -> S, the other rounded half up).

    Raises:
        InputValidationError: ``orig_hw`` is not two positive ints, or the image is so thin
            that its short side would resize to 0 pixels.
    """
    return _rule_call(pre, "resized_hw", _check_hw(orig_hw), pre.image_size)


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
    return _rule_call(pre, "coords", points, _check_hw(orig_hw), pre.image_size)


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


def _check_hw(orig_hw: tuple[int, int]) -> tuple[int, int]:
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


def _rule_call(pre: Preprocessing, method: str, *args: Any) -> Any:
    """``resize_rule(pre).<method>(*args)``, its request errors as InputValidationError."""
    try:
        return getattr(resize_rule(pre), method)(*args)
    except rules.RequestError as e:
        raise InputValidationError(e.field, str(e).split(": ", 1)[1]) from e


# -- preprocessing --------------------------------------------------------------------------
@_single_threaded_blas
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
            "image", f"got {type(image).__name__}; expected {_EXPECTED_ARRAY} (see load_image)"
        )
    rgb = _check_rgb_array(image)
    return _rule_call(pre, "preprocess", rgb, pre)


# -- postprocessing -------------------------------------------------------------------------
@_single_threaded_blas
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
    return _rule_call(pre, "upsample", logits, _check_hw(orig_hw), pre.image_size)


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
