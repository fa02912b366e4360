"""Resampling with PyTorch's exact arithmetic in numpy, and SAM2's frame preprocessing.

numpy only (Pillow for frames, imported when needed), for where torch is not available: the
tracker model inside Triton (frames, mask prompts) and the light clients
(:mod:`triton_sam.transforms` imports its kernels from here).

- :func:`preprocess_frame` / :func:`decode_frame`: what ``sam2.utils.misc.load_video_frames``
  does to a frame (Pillow decode and resize, / 255, mean/std);
- :func:`bilinear` / :func:`antialias_resize`: ``F.interpolate(..., mode="bilinear",
  align_corners=False)`` without / with ``antialias=True``, on float32.
"""

from __future__ import annotations

import numpy as np

from . import protocol
from .protocol import TrackingError


def bilinear(x: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """``F.interpolate(x, out_hw, mode="bilinear", align_corners=False)``, float32 [..., h, w]."""
    along_w = resample(x, bilinear_taps(x.shape[-1], out_hw[1]), axis=-1)
    return resample(along_w, bilinear_taps(x.shape[-2], out_hw[0]), axis=-2)


def antialias_resize(x: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """``F.interpolate(x, out_hw, mode="bilinear", align_corners=False, antialias=True)`` for
    float32 [..., h, w] (W first, then H, as torch's CPU kernel)."""
    along_w = resample(x, antialias_taps(x.shape[-1], out_hw[1]), axis=-1)
    return resample(along_w, antialias_taps(x.shape[-2], out_hw[0]), axis=-2)


# -- 1-d resampling kernels -----------------------------------------------------------------
# A kernel is (start, weights): out[j] = sum_k weights[j, k] * x[start[j] + k], with zero
# weights wherever start[j] + k falls past the input. Weights follow PyTorch's CPU kernels
# in float32 so that results agree to float32 rounding.

BLOCK = 64  # outputs per matmul: large enough for BLAS, small enough to skip zero weights


def bilinear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear, align_corners=False, no antialias (``area_pixel_compute_source_index``).

    ``src = (in / out) * (j + 0.5) - 0.5``, clamped at 0; taps floor(src) and the next one,
    except at the last input pixel, where torch reads that pixel twice. ``src`` is rounded
    to float32 once, as the FMA of torch's vectorised CPU kernels (see
    ``triton_sam.serving.resample``).
    """
    f32 = np.float32
    scale = f32(in_size) / f32(out_size)
    exact = np.float64(scale) * (np.arange(out_size, dtype=np.float64) + 0.5) - 0.5
    src = np.maximum(exact.astype(f32), f32(0))
    start = src.astype(np.int64)  # floor, since src >= 0
    frac = src - start.astype(f32)
    weights = np.stack([f32(1) - frac, frac], axis=1)
    last = start >= in_size - 1
    weights[last] = [f32(1), f32(0)]  # (1 - f) * x + f * x of the same pixel
    return start, weights


def antialias_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Antialiased bilinear as torch's ``_upsample_bilinear2d_aa`` (CPU, float32).

    Triangle filter widened by the scale when downsampling, normalised per output. The
    mixed float32/float64 steps mirror ``_compute_indices_min_size_weights_aa``.
    """
    f32, f64 = np.float32, np.float64
    scale = f32(in_size) / f32(out_size)
    downsampling = scale >= 1.0
    support = scale if downsampling else f32(1.0)
    invscale = f32(1.0 / f64(scale)) if downsampling else f32(1.0)
    taps = int(np.ceil(support)) * 2 + 1
    center = (f64(scale) * (np.arange(out_size, dtype=f64) + 0.5)).astype(f32)
    start = np.trunc((center - support).astype(f64) + 0.5).astype(np.int64).clip(0, None)
    stop = np.trunc((center + support).astype(f64) + 0.5).astype(np.int64).clip(None, in_size)
    k = np.arange(taps)
    offset = (start[:, None] + k).astype(f32) - center[:, None]
    distance = np.abs(((offset.astype(f64) + 0.5) * f64(invscale)).astype(f32))
    weights = np.where(distance < 1, (1.0 - distance.astype(f64)).astype(f32), f32(0))
    weights[k >= (stop - start)[:, None]] = 0
    total = np.zeros(out_size, f32)
    for column in weights.T:  # torch sums the taps in order, in float32
        total += column
    np.divide(weights, total[:, None], out=weights, where=total[:, None] != 0)
    return start, weights


def resample(x: np.ndarray, kernel: tuple[np.ndarray, np.ndarray], axis: int) -> np.ndarray:
    """Apply a 1-d kernel along axis -1 or -2 of a float32 array.

    Blocks of ``BLOCK`` outputs read a short contiguous run of inputs, so each block is a
    small dense matmul: BLAS speed without the out x in cost of a full resampling matrix.
    """
    start, weights = kernel
    in_size, out_size = x.shape[axis], len(start)
    if in_size == out_size and np.all(start == np.arange(out_size)) and np.all(weights[:, 0] == 1):
        return x.copy()  # identity (both torch kernels then copy the input); never alias it
    shape = list(x.shape)
    shape[axis] = out_size
    out = np.empty(shape, np.float32)
    for j0 in range(0, out_size, BLOCK):
        lo, block = dense_block(start[j0 : j0 + BLOCK], weights[j0 : j0 + BLOCK], in_size)
        hi, j1 = lo + block.shape[1], j0 + block.shape[0]
        if axis == -1:
            np.matmul(x[..., lo:hi], block.T, out=out[..., j0:j1])
        else:
            np.matmul(block, x[..., lo:hi, :], out=out[..., j0:j1, :])
    return out


def dense_block(start: np.ndarray, weights: np.ndarray, in_size: int) -> tuple[int, np.ndarray]:
    """Scatter a block of taps into a dense [outputs, inputs] matrix starting at input ``lo``."""
    lo = int(start.min())
    hi = min(int(start.max()) + weights.shape[1], in_size)
    block = np.zeros((len(start), hi - lo), np.float32)
    rows, k = np.indices(weights.shape)
    columns = start[:, None] - lo + k
    inside = columns < hi - lo
    block[rows[inside], columns[inside]] = weights[inside]
    return lo, block


# -- SAM2's frame preprocessing ----------------------------------------------------------------
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
