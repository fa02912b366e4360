"""Tiled segment-everything: pieces of one object in several tiles become one instance.

Each test builds what the generator would answer on every tile's outer block for a known
label image (each object cut to the block it was seen in), so the expected result is exact:
the object itself, once.
"""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.serving.everything.stitch import Piece, paint, stitch
from triton_sam.serving.tiles import Block, TileGrid

GRID = TileGrid((200, 200), (100, 100), (20, 20))  # 2 x 2 tiles, outer blocks up to 140 px


def disk(shape, centre, radius):
    rows, cols = np.ogrid[: shape[0], : shape[1]]
    return (rows - centre[0]) ** 2 + (cols - centre[1]) ** 2 <= radius**2


def seen_by_tiles(objects, grid=GRID, scores=None):
    """What each tile's generator answers: every object cut to the tile's outer block."""
    pieces = []
    for tile in range(len(grid)):
        outer = grid.outer(tile)
        for k, whole in enumerate(objects):
            part = whole[outer.slices()]
            if not part.any():
                continue
            rows, cols = np.flatnonzero(part.any(1)), np.flatnonzero(part.any(0))
            crop = part[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
            offset = (outer.begin[0] + int(rows[0]), outer.begin[1] + int(cols[0]))
            score = 0.9 if scores is None else scores[k][tile]
            pieces.append(Piece(tile, offset, crop, score))
    return pieces


def placed(instance, shape=GRID.shape):
    full = np.zeros(shape, bool)
    r, c = instance.offset
    full[r : r + instance.mask.shape[0], c : c + instance.mask.shape[1]] = instance.mask
    return full


def test_an_object_over_four_tiles_is_one_instance_equal_to_it():
    whole = disk(GRID.shape, (100, 100), 45)
    found = stitch(GRID, seen_by_tiles([whole]))
    assert len(found) == 1
    assert np.array_equal(placed(found[0]), whole)
    assert found[0].pieces == (0, 1, 2, 3)


def test_neighbours_across_an_edge_stay_two_instances():
    left = disk(GRID.shape, (50, 85), 12)  # crosses into tile 1's halo only
    right = disk(GRID.shape, (50, 115), 12)  # crosses into tile 0's halo only
    found = stitch(GRID, seen_by_tiles([left, right]))
    assert len(found) == 2
    masks = [placed(f) for f in found]
    assert sum(np.array_equal(m, left) for m in masks) == 1
    assert sum(np.array_equal(m, right) for m in masks) == 1


def test_a_piece_seen_only_in_a_halo_is_left_to_the_tile_that_holds_it():
    inside = disk(GRID.shape, (50, 110), 5)  # in tile 1's core, in tile 0's halo
    pieces = seen_by_tiles([inside])
    assert {p.tile for p in pieces} == {0, 1}
    only_tile_0 = [p for p in pieces if p.tile == 0]
    assert stitch(GRID, only_tile_0) == []  # tile 0 has none of it in its core
    found = stitch(GRID, pieces)
    assert len(found) == 1 and np.array_equal(placed(found[0]), inside)


def test_scores_are_weighted_by_the_core_area_of_each_piece():
    whole = np.zeros(GRID.shape, bool)
    whole[40:60, 60:130] = True  # 40 columns in tile 0's core, 30 in tile 1's
    scores = [{0: 0.8, 1: 0.6}]
    found = stitch(GRID, seen_by_tiles([whole], scores=scores))
    assert len(found) == 1
    # by core area (40 : 30), not by what each tile saw with its halo (60 : 50)
    assert found[0].score == pytest.approx((0.8 * 40 + 0.6 * 30) / 70)


def test_a_best_match_must_be_mutual_and_above_the_overlap():
    whole = disk(GRID.shape, (50, 100), 15)
    pieces = seen_by_tiles([whole])
    assert len(stitch(GRID, pieces, min_overlap=0.5)) == 1
    # a different object in tile 1 where tile 0 saw this one: no join
    other = disk(GRID.shape, (50, 108), 6)
    swapped = [p for p in pieces if p.tile == 0] + [
        p for p in seen_by_tiles([other]) if p.tile == 1
    ]
    assert len(stitch(GRID, swapped, min_overlap=0.5)) == 2


def test_paint_labels_a_block_and_keeps_small_instances_on_top():
    big = np.zeros(GRID.shape, bool)
    big[10:190, 10:190] = True
    small = disk(GRID.shape, (100, 100), 10)
    found = stitch(GRID, seen_by_tiles([big, small]))
    assert len(found) == 2
    labels = paint(found, Block((0, 0), GRID.shape))
    small_label = labels[100, 100]
    assert small_label and labels[15, 15] and small_label != labels[15, 15]
    assert (labels == small_label).sum() == small.sum()
    part = paint(found, Block((90, 90), (110, 130)))
    assert np.array_equal(part, labels[90:110, 90:130])


def test_min_overlap_outside_its_range_is_refused():
    with pytest.raises(ValueError, match="min_overlap"):
        stitch(GRID, [], min_overlap=0)
