"""``tile_minmax`` against micro-sam itself: bit for bit, every dtype and channel count.

test_datasets_pixels.py checks the same arithmetic on hand-computed arrays without
micro-sam; this file runs micro-sam 1.8's own ``micro_sam.util._to_image`` (what it applies
to each tile before embedding it), installed beside the venv by ``make micro-sam``
(``tests/micro_sam_support.py`` puts it on the path).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from micro_sam_support import micro_sam

from triton_sam.serving.datasets.pixels import Mapping, to_rgb

micro_sam_util = micro_sam().util  # micro-sam's folder on sys.path (it is not in the venv)

RNG = np.random.default_rng(31)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int16, np.float32, np.float64])
@pytest.mark.parametrize("channels", [None, 1, 2, 3, 4])
def test_tile_minmax_equals_micro_sams_to_image(dtype, channels):
    shape = (37, 53) if channels is None else (37, 53, channels)
    if np.dtype(dtype).kind == "f":
        block = (RNG.standard_normal(shape) * 1000).astype(dtype)
    else:
        info = np.iinfo(dtype)
        block = RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # micro-sam warns that it keeps 3 of 4 channels
        expected = micro_sam_util._to_image(block)
    np.testing.assert_array_equal(to_rgb(block, Mapping("tile_minmax")), expected)


def test_tile_minmax_equals_micro_sam_on_small_ranges():
    # where micro-sam's 1e-7 guard shows: max 1 maps to 254, not 255
    for values in ([0, 1], [0.0, 1e-3], [5, 5], [0, 2, 255]):
        block = np.array(
            [values] * 3, dtype=np.float32 if isinstance(values[0], float) else np.uint8
        )
        expected = micro_sam_util._to_image(block)
        np.testing.assert_array_equal(to_rgb(block, Mapping("tile_minmax")), expected)
