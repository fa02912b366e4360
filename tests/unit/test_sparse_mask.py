"""SparseMask: a large image's mask as its crop and offset, against hand-computed masks."""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam import SparseMask
from triton_sam.client.sparse_mask import MAX_DENSE_PIXELS
from triton_sam.errors import InputValidationError
from triton_sam.serving import masks

# The crop [[1, 0], [1, 1]]: column-major pixels 1, 1, 0, 1 -> runs 0, 2, 1, 1 (COCO starts
# with background). Compressed: 0 -> "0", 2 -> "2", 1 -> "1", then the fourth run as its
# delta to the second, 1 - 2 = -1 -> 5 bits 0b11111 = 31, + 48 = "O".
L_COUNTS = "021O"
L_CROP = np.array([[1, 0], [1, 1]], bool)


def _mask(offset=(2, 3), size=(2, 2), counts=L_COUNTS, area=3) -> SparseMask:
    return SparseMask(offset, size, counts, (3.0, 2.0, 4.0, 3.0), 0.9, area, False)


def test_the_crop_decodes_the_hand_computed_rle():
    assert masks.encode_rle(L_CROP).decode() == L_COUNTS  # the hand computation above
    np.testing.assert_array_equal(_mask().crop(), L_CROP)


def test_dense_places_the_crop_at_its_offset():
    dense = _mask().dense((5, 6))
    assert dense.shape == (5, 6) and dense.dtype == bool
    assert sorted(zip(*np.nonzero(dense), strict=True)) == [(2, 3), (3, 3), (3, 4)]


def test_paste_into_writes_the_value_and_keeps_the_other_pixels():
    labels = np.full((5, 6), 7, np.uint16)
    labels[2, 4] = 9  # inside the crop's box but outside the mask: kept
    _mask().paste_into(labels, 3)
    assert labels[2, 3] == labels[3, 3] == labels[3, 4] == 3
    assert labels[2, 4] == 9 and (labels == 7).sum() == 30 - 4


class RegionRecorder:
    """A zarr-like array: numpy underneath, each region read and written recorded."""

    def __init__(self, shape):
        self.data = np.zeros(shape, bool)
        self.shape = self.data.shape
        self.seen: list[tuple[str, object]] = []

    def __getitem__(self, key):
        self.seen.append(("get", key))
        return self.data[key]

    def __setitem__(self, key, value):
        self.seen.append(("set", key))
        self.data[key] = value


def test_paste_into_touches_only_the_crop_region():
    array = RegionRecorder((50, 60))
    _mask().paste_into(array)
    region = (slice(2, 4), slice(3, 5))
    assert array.seen == [("get", region), ("set", region)]
    assert array.data.sum() == 3


def test_paste_into_refuses_an_array_that_does_not_hold_the_crop():
    with pytest.raises(InputValidationError, match="array: shape \\(3, 6\\)"):
        _mask().paste_into(np.zeros((3, 6), bool))


def test_dense_refuses_past_its_bound_and_names_the_way_out():
    side = int(MAX_DENSE_PIXELS**0.5)
    assert _mask().dense((side, side)).sum() == 3  # at the bound: made
    with pytest.raises(InputValidationError, match="image_shape: .*crop\\(\\).*paste_into"):
        _mask().dense((20_000, 20_000))


def test_an_empty_mask_is_an_empty_crop():
    empty = _mask(offset=(0, 0), size=(0, 0), counts="", area=0)
    assert empty.crop().shape == (0, 0)
    assert not empty.dense((4, 4)).any()
    assert (
        empty.to_coco((4, 4))["segmentation"]["counts"]
        == masks.encode_rle(np.zeros((4, 4), bool)).decode()
    )


def test_to_coco_is_the_full_images_rle_for_any_placement():
    rng = np.random.default_rng(0)
    for _ in range(300):
        rows, cols = (int(v) for v in rng.integers(1, 9, 2))
        r0, c0 = int(rng.integers(0, rows)), int(rng.integers(0, cols))
        h, w = int(rng.integers(1, rows - r0 + 1)), int(rng.integers(1, cols - c0 + 1))
        crop = rng.random((h, w)) < rng.random()
        full = np.zeros((rows, cols), bool)
        full[r0 : r0 + h, c0 : c0 + w] = crop
        mask = SparseMask(
            (r0, c0), (h, w), masks.encode_rle(crop).decode(), (0, 0, 0, 0), 1.0, 0, False
        )
        coco = mask.to_coco((rows, cols))
        assert coco["segmentation"] == {
            "size": [rows, cols],
            "counts": masks.encode_rle(full).decode(),
        }, (rows, cols, r0, c0, crop)
        assert coco["bbox"] == [c0, r0, w, h]


def test_the_wire_json_round_trips_and_a_missing_field_is_named():
    mask = _mask()
    assert SparseMask.from_json(mask.to_json()) == mask
    wire = mask.to_json()
    del wire["cut"]
    with pytest.raises(InputValidationError, match="masks: .*'cut'"):
        SparseMask.from_json(wire)
