"""Images on the server side: content ids and SAM3 preprocessing (numpy only).

Shared by the serving model (shipped beside its ``model.py``) and the clients, so a client
can compute the id the server will answer and probe for it without sending the pixels.
"""

from __future__ import annotations

import hashlib

import numpy as np

from . import resample

# Sam3ImageProcessor: mean = std = 0.5 on [0, 1] with rescale 1/255, i.e. (x - 127.5) / 127.5.
SAM3_SIZE = 1008
SAM3_MEAN = 127.5
SAM3_STD = 127.5


def image_id(rgb: np.ndarray, namespace: str) -> str:
    """Content id of an image: 32 hex chars of blake2b-128 over ``namespace``, shape and pixels.

    Args:
        rgb: HxWx3 uint8 RGB array.
        namespace: what the features depend on besides the pixels (the serving model's name
            and preprocessing), so two models never share an id.
    """
    rgb = np.ascontiguousarray(rgb)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{namespace}\0{rgb.shape}{rgb.dtype.str}\0".encode())
    digest.update(memoryview(rgb).cast("B"))
    return digest.hexdigest()


def check_rgb(image: np.ndarray, *, max_pixels: int, field: str = "image") -> np.ndarray:
    """Validate an HxWx3 uint8 image; returns it as a contiguous array.

    Raises:
        ValueError: message ``<field>: got ..., expected ...`` (wrong dtype, shape, empty, or
            more than ``max_pixels`` pixels).
    """
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        dtype = getattr(image, "dtype", type(image).__name__)
        raise ValueError(f"{field}: got dtype {dtype}, expected uint8 RGB pixels")
    if image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise ValueError(
            f"{field}: got shape {list(image.shape)}, expected [H, W, 3] with H, W >= 1"
        )
    pixels = int(image.shape[0]) * int(image.shape[1])
    if max_pixels and pixels > max_pixels:
        raise ValueError(
            f"{field}: {image.shape[1]}x{image.shape[0]} = {pixels} pixels, expected at most "
            f"{max_pixels}; downscale it first (SAM3 works at {SAM3_SIZE}x{SAM3_SIZE})"
        )
    return np.ascontiguousarray(image)


def preprocess_sam3(rgb: np.ndarray) -> np.ndarray:
    """Sam3ImageProcessor in numpy: HxWx3 uint8 -> float32 [1, 3, 1008, 1008].

    torchvision's antialiased bilinear resize on the uint8 image (rounded back to uint8),
    then ``(x - 127.5) / 127.5`` in float32, as ``client.model_frame.preprocess`` does for
    the SAM3 families (bit-identical; a unit test keeps them equal).
    """
    chw = np.ascontiguousarray(rgb.transpose(2, 0, 1))
    resized = resample.resize_antialias_uint8(chw, SAM3_SIZE).astype(np.float32)
    return ((resized - np.float32(SAM3_MEAN)) / np.float32(SAM3_STD))[None]
