"""Reading the user's image: paths, encoded bytes, PIL images or arrays -> HxWx3 uint8 RGB.

Numpy + PIL only (no torch: clients stay light). The pixel limit is checked before anything is
decoded or copied; every refusal is an ``InputValidationError`` naming ``image`` (or the limit's
source). Conversions of PIL modes are the server's own (:func:`triton_sam.serving.intake.
pil_to_rgb`), so an image reads the same on both sides.
"""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image, ImageOps

from triton_sam.errors import InputValidationError
from triton_sam.serving import intake

ImageLike = str | os.PathLike[str] | bytes | Image.Image | np.ndarray


# Images above this many pixels are refused (SAM resizes to ~1024 px anyway, while a huge
# image costs 12 bytes per pixel in preprocessing and 4 per mask pixel in postprocessing).
# Override per call (load_image(max_pixels=...)) or for every client with this variable;
# 0 means no limit. PIL's own decompression-bomb guard still refuses image files above
# 2 * PIL.Image.MAX_IMAGE_PIXELS (~179 MP) before they are decoded.
DEFAULT_MAX_IMAGE_PIXELS = 64_000_000
MAX_PIXELS_ENV = "TRITON_SAM_MAX_IMAGE_PIXELS"

_EXPECTED_IMAGE = "a path, encoded bytes, a PIL.Image, or an HxWx3 uint8 RGB numpy array"
EXPECTED_ARRAY = "an HxWx3 uint8 RGB array with H, W >= 1"
# Errors PIL raises for missing, unreadable, truncated or hostile files.
_READ_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


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
        return np.ascontiguousarray(check_rgb_array(image))
    raise InputValidationError(
        "image", f"got an object of type {type(image).__name__}; expected {_EXPECTED_IMAGE}"
    )


def read_image(
    image: ImageLike, *, keep_bytes: bool = False, max_pixels: int | None = None
) -> tuple[np.ndarray, bytes | None]:
    """:func:`load_image`, and the file's bytes as they are when ``keep_bytes`` and ``image``
    is a path or encoded bytes (else None): a file is opened and read once.

    Raises:
        InputValidationError: as :func:`load_image`.
    """
    if not keep_bytes or not isinstance(image, str | os.PathLike | bytes | bytearray | memoryview):
        return load_image(image, max_pixels=max_pixels), None
    limit = _max_pixels(max_pixels)
    if isinstance(image, bytes | bytearray | memoryview):
        data = bytes(image)
        return _pil_to_rgb(_open_file(io.BytesIO(data), limit)), data
    name = repr(os.fspath(image))
    try:
        with open(image, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputValidationError("image", _unreadable(name, e)) from e
    return _pil_to_rgb(_open_file(io.BytesIO(data), limit, name=name)), data


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


def _open_file(
    source: str | os.PathLike[str] | io.BytesIO, limit: int, name: str | None = None
) -> Image.Image:
    """Decode a file fully (so truncation surfaces here) and apply its EXIF orientation.

    The size is checked from the header, before any pixel is decoded. ``name`` names a file
    read into ``source`` in messages.
    """
    read_from = source if name is not None else None  # a buffer read from a named file
    if name is None:
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
        # PIL names a buffer by its repr: name the file it was read from instead
        raise InputValidationError("image", _unreadable(name, e, read_from)) from e


def _unreadable(name: str, e: BaseException, source: object = None) -> str:
    detail = str(e).replace(repr(source), name) if source is not None else str(e)
    return f"cannot read an image from {name} ({detail}); expected {_EXPECTED_IMAGE}"


def _pil_to_rgb(img: Image.Image) -> np.ndarray:
    """Convert a PIL image of any common mode to an HxWx3 uint8 RGB array (as the server
    does: :func:`triton_sam.serving.intake.pil_to_rgb`)."""
    try:
        return intake.pil_to_rgb(img, field="image")
    except intake.RequestError as e:
        raise InputValidationError("image", str(e).removeprefix("image: ")) from None


def check_rgb_array(image: np.ndarray, field: str = "image") -> np.ndarray:
    """Return ``image`` if it is a non-empty HxWx3 uint8 array, else raise naming ``field``."""
    if image.ndim != 3 or image.shape[-1] != 3:
        hint = (
            " (drop alpha with image[..., :3])" if image.ndim == 3 and image.shape[-1] == 4 else ""
        )
        raise InputValidationError(
            field, f"got an array of shape {image.shape}; expected {EXPECTED_ARRAY}{hint}"
        )
    if image.dtype != np.uint8:
        raise InputValidationError(
            field, f"got dtype {image.dtype}; expected {EXPECTED_ARRAY} (values 0..255)"
        )
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise InputValidationError(
            field, f"got an empty array of shape {image.shape}; expected {EXPECTED_ARRAY}"
        )
    return image
