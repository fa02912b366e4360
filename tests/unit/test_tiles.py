"""The tile grid and the prompt-to-tile rules of large images (serving/tiles.py).

The expected blocks are computed by hand from micro-sam's rule
(``micro_sam/prompt_based_segmentation.py::_points_to_tile`` on the grid of
``bioimage_cpp.utils.Blocking``, as ``micro_sam/util.py::_compute_tiled_features_2d`` embeds
it). Those packages are not in the lock yet; the parity tests of tiled masks will run
micro-sam itself.
"""

from __future__ import annotations

import numpy as np
import pytest

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
