"""Video frames as SAM2 loads them: ``sam2.utils.misc.load_video_frames`` in numpy and Pillow.

- :func:`decode_frame` / :func:`encoded_size`: an encoded frame (JPEG, PNG, TIFF...) to RGB,
  or its size from the header alone;
- :func:`preprocess_frame`: Pillow resize to the model input, / 255, ImageNet mean/std.

Pillow is imported when a frame is decoded or resized (the tracker model's only dependency
beyond numpy).
"""

from __future__ import annotations

import numpy as np

from ..images import preprocess_sam3
from ..protocol import tracker as protocol
from ..protocol.tracker import TrackingError


def preprocess(frame: np.ndarray, image_size: int, preprocessing: str) -> np.ndarray:
    """A decoded frame as the model family feeds it: ``"sam2"`` (:func:`preprocess_frame`)
    or ``"sam3"`` (transformers' SAM3 processors: antialiased bilinear resize of the uint8
    frame, mean = std = 0.5; a grayscale frame becomes RGB by repeating its channel).

    Returns:
        float32 [1, 3, image_size, image_size].
    """
    if preprocessing == "sam2":
        return preprocess_frame(frame, image_size)
    if frame.ndim == 2:
        frame = frame[..., None]
    if frame.shape[2] == 1:
        frame = np.repeat(frame, 3, axis=2)
    pixels = preprocess_sam3(frame)
    if pixels.shape[-1] != image_size:  # the SAM3 processors' size is fixed
        raise ValueError(
            f"image_size: SAM3 preprocessing gives {pixels.shape[-1]}, not {image_size}"
        )
    return pixels


def preprocess_frame(frame: np.ndarray, image_size: int = protocol.IMAGE_SIZE) -> np.ndarray:
    """A decoded frame as ``sam2.utils.misc.load_video_frames`` feeds it to the model.

    ``PIL.Image.convert("RGB").resize((S, S))`` (Pillow's default BICUBIC on uint8), then
    ``/ 255.0`` in float64, float32, minus the ImageNet mean, divided by its std (float32).
    Pillow itself does the resize: its fixed-point algorithm (and, in recent releases, the
    order of its two passes) is what upstream's frames go through, so no reimplementation
    is bit-exact across Pillow versions; keep client and server on the same Pillow for
    bit-identical frames.

    Args:
        frame: uint8 [H, W], [H, W, 1] or [H, W, 3] (a grayscale frame becomes RGB as
            PIL's ``convert("RGB")`` makes it).

    Returns:
        float32 [1, 3, image_size, image_size].

    Raises:
        ImportError: Pillow is not installed (the message says what to install).
    """
    try:
        from PIL import Image
    except ImportError as e:  # the Triton container's Python may lack it
        raise ImportError(
            "the tracker preprocesses frames with Pillow, as SAM2 does: pip install pillow "
            "into the Python that runs the Triton python backend"
        ) from e
    if frame.ndim == 3 and frame.shape[2] == 1:
        frame = frame[..., 0]
    image = Image.fromarray(np.ascontiguousarray(frame)).convert("RGB")
    resized = np.asarray(image.resize((image_size, image_size)))
    chw = (resized.transpose(2, 0, 1) / 255.0).astype(np.float32)
    mean = np.asarray(protocol.PIXEL_MEAN, np.float32)[:, None, None]
    std = np.asarray(protocol.PIXEL_STD, np.float32)[:, None, None]
    return ((chw - mean) / std)[None]


def decode_frame(data: bytes) -> np.ndarray:
    """An encoded frame (JPEG, PNG, TIFF...) as uint8 [H, W, 3] RGB, decoded as SAM2 loads
    frames (``Image.open(path).convert("RGB")``; EXIF orientation is not applied, as upstream).

    Raises:
        TrackingError: (InvalidInput) the bytes are not a readable image.
        ImportError: Pillow is not installed.
    """
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image.convert("RGB"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise TrackingError(
            protocol.ERR_INVALID_INPUT, f"frame_bytes: not a readable image ({e})", "frame_bytes"
        ) from e


def encoded_size(data: bytes) -> tuple[int, int]:
    """(H, W) of an encoded frame, from its header (nothing is decoded).

    Raises:
        TrackingError: (InvalidInput) not a readable image.
    """
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise TrackingError(
            protocol.ERR_INVALID_INPUT, f"frame_bytes: not a readable image ({e})", "frame_bytes"
        ) from e
    return height, width
