"""Segment everything on a tiled image: one instance per object, across tile edges.

The generator runs on each tile's outer block (the tile grown by its halo,
:class:`~triton_sam.serving.tiles.TileGrid`), so an object that crosses a tile edge comes
back as one piece per tile that sees it. The generators' NMS cannot join those pieces: each
is cut at its own block, so their boxes differ and their IoU is low. Here they are joined by
what both tiles saw: two neighbouring tiles embed the same pixels where their outer blocks
overlap (the halo band around the edge they share), and the two pieces of one object agree
there.

The rule, per pair of neighbouring tiles ``t`` and ``u`` and their overlap ``R``:

- the IoU of two pieces inside ``R`` (the only pixels both generators saw) is their match;
- each piece is joined with its best match in the other tile when the match is at least
  ``min_overlap`` AND they are each other's best (mutual best: one large piece is never
  chained to two different objects of the neighbour);
- joins are transitive over tiles (an object over four tiles is one instance).

Each instance's mask is the union of its pieces, each cut to its own tile's core: the cores
tile the image without overlap, so no pixel is counted twice, and every pixel of the result
was seen by a generator with at least ``halo`` pixels of context around the core. A piece with
no pixel in its own core is dropped: the tile whose core it lies in sees it with context (the
piece is what a halo shows of an object centred elsewhere). Its score is the mean of its
pieces' scores weighted by their core areas.

micro-sam's ``TiledAutomaticMaskGenerator`` keeps each tile's instances and stitches the
label images at the tile borders (``elf.segmentation.stitching``); this rule works on the
instances themselves, so a crossing object keeps its own score and mask, and the result can
be painted (:func:`paint`) or written as COCO records alike.

Standard library and numpy only: shipped with the everything model.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..tiles import Block, TileGrid

DEFAULT_MIN_OVERLAP = 0.5  # IoU inside the shared band: the same object seen twice


@dataclasses.dataclass(frozen=True)
class Piece:
    """One instance the generator found on one tile's outer block.

    Attributes:
        tile: the tile's id in its :class:`TileGrid`.
        offset: (row, column) of ``mask``'s first pixel in the full image.
        mask: bool [rows, cols], the instance's bounding crop.
        score: the generator's predicted IoU.
    """

    tile: int
    offset: tuple[int, int]
    mask: np.ndarray
    score: float

    @property
    def block(self) -> Block:
        """The crop as a block of the full image."""
        end = (self.offset[0] + self.mask.shape[0], self.offset[1] + self.mask.shape[1])
        return Block(tuple(self.offset), end)


@dataclasses.dataclass(frozen=True)
class Stitched:
    """One instance of the whole image.

    Attributes:
        offset: (row, column) of ``mask``'s first pixel in the full image.
        mask: bool [rows, cols], cropped to the instance's bounding box.
        score: the pieces' scores, weighted by their core areas.
        pieces: indices of the pieces joined into it (into :func:`stitch`'s input).
    """

    offset: tuple[int, int]
    mask: np.ndarray
    score: float
    pieces: tuple[int, ...]

    @property
    def area(self) -> int:
        return int(self.mask.sum())


def stitch(
    grid: TileGrid, pieces: list[Piece], *, min_overlap: float = DEFAULT_MIN_OVERLAP
) -> list[Stitched]:
    """The instances of the whole image from the pieces found on each tile (module doc).

    Returns:
        one :class:`Stitched` per object, by decreasing score (ties: first piece first).

    Raises:
        ValueError: ``min_overlap`` outside (0, 1], or a piece's tile outside the grid.
    """
    if not 0 < min_overlap <= 1:
        raise ValueError(f"min_overlap: got {min_overlap}, expected a value in (0, 1]")
    cores = [_in_block(p.mask, p.block, grid.core(p.tile)) for p in pieces]
    alive = [i for i, core in enumerate(cores) if core is not None and core[1].any()]
    parent = {i: i for i in alive}
    for i, j in _mutual_best(grid, pieces, alive, min_overlap):
        parent[_root(parent, i)] = _root(parent, j)
    groups: dict[int, list[int]] = {}
    for i in alive:
        groups.setdefault(_root(parent, i), []).append(i)
    found = [_joined(members, cores, pieces) for members in groups.values()]
    found.sort(key=lambda s: (-s.score, s.pieces[0]))
    return found


def paint(instances: list[Stitched], block: Block, only: list[int] | None = None) -> np.ndarray:
    """The uint32 label image of ``block`` (0 background, instance ``k`` labelled ``k + 1``):
    larger instances first, so a smaller one lying on a larger one stays visible (as the
    official generators' masks are painted by micro-sam and napari). Only ``block`` is
    allocated, so a label image of any size is written block by block; ``only`` names the
    instances that may touch it (None: all of them are looked at)."""
    labels = np.zeros(block.shape, np.uint32)
    chosen = range(len(instances)) if only is None else only
    order = sorted(chosen, key=lambda k: (-instances[k].area, k))
    for k in order:
        inst = instances[k]
        where = _in_block(inst.mask, _block_of(inst), block)
        if where is not None:
            region, mask = where
            labels[region.slices_in(block)][mask] = k + 1
    return labels


def _mutual_best(grid, pieces, alive, min_overlap):
    """Pairs (i, j) of pieces in neighbouring tiles that are each other's best match."""
    by_tile: dict[int, list[int]] = {}
    for i in alive:
        by_tile.setdefault(pieces[i].tile, []).append(i)
    pairs = []
    tiles = sorted(by_tile)
    for a, t in enumerate(tiles):
        for u in tiles[a + 1 :]:
            band = grid.outer(t).intersect(grid.outer(u))
            if band is None:
                continue
            iou = _ious([pieces[i] for i in by_tile[t]], [pieces[j] for j in by_tile[u]], band)
            if iou.size == 0:
                continue
            best_u, best_t = iou.argmax(axis=1), iou.argmax(axis=0)
            for row, col in enumerate(best_u):
                if best_t[col] == row and iou[row, col] >= min_overlap:
                    pairs.append((by_tile[t][row], by_tile[u][col]))
    return pairs


def _ious(left: list[Piece], right: list[Piece], band: Block) -> np.ndarray:
    """IoU inside ``band`` of every piece of ``left`` with every piece of ``right``."""
    cut_left = [_in_block(p.mask, p.block, band) for p in left]
    cut_right = [_in_block(p.mask, p.block, band) for p in right]
    iou = np.zeros((len(left), len(right)))
    for r, a in enumerate(cut_left):
        if a is None:
            continue
        for c, b in enumerate(cut_right):
            if b is None or a[0].intersect(b[0]) is None:
                continue
            inter = np.logical_and(_on(a, band), _on(b, band)).sum()
            union = a[1].sum() + b[1].sum() - inter
            iou[r, c] = inter / union if union else 0.0
    return iou


def _joined(members, cores, pieces) -> Stitched:
    """The union of ``members``' core parts, as one instance."""
    parts = [cores[i] for i in members]
    begin = tuple(min(p[0].begin[axis] for p in parts) for axis in range(2))
    end = tuple(max(p[0].end[axis] for p in parts) for axis in range(2))
    whole = Block(begin, end)
    mask = np.zeros(whole.shape, bool)
    weights = []
    for region, part in parts:
        mask[region.slices_in(whole)] |= part
        weights.append(int(part.sum()))
    scores = np.array([pieces[i].score for i in members], np.float64)
    score = float(np.average(scores, weights=weights))
    return _tight(whole, mask, score, tuple(sorted(members)))


def _tight(block: Block, mask: np.ndarray, score: float, members) -> Stitched:
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    r0, r1, c0, c1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    offset = (block.begin[0] + int(r0), block.begin[1] + int(c0))
    return Stitched(offset, mask[r0:r1, c0:c1].copy(), score, members)


def _in_block(mask: np.ndarray, where: Block, block: Block):
    """``(region, mask cut to region)``: the part of a mask placed at ``where`` inside
    ``block``, or None when they do not overlap."""
    region = where.intersect(block)
    if region is None:
        return None
    return region, mask[region.slices_in(where)]


def _on(cut, band: Block) -> np.ndarray:
    """A cut mask (region, mask) placed on the whole of ``band``."""
    region, mask = cut
    full = np.zeros(band.shape, bool)
    full[region.slices_in(band)] = mask
    return full


def _block_of(inst: Stitched) -> Block:
    off = inst.offset
    return Block(tuple(off), (off[0] + inst.mask.shape[0], off[1] + inst.mask.shape[1]))


def _root(parent: dict[int, int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i
