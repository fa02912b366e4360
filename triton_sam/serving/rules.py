"""The official predictors' resize rules, one class per upstream processor (numpy + PIL only).

The one implementation of "image -> encoder input", "original pixels -> input frame" and
"low-res logits -> original size": the ``<family>_session`` model runs it on the server (this
file is shipped beside its ``model.py``) and the clients run it through
``triton_sam.client.model_frame``, so both sides give the same tensors for the same pixels.

- :class:`SamPredictorRule`: ``segment_anything``'s ``SamPredictor`` (``resize =
  "longest_side"``);
- :class:`Sam2TransformsRule`: ``sam2.utils.transforms.SAM2Transforms`` (``"square"``);
- :class:`Sam3ProcessorRule`: transformers' ``Sam3Processor`` (``"square"``, uint8 resize,
  ``coord_rule = "ratio"``).

:func:`rule_for` is the one place the ``Preprocessing`` strings are read. ``pre`` is anything
with the attributes of ``triton_sam.models.spec.Preprocessing`` (the dataclass on the client,
``intake.preprocessing_from_json`` on the server). Coordinates are (X, Y) pixels; sizes (H, W).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import resample
from .bounds import RequestError


class SamPredictorRule:
    """``ResizeLongestSide``: the longest side to S (the other rounded half up), PIL bilinear on
    uint8, normalise on the 0-255 scale, zero-pad bottom/right; masks: bilinear to S x S, crop
    the unpadded region, bilinear to (H, W) (``Sam.postprocess_masks``)."""

    def resized_hw(self, hw: tuple[int, int], size: int) -> tuple[int, int]:
        """``ResizeLongestSide.get_preprocess_shape`` (upstream's float arithmetic, so the
        rounding matches at .5 boundaries).

        Raises:
            RequestError: (``orig_hw``) the short side resizes to 0 pixels.
        """
        h, w = hw
        scale = size * 1.0 / max(h, w)
        new_h, new_w = int(h * scale + 0.5), int(w * scale + 0.5)
        if new_h == 0 or new_w == 0:
            raise RequestError(
                "orig_hw", f"got {h}x{w}; the short side resizes to 0 pixels at {size}"
            )
        return new_h, new_w

    def coords(self, points: np.ndarray, hw: tuple[int, int], size: int) -> np.ndarray:
        """``ResizeLongestSide.apply_coords`` in float64, then float32 as fed to the model."""
        new_h, new_w = self.resized_hw(hw, size)
        out = np.asarray(points, np.float64).copy()
        out[..., 0] = out[..., 0] * (new_w / hw[1])
        out[..., 1] = out[..., 1] * (new_h / hw[0])
        return out.astype(np.float32)

    def preprocess(self, rgb: np.ndarray, pre: Any) -> np.ndarray:
        from PIL import Image  # the stub imports PIL only when an image needs it

        try:
            new_h, new_w = self.resized_hw(rgb.shape[:2], int(pre.image_size))
        except RequestError as e:
            raise RequestError("image", str(e).split(": ", 1)[1]) from e
        # Upstream resizes the uint8 image with PIL (rounding to uint8), then normalises.
        resized = np.asarray(Image.fromarray(rgb).resize((new_w, new_h), Image.BILINEAR))
        chw = scale_pixels(np.ascontiguousarray(resized), pre.pixel_scale)
        size = int(pre.image_size)
        out = np.zeros((1, 3, size, size), np.float32)
        out[0, :, :new_h, :new_w] = normalize(chw, pre)
        return out

    def upsample(self, logits: np.ndarray, hw: tuple[int, int], size: int) -> np.ndarray:
        new_h, new_w = self.resized_hw(hw, size)
        cropped = resample.bilinear(logits, (size, size))[..., :new_h, :new_w]
        return resample.bilinear(cropped, hw)


class Sam2TransformsRule:
    """``SAM2Transforms``: ToTensor (/ 255), torchvision ``Resize((S, S))`` on the float tensor
    (bilinear, antialias), Normalize; prompts ``x / w * S`` in float32; masks straight to
    (H, W) with one bilinear resize."""

    def resized_hw(self, hw: tuple[int, int], size: int) -> tuple[int, int]:
        return size, size

    def coords(self, points: np.ndarray, hw: tuple[int, int], size: int) -> np.ndarray:
        out = np.asarray(points, np.float32).copy()  # upstream casts to float32 before scaling
        out[..., 0] = out[..., 0] / np.float32(hw[1])
        out[..., 1] = out[..., 1] / np.float32(hw[0])
        return out * np.float32(size)

    def preprocess(self, rgb: np.ndarray, pre: Any) -> np.ndarray:
        chw = resample.resize_antialias(scale_pixels(rgb, pre.pixel_scale), int(pre.image_size))
        return normalize(chw, pre)[None]

    def upsample(self, logits: np.ndarray, hw: tuple[int, int], size: int) -> np.ndarray:
        return resample.bilinear(logits, hw)


class Sam3ProcessorRule(Sam2TransformsRule):
    """``Sam3Processor``: the uint8 image resized (rounded back to uint8) before rescaling;
    prompts ``x * (S / w)``."""

    def coords(self, points: np.ndarray, hw: tuple[int, int], size: int) -> np.ndarray:
        # return_tensors="pt": the ratio is S / original size with the size an int64 tensor,
        # which torch computes in float32 as S * (1 / size); then a float32 product.
        out = np.asarray(points, np.float32).copy()
        one, side = np.float32(1), np.float32(size)
        out[..., 0] = out[..., 0] * (side * (one / np.float32(hw[1])))
        out[..., 1] = out[..., 1] * (side * (one / np.float32(hw[0])))
        return out

    def preprocess(self, rgb: np.ndarray, pre: Any) -> np.ndarray:
        chw = np.ascontiguousarray(rgb.transpose(2, 0, 1))
        resized = resample.resize_antialias_uint8(chw, int(pre.image_size))
        return normalize(scale_pixels(resized.transpose(1, 2, 0), pre.pixel_scale), pre)[None]


UpstreamRule = SamPredictorRule | Sam2TransformsRule | Sam3ProcessorRule
RULES: dict[tuple[str, str, str], UpstreamRule] = {
    ("longest_side", "float32", "divide_then_scale"): SamPredictorRule(),
    ("square", "float32", "divide_then_scale"): Sam2TransformsRule(),
    ("square", "uint8", "ratio"): Sam3ProcessorRule(),
}


class UnknownRuleError(ValueError):
    """A ``Preprocessing`` combination no upstream processor has (a spec bug)."""


def rule_for(pre: Any) -> UpstreamRule:
    """The upstream processor ``pre`` describes.

    Raises:
        UnknownRuleError: a combination no upstream processor has.
    """
    rule = RULES.get((pre.resize, pre.resize_dtype, pre.coord_rule))
    if rule is None:
        raise UnknownRuleError(
            f"Preprocessing.resize: got {pre.resize!r} (resize_dtype={pre.resize_dtype!r}, "
            f"coord_rule={pre.coord_rule!r}); expected one of {sorted(RULES)}"
        )
    return rule


def scale_pixels(rgb: np.ndarray, pixel_scale: float) -> np.ndarray:
    """HxWx3 uint8 -> 3xHxW float32 times ``pixel_scale``."""
    chw = np.ascontiguousarray(rgb.transpose(2, 0, 1), dtype=np.float32)
    inverse = 1.0 / pixel_scale
    if abs(inverse - round(inverse)) < 1e-9:
        # ToTensor divides by 255; multiplying by float32(1/255) would differ by an ulp.
        chw /= np.float32(round(inverse))
    else:
        chw *= np.float32(pixel_scale)
    return chw


def normalize(chw: np.ndarray, pre: Any) -> np.ndarray:
    """(x - mean) / std per channel, in float32 like torchvision's Normalize."""
    mean = np.asarray(pre.pixel_mean, np.float32)[:, None, None]
    std = np.asarray(pre.pixel_std, np.float32)[:, None, None]
    return (chw - mean) / std
