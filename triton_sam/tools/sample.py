"""A deterministic synthetic test image (no network needed for the demo and the tests)."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


def sample_image(width: int = 640, height: int = 427, *, seed: int = 0) -> np.ndarray:
    """An HxWx3 uint8 RGB scene: gradient background, a disc, a box and a triangle, with noise.

    Non-square on purpose (640x427 by default) so resize and crop paths are exercised.
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([60 + 80 * xx / width, 90 + 60 * yy / height, 140 - 40 * xx / width], axis=-1)
    img = Image.fromarray(base.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    w, h = width, height
    draw.ellipse([0.15 * w, 0.2 * h, 0.45 * w, 0.65 * h], fill=(220, 60, 50))
    draw.rectangle([0.55 * w, 0.3 * h, 0.85 * w, 0.8 * h], fill=(240, 210, 60))
    draw.polygon(
        [(0.3 * w, 0.95 * h), (0.45 * w, 0.7 * h), (0.6 * w, 0.95 * h)], fill=(40, 160, 80)
    )
    img = img.filter(ImageFilter.GaussianBlur(1.2))
    noisy = np.asarray(img, dtype=np.float32) + rng.normal(0, 6, (height, width, 3))
    return noisy.clip(0, 255).astype(np.uint8)
