"""Tiles of a large image: the grid, each tile's halo, and which tile (or window) a prompt uses.

A large image (an EM section, a slide, a volume's slice) is embedded piece by piece: SAM's
encoder sees at most ``image_size`` pixels a side, so a 20,000 px section is cut into tiles
and each tile, grown by a halo of context, is embedded on its own. Coordinates here are
(row, column) pixels of the full-resolution image, ``[begin, end)`` per axis.

Two rules choose the pixels a prompt is answered on:

- :meth:`TileGrid.tile_of` is micro-sam's (``micro_sam/prompt_based_segmentation.py``,
  ``_points_to_tile``; the grid is ``bioimage_cpp.utils.Blocking``): tiles of ``tile``
  pixels from the origin, row-major ids, the last row/column cut at the image edge; the tile
  whose core holds the rounded mean of the points is embedded with ``halo`` pixels around it
  (clipped to the image), and points outside that outer block are dropped. Kept so a lab
  that tiles with micro-sam gets the same masks from the server.
- :func:`window_around` centres a window of at most ``size`` pixels a side on the prompts'
  bounding box, shifted inside the image: an object that crosses tile edges lies whole in
  it when it fits in the window.

Standard library and numpy only: shipped with the session model.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Block:
    """A rectangle of the full image: ``begin`` (inclusive) and ``end`` (exclusive), (row,
    column) each."""

    begin: tuple[int, int]
    end: tuple[int, int]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.end[0] - self.begin[0], self.end[1] - self.begin[1])

    def slices(self) -> tuple[slice, slice]:
        """The block as numpy slices of the full image."""
        return (slice(self.begin[0], self.end[0]), slice(self.begin[1], self.end[1]))

    def slices_in(self, outer: Block) -> tuple[slice, slice]:
        """The block as numpy slices of an array that holds ``outer`` (which contains it)."""
        top, left = self.begin[0] - outer.begin[0], self.begin[1] - outer.begin[1]
        return (slice(top, top + self.shape[0]), slice(left, left + self.shape[1]))

    def intersect(self, other: Block) -> Block | None:
        """The pixels both blocks cover, or None when they share none."""
        begin = (max(self.begin[0], other.begin[0]), max(self.begin[1], other.begin[1]))
        end = (min(self.end[0], other.end[0]), min(self.end[1], other.end[1]))
        if begin[0] >= end[0] or begin[1] >= end[1]:
            return None
        return Block(begin, end)

    def contains(self, rc: np.ndarray) -> np.ndarray:
        """Which of the (row, column) points ``rc`` [N, 2] lie inside the block."""
        rc = np.asarray(rc)
        inside = (rc >= np.array(self.begin)) & (rc < np.array(self.end))
        return inside.all(axis=-1)


@dataclasses.dataclass(frozen=True)
class TileGrid:
    """Tiles of ``tile`` pixels over an image of ``shape`` (rows, columns), with ``halo``
    pixels of context around each.

    Raises:
        ValueError: a shape or tile side below 1, or a negative halo (naming which).
    """

    shape: tuple[int, int]
    tile: tuple[int, int]
    halo: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        for name, values, least in (("shape", self.shape, 1), ("tile", self.tile, 1)):
            if len(values) != 2 or min(values) < least:
                raise ValueError(f"{name}: got {values}, expected two sides >= {least}")
        if len(self.halo) != 2 or min(self.halo) < 0:
            raise ValueError(f"halo: got {self.halo}, expected two sides >= 0")

    @property
    def blocks_per_axis(self) -> tuple[int, int]:
        return (
            math.ceil(self.shape[0] / self.tile[0]),
            math.ceil(self.shape[1] / self.tile[1]),
        )

    def __len__(self) -> int:
        rows, cols = self.blocks_per_axis
        return rows * cols

    def core(self, tile_id: int) -> Block:
        """The tile's own pixels (the last row and column cut at the image edge)."""
        rows, cols = self.blocks_per_axis
        if not 0 <= tile_id < rows * cols:
            raise IndexError(f"tile_id: got {tile_id}, expected 0..{rows * cols - 1}")
        r, c = divmod(tile_id, cols)
        begin = (r * self.tile[0], c * self.tile[1])
        end = (
            min(begin[0] + self.tile[0], self.shape[0]),
            min(begin[1] + self.tile[1], self.shape[1]),
        )
        return Block(begin, end)

    def outer(self, tile_id: int) -> Block:
        """The tile grown by the halo, clipped to the image: the pixels that are embedded."""
        core = self.core(tile_id)
        return Block(
            (max(core.begin[0] - self.halo[0], 0), max(core.begin[1] - self.halo[1], 0)),
            (
                min(core.end[0] + self.halo[0], self.shape[0]),
                min(core.end[1] + self.halo[1], self.shape[1]),
            ),
        )

    def tile_at(self, row: int, col: int) -> int:
        """The id of the tile whose core holds pixel (row, col).

        Raises:
            ValueError: the pixel is outside the image.
        """
        if not (0 <= row < self.shape[0] and 0 <= col < self.shape[1]):
            raise ValueError(f"point: ({row}, {col}) is outside the image of shape {self.shape}")
        return (row // self.tile[0]) * self.blocks_per_axis[1] + col // self.tile[1]

    def tile_of(self, rc: np.ndarray) -> tuple[int, np.ndarray]:
        """micro-sam's rule: the tile of the rounded mean of the points ``rc`` [N, 2] (row,
        column), and which of the points lie in that tile's outer block (the others are
        dropped by micro-sam, with a warning).

        Rounding is numpy's (half to even), as ``np.mean(...).round()`` in micro-sam.
        """
        rc = np.asarray(rc, dtype=np.float64).reshape(-1, 2)
        if len(rc) == 0:
            raise ValueError("points: at least one point is needed to choose a tile")
        centre = np.mean(rc, axis=0).round().astype(int)
        tile_id = self.tile_at(int(centre[0]), int(centre[1]))
        return tile_id, self.outer(tile_id).contains(rc)

    def tiles_touching(self, block: Block) -> list[int]:
        """Ids of the tiles whose core overlaps ``block`` (row-major): what embedding a
        region needs."""
        rows, cols = self.blocks_per_axis
        r0, c0 = block.begin[0] // self.tile[0], block.begin[1] // self.tile[1]
        r1 = min(math.ceil(block.end[0] / self.tile[0]), rows)
        c1 = min(math.ceil(block.end[1] / self.tile[1]), cols)
        return [r * cols + c for r in range(r0, r1) for c in range(c0, c1)]


def window_around(rc: np.ndarray, image_shape: tuple[int, int], size: tuple[int, int]) -> Block:
    """A window of at most ``size`` pixels a side, centred on the bounding box of the points
    ``rc`` [N, 2] (row, column), shifted to lie inside the image (and cut to it where the
    image is smaller than ``size``).

    Raises:
        ValueError: no points, or a side below 1.
    """
    rc = np.asarray(rc, dtype=np.float64).reshape(-1, 2)
    if len(rc) == 0:
        raise ValueError("points: at least one point is needed to place a window")
    if min(size) < 1 or min(image_shape) < 1:
        raise ValueError(f"size: got {size} for an image of {image_shape}, expected sides >= 1")
    centre = (rc.min(axis=0) + rc.max(axis=0)) / 2
    begin, end = [], []
    for axis in range(2):
        side = min(size[axis], image_shape[axis])
        start = int(math.floor(centre[axis] - side / 2))
        start = min(max(start, 0), image_shape[axis] - side)
        begin.append(start)
        end.append(start + side)
    return Block((begin[0], begin[1]), (end[0], end[1]))
