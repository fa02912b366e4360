"""Images into the ``<family>_session`` model: decode, check, id, preprocess (numpy + PIL).

Shared by the session model (shipped beside its ``model.py``) and the clients, so both sides
compute the same image id and the same encoder input from the same pixels:

- :func:`decode_image`: encoded file bytes (JPEG, PNG, TIFF, BMP, WebP...) -> HxWx3 uint8
  RGB, the size checked from the header before any pixel is decoded (a decompression bomb is
  refused, not decoded), EXIF orientation applied, 16-bit scaled to 8-bit, grayscale,
  palette, RGBA (alpha dropped) and CMYK converted as the clients always did;
- :func:`preprocess`: HxWx3 uint8 -> float32 [1, 3, S, S], the official predictors' resize and
  normalisation (``triton_sam.client.model_frame.preprocess`` is this function);
- :func:`session_namespace` + ``images.image_id``: the content id. The server keys features by
  the id of what it received and decoded, never by a client's word.

``pre`` arguments are anything with the attributes of ``triton_sam.models.spec.Preprocessing``
(the dataclass on the client, :func:`preprocessing_from_json` on the server).
"""

from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import Any

import numpy as np

from . import rules
from .bounds import RequestError, check_image_size

# Preprocessing fields the server needs: what the encoder input's pixels depend on (part of the
# image id), and how original-pixel prompts map to the input frame.
PIXEL_FIELDS = (
    "image_size",
    "resize",
    "resize_dtype",
    "pixel_mean",
    "pixel_std",
    "pixel_scale",
    "coord_rule",
)
ID_VERSION = "triton_sam.session/v2"
SIXTEEN_BIT_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N")


def preprocessing_json(pre: Any) -> str:
    """The preprocessing the server needs, as canonical JSON (a config parameter)."""
    fields = {}
    for name in PIXEL_FIELDS:
        value = getattr(pre, name)
        fields[name] = list(value) if isinstance(value, tuple | list) else value
    return json.dumps(fields, sort_keys=True)


def preprocessing_from_json(text: str) -> SimpleNamespace:
    """Inverse of :func:`preprocessing_json`: an object with the Preprocessing attributes."""
    return SimpleNamespace(**json.loads(text))


def session_namespace(session_model: str, encoder_model: str, pre_json: str, kind: str) -> str:
    """What an image id depends on besides the pixels.

    Args:
        session_model / encoder_model: the Triton models (features differ per encoder).
        pre_json: :func:`preprocessing_json` of the family.
        kind: what was hashed: ``"rgb"`` (decoded uint8 pixels, from raw or encoded input)
            or the name of a preprocessed float input (``"image"``).
    """
    return f"{ID_VERSION}\0{session_model}\0{encoder_model}\0{pre_json}\0{kind}"


# -- decoding --------------------------------------------------------------------------------
def decode_image(data: bytes, *, max_pixels: int, field: str = "image_bytes") -> np.ndarray:
    """Decode an encoded image file to HxWx3 uint8 RGB.

    The size is read from the header and checked against ``max_pixels`` before any pixel is
    decoded. PIL's own decompression-bomb guard (2 x ``Image.MAX_IMAGE_PIXELS``) fires even
    earlier for absurd headers; both answer :class:`RequestError`.

    Raises:
        RequestError: (``field``) not an image PIL can read, truncated, too large, or a mode
            without a sensible RGB conversion.
    """
    from PIL import Image, ImageOps

    try:
        with Image.open(io.BytesIO(data)) as opened:
            check_image_size(opened.size[1], opened.size[0], max_pixels=max_pixels, field=field)
            opened.load()
            # exif_transpose returns a new image (or a copy), which outlives the closed file.
            image = ImageOps.exif_transpose(opened)
    except RequestError:
        raise
    except Image.DecompressionBombError as e:
        raise RequestError(field, f"refused by PIL's decompression-bomb guard ({e})") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise RequestError(
            field,
            f"cannot decode {len(data)} bytes as an image ({e}); expected the bytes "
            "of a JPEG, PNG, TIFF, BMP or WebP file",
        ) from None
    return pil_to_rgb(image, field=field)


def pil_to_rgb(image: Any, *, field: str = "image") -> np.ndarray:
    """A PIL image of any common mode as contiguous HxWx3 uint8 RGB.

    16-bit modes are scaled 0..65535 -> 0..255 (PIL's ``convert("RGB")`` would clip at 255),
    alpha is dropped (not composited), other modes go through ``convert("RGB")``.

    Raises:
        RequestError: an empty image, a float (``F``) image, or an unconvertible mode.
    """
    w, h = image.size
    if w == 0 or h == 0:
        raise RequestError(field, f"got an empty image (W x H = {w} x {h}); expected W, H >= 1")
    if image.mode in SIXTEEN_BIT_MODES:
        wide = np.asarray(image).astype(np.int64).clip(0, 65535)
        gray = ((wide * 255 + 32767) // 65535).astype(np.uint8)  # round(v / 257)
        return np.ascontiguousarray(np.repeat(gray[..., None], 3, axis=-1))
    if image.mode == "F":
        raise RequestError(
            field,
            "got a float (mode 'F') image, whose value range is ambiguous; expected an 8-bit "
            "or 16-bit image (convert it to uint8 RGB first)",
        )
    if image.mode != "RGB":
        try:
            image = image.convert("RGB")
        except ValueError as e:
            raise RequestError(field, f"cannot convert mode {image.mode!r} to RGB ({e})") from None
    return np.ascontiguousarray(np.asarray(image, dtype=np.uint8))


def check_rgb(array: np.ndarray, *, max_pixels: int, field: str = "image_rgb") -> np.ndarray:
    """A received raw image: [1, H, W, 3] or [H, W, 3] uint8 -> contiguous [H, W, 3].

    Raises:
        RequestError: wrong dtype or shape, empty, or above ``max_pixels``.
    """
    if array.ndim == 4 and array.shape[0] == 1:
        array = array[0]
    if array.dtype != np.uint8:
        raise RequestError(field, f"got dtype {array.dtype}, expected uint8 RGB pixels")
    if array.ndim != 3 or array.shape[2] != 3:
        raise RequestError(field, f"got shape {list(array.shape)}, expected [H, W, 3] RGB")
    check_image_size(int(array.shape[0]), int(array.shape[1]), max_pixels=max_pixels, field=field)
    return np.ascontiguousarray(array)


# -- preprocessing (the official predictors'; serving/rules.py) --------------------------------
def preprocess(rgb: np.ndarray, pre: Any) -> np.ndarray:
    """HxWx3 uint8 RGB -> float32 [1, 3, S, S] encoder input, by the family's upstream rule.

    Raises:
        RequestError: (``image``) the short side would resize to 0 pixels.
    """
    return rules.rule_for(pre).preprocess(rgb, pre)
