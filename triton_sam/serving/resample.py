"""Resampling that reproduces torch's CPU kernels in numpy (no torch, no PIL, no triton_sam).

The project's one resampling module, dependency-free on purpose: the clients use it
(``client.model_frame``, ``client.postprocess``, the video client) and so do the models that
run inside Triton's python stub (the tracker's mask prompts and outputs), where the repository
writer ships this package next to their ``model.py`` (see :mod:`triton_sam.serving`).

- :func:`bilinear`: ``F.interpolate(x, size, mode="bilinear", align_corners=False)``.
- :func:`antialias_resize`: the same with ``antialias=True`` (float32, any output size);
  :func:`resize_antialias` is torchvision ``Resize((S, S))`` on a float tensor.
- :func:`resize_antialias_uint8`: the same on a uint8 tensor (transformers' image processors).

Arrays are channels-first (``[..., H, W]``); sizes are (H, W).
"""

from __future__ import annotations

import numpy as np


def resize_antialias(chw: np.ndarray, size: int) -> np.ndarray:
    """3xHxW float32 -> 3xSxS, as torchvision ``Resize`` (bilinear, antialias) on a tensor.

    PIL's float ("F") resize runs the same algorithm but computes its weights in float64;
    torch computes them in float32, which for sizes like 1008 (SAM3) moves the resized
    pixels by up to ~1e-4. Hence torch's weights, applied W first then H as torch does.
    """
    return antialias_resize(chw, (size, size))


def antialias_resize(x: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """``F.interpolate(x, out_hw, mode="bilinear", align_corners=False, antialias=True)`` for
    float32 [..., h, w] (W first, then H, as torch's CPU kernel)."""
    along_w = _resample(x, _antialias_taps(x.shape[-1], out_hw[1]), axis=-1)
    return _resample(along_w, _antialias_taps(x.shape[-2], out_hw[0]), axis=-2)


def resize_antialias_uint8(chw: np.ndarray, size: int) -> np.ndarray:
    """3xHxW uint8 -> 3xSxS uint8, as torchvision ``resize`` (bilinear, antialias) on uint8.

    Torch's uint8 kernel (Pillow-SIMD's algorithm): float64 triangle weights normalised per
    output, quantised to int16 with the largest precision that fits, accumulated in integers
    and rounded back to uint8 after each pass (W first, then H).
    """
    along_w = _resample_uint8(chw, size, axis=-1)
    return _resample_uint8(along_w, size, axis=-2)


def _resample_uint8(x: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    in_size = x.shape[axis]
    if in_size == out_size:
        return x  # torch skips a pass whose size does not change
    start, weights, precision = _antialias_taps_uint8(in_size, out_size)
    moved = np.moveaxis(x, axis, -1).astype(np.int64)
    padded = np.concatenate([moved, np.zeros((*moved.shape[:-1], weights.shape[1]), np.int64)], -1)
    out = np.empty((*moved.shape[:-1], out_size), np.uint8)
    for j0 in range(0, out_size, _BLOCK):  # bounded memory: _BLOCK outputs at a time
        j1 = min(j0 + _BLOCK, out_size)
        index = start[j0:j1, None] + np.arange(weights.shape[1])
        acc = np.einsum("...jk,jk->...j", padded[..., index], weights[j0:j1])
        out[..., j0:j1] = np.clip((acc + (1 << (precision - 1))) >> precision, 0, 255)
    return np.moveaxis(out, -1, axis)


def _antialias_taps_uint8(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(start, int16-valued weights, precision bits) of torch's uint8 antialiased bilinear."""
    scale = in_size / out_size
    support = scale if scale >= 1.0 else 1.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    center = scale * (np.arange(out_size) + 0.5)
    start = np.maximum((center - support + 0.5).astype(np.int64), 0)
    stop = np.minimum((center + support + 0.5).astype(np.int64), in_size)
    k = np.arange(int(np.ceil(support)) * 2 + 1)
    weights = np.clip(
        1.0 - np.abs((start[:, None] + k - center[:, None] + 0.5) * invscale), 0, None
    )
    weights[k >= (stop - start)[:, None]] = 0
    weights /= weights.sum(axis=1, keepdims=True)
    precision = 0
    while precision < 22 and int(0.5 + weights.max() * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    quantised = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5))
    return start, quantised.astype(np.int64), precision


def bilinear(x: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """``F.interpolate(x, out_hw, mode="bilinear", align_corners=False)`` for [..., h, w]."""
    along_w = _resample(x, _bilinear_taps(x.shape[-1], out_hw[1]), axis=-1)
    return _resample(along_w, _bilinear_taps(x.shape[-2], out_hw[0]), axis=-2)


# -- 1-d resampling kernels -----------------------------------------------------------------
# A kernel is (start, weights): out[j] = sum_k weights[j, k] * x[start[j] + k], with zero
# weights wherever start[j] + k falls past the input. Weights follow PyTorch's CPU kernels
# in float32 so that results agree to float32 rounding.

_BLOCK = 64  # outputs per matmul: large enough for BLAS, small enough to skip zero weights


def _bilinear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear, align_corners=False, no antialias (``area_pixel_compute_source_index``).

    ``src = (in / out) * (j + 0.5) - 0.5``, clamped at 0; taps floor(src) and the next one,
    except at the last input pixel, where torch reads that pixel twice.

    ``src`` is rounded to float32 ONCE, as a fused multiply-add: torch's vectorised CPU
    kernels (AVX2/AVX512 on x86, and aarch64), which every current CPU dispatches to, are
    compiled with FMA contraction. Rounding the product first (two roundings) moves ``src``
    by one float32 ulp for some outputs, which changes a logit by up to ~1e-5 of its
    neighbours' difference (3e-4 on random logits of std 10). Only torch's scalar fallback
    (``ATEN_CPU_CAPABILITY=default``) rounds twice. The float64 product of two float32
    values and the subtraction of 0.5 are exact, so casting once equals the FMA.
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


def _antialias_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
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


def _resample(x: np.ndarray, kernel: tuple[np.ndarray, np.ndarray], axis: int) -> np.ndarray:
    """Apply a 1-d kernel along axis -1 or -2 of a float32 array.

    Blocks of ``_BLOCK`` outputs read a short contiguous run of inputs, so each block is a
    small dense matmul: BLAS speed without the out x in cost of a full resampling matrix.
    """
    start, weights = kernel
    in_size, out_size = x.shape[axis], len(start)
    if in_size == out_size and np.all(start == np.arange(out_size)) and np.all(weights[:, 0] == 1):
        return x.copy()  # identity (both torch kernels then copy the input); never alias it
    shape = list(x.shape)
    shape[axis] = out_size
    out = np.empty(shape, np.float32)
    for j0 in range(0, out_size, _BLOCK):
        lo, block = _dense_block(start[j0 : j0 + _BLOCK], weights[j0 : j0 + _BLOCK], in_size)
        hi, j1 = lo + block.shape[1], j0 + block.shape[0]
        if axis == -1:
            np.matmul(x[..., lo:hi], block.T, out=out[..., j0:j1])
        else:
            np.matmul(block, x[..., lo:hi, :], out=out[..., j0:j1, :])
    return out


def _dense_block(start: np.ndarray, weights: np.ndarray, in_size: int) -> tuple[int, np.ndarray]:
    """Scatter a block of taps into a dense [outputs, inputs] matrix starting at input ``lo``."""
    lo = int(start.min())
    hi = min(int(start.max()) + weights.shape[1], in_size)
    block = np.zeros((len(start), hi - lo), np.float32)
    rows, k = np.indices(weights.shape)
    columns = start[:, None] - lo + k
    inside = columns < hi - lo
    block[rows[inside], columns[inside]] = weights[inside]
    return lo, block
