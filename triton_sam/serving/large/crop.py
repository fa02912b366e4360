"""A block's mask as the wire carries it: its bounding box's pixels as COCO RLE, placed in
the full image (so the bytes of a click never grow with the image)."""

from __future__ import annotations

import numpy as np

from .. import masks
from ..tiles import Block
from .planning import cut


def mask_answer(
    mask: np.ndarray, block: Block, shape: tuple[int, int], score: float
) -> dict[str, object]:
    """The :data:`~..protocol.large.MASK_FIELDS` of a bool mask of ``block``'s size.

    Args:
        mask: bool [rows, cols] of the block.
        block: where the block lies in the image.
        shape: (rows, cols) of the image (a mask is ``cut`` only where it goes on).
        score: SAM's predicted IoU.
    """
    ys = np.flatnonzero(mask.any(axis=1))
    xs = np.flatnonzero(mask.any(axis=0))
    if ys.size == 0:
        return {
            "offset": list(block.begin),
            "size": [0, 0],
            "counts": "",
            "box": [0, 0, 0, 0],
            "score": float(score),
            "area": 0,
            "cut": False,
        }
    y0, y1, x0, x1 = int(ys[0]), int(ys[-1]), int(xs[0]), int(xs[-1])
    crop = mask[y0 : y1 + 1, x0 : x1 + 1]
    row, col = block.begin[0] + y0, block.begin[1] + x0
    return {
        "offset": [row, col],
        "size": [y1 - y0 + 1, x1 - x0 + 1],
        "counts": masks.encode_rle(crop).decode("ascii"),
        "box": [col, row, block.begin[1] + x1, block.begin[0] + y1],
        "score": float(score),
        "area": int(np.count_nonzero(crop)),
        "cut": bool(cut(np.array([x0, y0, x1, y1]), block, shape)),
    }


def block_answers(found, block: Block, shape: tuple[int, int]) -> list[dict[str, object]]:
    """The answers of the session model's ``found`` [(RLE counts of the block-size mask,
    score), ...] on ``block``, best first: what a ``predict`` answers in ``masks``."""
    out = [mask_answer(block_mask(counts, block), block, shape, score) for counts, score in found]
    return sorted(out, key=lambda m: -m["score"])


def block_mask(counts: bytes | str, block: Block) -> np.ndarray:
    """The bool mask of the session model's RLE of a block-sized image."""
    return masks.decode_rle(counts, block.shape)


def paste(answer: dict, shape: tuple[int, int]) -> np.ndarray:
    """A mask answer as a dense bool [rows, cols] image of ``shape`` (tests, small images)."""
    out = np.zeros(shape, bool)
    rows, cols = answer["size"]
    if rows:
        r, c = answer["offset"]
        out[r : r + rows, c : c + cols] = masks.decode_rle(answer["counts"], (rows, cols))
    return out
