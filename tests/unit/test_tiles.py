"""The tile grid and the prompt-to-tile rules of large images (serving/tiles.py).

The expected blocks are computed by hand from micro-sam's rule
(``micro_sam/prompt_based_segmentation.py::_points_to_tile`` on the grid of
``bioimage_cpp.utils.Blocking``, as ``micro_sam/util.py::_compute_tiled_features_2d`` embeds
it), then checked against micro-sam 1.8.14 itself (``make micro-sam``; tests/micro_sam_support.py)
on seeded random grids and prompts.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from micro_sam_support import micro_sam

from triton_sam.serving.tiles import Block, TileGrid, window_around


def test_blocks_of_a_grid_cut_at_the_image_edge():
    grid = TileGrid((900, 1300), (512, 512), (64, 64))
    assert len(grid) == 6 and grid.blocks_per_axis == (2, 3)
    assert grid.core(2) == Block((0, 1024), (512, 1300))
    assert grid.outer(0) == Block((0, 0), (576, 576))
    assert grid.outer(4) == Block((448, 448), (900, 1088))
    assert grid.outer(5).shape == (452, 340)
    with pytest.raises(IndexError, match="tile_id"):
        grid.core(6)


def test_cores_partition_the_image_and_outers_hold_them():
    grid = TileGrid((517, 301), (128, 96), (16, 7))
    seen = np.zeros(grid.shape, np.int32)
    for i in range(len(grid)):
        core, outer = grid.core(i), grid.outer(i)
        seen[core.slices()] += 1
        assert all(o <= c for o, c in zip(outer.begin, core.begin, strict=True))
        assert all(o >= c for o, c in zip(outer.end, core.end, strict=True))
        last = (core.end[0] - 1, core.end[1] - 1)
        assert grid.tile_at(*core.begin) == i and grid.tile_at(*last) == i
    assert (seen == 1).all()


def test_the_tile_of_the_points_centre_and_the_points_micro_sam_drops():
    grid = TileGrid((900, 1300), (512, 512), (64, 64))
    tile_id, kept = grid.tile_of(np.array([[300, 700], [310, 1100]]))
    assert tile_id == 1  # centre (305, 900)
    assert kept.tolist() == [True, False]  # column 1100 is past the outer block's 1088
    assert grid.tile_of(np.array([[2.5, 2.5]]))[0] == 0
    with pytest.raises(ValueError, match="outside the image"):
        grid.tile_of(np.array([[900, 0]]))
    with pytest.raises(ValueError, match="at least one point"):
        grid.tile_of(np.zeros((0, 2)))


def test_tiles_touching_a_region():
    grid = TileGrid((900, 1300), (512, 512))
    assert grid.tiles_touching(Block((0, 0), (1, 1))) == [0]
    assert grid.tiles_touching(Block((500, 500), (520, 1030))) == [0, 1, 2, 3, 4, 5]
    assert grid.tiles_touching(Block((600, 0), (900, 512))) == [3]


def test_the_window_is_centred_on_the_prompts_and_kept_inside_the_image():
    # centred on 500 it would begin at -12: shifted into the image
    assert window_around(np.array([[500, 500]]), (2000, 3000), (1024, 1024)) == Block(
        (0, 0), (1024, 1024)
    )
    window = window_around(np.array([[1000, 1500], [1100, 1700]]), (2000, 3000), (1024, 1024))
    assert window == Block((538, 1088), (1562, 2112))
    assert window_around(np.array([[10, 10]]), (300, 5000), (1024, 1024)).shape == (300, 1024)
    assert window_around(np.array([[1999, 2999]]), (2000, 3000), (1024, 1024)).end == (2000, 3000)


@pytest.mark.parametrize("bad", [dict(shape=(0, 5)), dict(tile=(5,)), dict(halo=(-1, 0))])
def test_bad_grids_are_refused_naming_the_field(bad):
    args = dict(shape=(10, 10), tile=(4, 4), halo=(0, 0)) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        TileGrid(**args)


def random_grids(rng: np.random.Generator, count: int):
    """Seeded grids: images from 1 px to ~3 tiles a side, tiles from 1 px, halos from 0 (also
    past the tile), so the cut last row/column and the clipped halos all come up."""
    for _ in range(count):
        tile = tuple(int(t) for t in rng.integers(1, 300, 2))
        shape = tuple(int(rng.integers(1, 3 * t + 2)) for t in tile)
        halo = tuple(int(rng.integers(0, t + 40)) for t in tile)
        yield TileGrid(shape, tile, halo)


def test_the_grid_is_micro_sams_blocking():
    blocking = micro_sam().Blocking
    mismatches = []
    for grid in random_grids(np.random.default_rng(31), 300):
        theirs = blocking([0, 0], list(grid.shape), list(grid.tile))
        assert theirs.number_of_blocks == len(grid)
        for tile_id in range(len(grid)):
            core = theirs.get_block(tile_id)
            outer = theirs.get_block_with_halo(tile_id, list(grid.halo)).outer_block
            ours = (grid.core(tile_id), grid.outer(tile_id))
            expected = (
                Block(tuple(core.begin), tuple(core.end)),
                Block(tuple(outer.begin), tuple(outer.end)),
            )
            if ours != expected:
                mismatches.append((grid, tile_id, ours, expected))
    assert mismatches == []


def test_tile_of_is_micro_sams_points_to_tile():
    """micro-sam's ``_points_to_tile`` picks the tile and drops the points outside its outer
    block (warning); ``tile_of`` must pick the same tile and keep the same points, for
    integer and fractional clicks, one to five of them, anywhere in the image. A centre that
    rounds onto the image's far edge is refused by both (micro-sam: IndexError)."""
    points_to_tile = micro_sam().prompts._points_to_tile
    rng = np.random.default_rng(1031)
    mismatches, dropped, refused = [], 0, 0
    for grid in random_grids(rng, 400):
        n = int(rng.integers(1, 6))
        rc = rng.uniform(0, grid.shape, (n, 2))
        rc = np.floor(rc) if rng.random() < 0.5 else rc
        labels = rng.integers(0, 2, n)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "points were not in the tile"
                tile_id, block, (kept_rc, kept_labels) = points_to_tile(
                    (rc, labels), list(grid.shape), list(grid.tile), list(grid.halo)
                )
        except IndexError:  # "coordinates must lie inside the half-open ROI"
            refused += 1
            with pytest.raises(ValueError, match="outside the image"):
                grid.tile_of(rc)
            continue
        ours_id, kept = grid.tile_of(rc)
        outer = grid.outer(ours_id)
        same = (
            ours_id == tile_id
            and outer == Block(tuple(block.begin), tuple(block.end))
            and np.array_equal(rc[kept] - outer.begin, kept_rc)
            and np.array_equal(labels[kept], kept_labels)
        )
        dropped += int((~kept).sum())
        if not same:
            mismatches.append((grid, rc.tolist(), tile_id, ours_id))
    assert mismatches == []
    # the dropping rule and the refusal were exercised, not only the choice of tile
    assert dropped > 0 and 0 < refused < 40, (dropped, refused)
