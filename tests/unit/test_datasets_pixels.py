"""The pixel mapping (serving/datasets/pixels.py) on hand-computed arrays.

Every expected value below is worked out by hand from the documented arithmetic (float32,
then ``np.rint`` for ``range``, truncation for ``tile_minmax`` as micro-sam), so a change of
rounding, order of operations or channel rule fails here.
"""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from triton_sam.serving.bounds import RequestError
from triton_sam.serving.datasets import open_source
from triton_sam.serving.datasets.pixels import (
    Mapping,
    mapping_json,
    parse_mapping,
    resolve_mapping,
    to_rgb,
)


def grey(values, dtype=np.uint16):
    return np.array([values], dtype=dtype)


def test_defaults_none_for_uint8_and_percentile_otherwise():
    assert parse_mapping(None, np.uint8) == Mapping("none")
    for dtype in (np.uint16, np.float32, np.int8):
        assert parse_mapping(None, dtype) == Mapping("percentile", low=1.0, high=99.0)
    assert parse_mapping({"kind": "percentile"}, "uint16") == Mapping("percentile", 1.0, 99.0)
    assert parse_mapping({"kind": "range", "min": 10, "max": 20.5}, "float32") == Mapping(
        "range", min=10.0, max=20.5
    )
    assert parse_mapping({"kind": "tile_minmax"}, "uint8") == Mapping("tile_minmax")


@pytest.mark.parametrize(
    ("value", "dtype", "message"),
    [
        ({"kind": "gamma"}, "uint8", "expected an object with kind in"),
        ("none", "uint8", "expected an object with kind in"),
        ({"kind": "none"}, "uint16", "none keeps uint8 pixels as they are; these are uint16"),
        ({"kind": "none", "min": 1}, "uint8", r"unknown keys \['min'\]"),
        ({"kind": "range", "min": 5, "max": 5}, "uint16", "expected min < max"),
        ({"kind": "range", "min": 6, "max": 5}, "uint16", "expected min < max"),
        # distinct as float64, equal as float32: the arithmetic's type
        ({"kind": "range", "min": 1e9, "max": 1e9 + 1}, "float32", "expected min < max"),
        ({"kind": "range", "max": 5}, "uint16", "min: got None, expected a finite number"),
        ({"kind": "range", "min": float("nan"), "max": 5}, "uint16", "finite number"),
        ({"kind": "range", "min": True, "max": 5}, "uint16", "finite number"),
        ({"kind": "percentile", "low": 50, "high": 50}, "uint16", "0 <= low < high <= 100"),
        ({"kind": "percentile", "low": -1}, "uint16", "0 <= low < high <= 100"),
        ({"kind": "percentile", "high": 101}, "uint16", "0 <= low < high <= 100"),
    ],
)
def test_bad_mappings_are_refused_naming_the_field(value, dtype, message):
    with pytest.raises(RequestError, match=rf"^request\.mapping: .*{message}"):
        parse_mapping(value, dtype)


def test_range_is_float32_clipped_and_rounds_half_to_even():
    # (x - 0) / 510 * 255 = x / 2: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2 (half to even)
    rgb = to_rgb(grey([0, 1, 2, 3, 4, 5]), Mapping("range", min=0.0, max=510.0))
    assert rgb.dtype == np.uint8 and rgb.shape == (1, 6, 3)
    assert rgb[0, :, 0].tolist() == [0, 0, 1, 2, 2, 2]
    assert (rgb == rgb[..., :1]).all()  # grey replicated
    # below min -> 0, above max -> 255; 1000..3000: 1500 -> 63.75 -> 64, 2000 -> 127.5 -> 128
    rgb = to_rgb(grey([0, 1000, 1500, 2000, 3000, 65535]), Mapping("range", min=1000, max=3000))
    assert rgb[0, :, 0].tolist() == [0, 0, 64, 128, 255, 255]


def test_range_maps_nan_to_0_and_infinities_to_the_ends():
    block = grey([np.nan, np.inf, -np.inf, 0.5], np.float32)
    rgb = to_rgb(block, Mapping("range", min=0.0, max=1.0))
    assert rgb[0, :, 0].tolist() == [0, 255, 0, 128]


def test_tile_minmax_is_micro_sams_arithmetic():
    # float32: x - 0, / (400 + 1e-7) (= 400 in float32), * 255, truncated: 63.75 -> 63
    rgb = to_rgb(grey([0, 100, 200, 400]), Mapping("tile_minmax"))
    assert rgb[0, :, 0].tolist() == [0, 63, 127, 255] and (rgb == rgb[..., :1]).all()
    # a 0/1 mask: 1 / (1 + 1e-7) * 255 = 254.99997 in float32, truncated to 254
    assert to_rgb(grey([0, 1], np.uint8), Mapping("tile_minmax"))[0, :, 0].tolist() == [0, 254]
    # a constant block maps to 0 (0 / 1e-7)
    assert not to_rgb(grey([7, 7, 7]), Mapping("tile_minmax")).any()


def test_tile_minmax_stretches_each_channel_on_its_own():
    block = np.array([[[0, 10, 5], [4, 20, 5]]], np.uint16)  # 1 x 2 x 3
    rgb = to_rgb(block, Mapping("tile_minmax"))
    assert rgb.tolist() == [[[0, 0, 0], [255, 255, 0]]]


def test_channels_are_micro_sams_rule_for_every_kind():
    two = np.array([[[10, 20]]], np.uint8)
    four = np.array([[[1, 2, 3, 4]]], np.uint8)
    one = np.array([[[9]]], np.uint8)
    assert to_rgb(two, Mapping("none")).tolist() == [[[10, 20, 0]]]  # a zero third channel
    assert to_rgb(four, Mapping("none")).tolist() == [[[1, 2, 3]]]  # RGBA: alpha dropped
    assert to_rgb(one, Mapping("none")).tolist() == [[[9, 9, 9]]]
    assert to_rgb(two, Mapping("range", min=0, max=20)).tolist() == [[[128, 255, 0]]]


def test_none_keeps_uint8_and_returns_a_fresh_array():
    rgb = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    out = to_rgb(rgb, Mapping("none"))
    np.testing.assert_array_equal(out, rgb)
    assert not np.shares_memory(out, rgb)
    with pytest.raises(ValueError, match="none needs uint8"):
        to_rgb(rgb.astype(np.uint16), Mapping("none"))
    with pytest.raises(ValueError, match="resolved first"):
        to_rgb(rgb, Mapping("percentile", 1.0, 99.0))


def _tiff(path, data, **options):
    tifffile.imwrite(path, data, **options)
    return open_source(path)


def test_percentiles_of_a_small_image_use_every_pixel(tmp_path):
    image = np.arange(101 * 100, dtype=np.uint16).reshape(101, 100)  # 0..10099
    with _tiff(tmp_path / "i.tif", image) as source:
        resolved = resolve_mapping(Mapping("percentile", 1.0, 99.0), source, 20_000)
    # numpy's linear interpolation over 10,100 values: index 0.01 * 10099 = 100.99 (float64,
    # so equal to the last bits of its rounding)
    assert resolved.kind == "range"
    assert (resolved.min, resolved.max) == pytest.approx((100.99, 9998.01), rel=1e-14, abs=0)
    assert mapping_json(resolved) == {"kind": "range", "min": resolved.min, "max": resolved.max}


def test_percentiles_sample_the_coarsest_level(tmp_path):
    full = np.full((256, 256), 1000, np.uint16)
    coarse = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)  # what the sample must see
    with tifffile.TiffWriter(tmp_path / "p.tif") as writer:
        writer.write(full, subifds=1, tile=(64, 64))
        writer.write(coarse, subfiletype=1, tile=(64, 64))
    with open_source(tmp_path / "p.tif") as source:
        resolved = resolve_mapping(Mapping("percentile", 0.0, 100.0), source, 64 * 64)
    assert (resolved.min, resolved.max) == (0.0, 4095.0)


def test_percentiles_of_a_large_level_read_a_bounded_grid_of_patches(tmp_path):
    # 1024 x 1024, rows numbered: patches of 256 px, 4 of them (2 x 2) for 4 x 256^2 pixels,
    # at rows 0..255 and 768..1023: the sample's 0th and 100th percentiles are rows 0 and 1023
    image = np.repeat(np.arange(1024, dtype=np.uint16)[:, None], 1024, axis=1)
    with _tiff(tmp_path / "l.tif", image, tile=(256, 256)) as source:
        reads = []
        read = source.read
        source.read = lambda *a, **k: reads.append(a) or read(*a, **k)
        resolved = resolve_mapping(Mapping("percentile", 0.0, 100.0), source, 4 * 256 * 256)
    assert (resolved.min, resolved.max) == (0.0, 1023.0)
    assert len(reads) == 4 and {(r.stop - r.start, c.stop - c.start) for r, c, *_ in reads} == {
        (256, 256)
    }


def test_percentiles_of_a_volume_sample_one_slice(tmp_path):
    volume = np.stack([np.full((8, 8), z * 10, np.uint16) for z in range(5)])
    volume[2, 0, 0] = 100
    with _tiff(tmp_path / "v.tif", volume, metadata={"axes": "ZYX"}) as source:
        middle = resolve_mapping(Mapping("percentile", 0.0, 100.0), source, 1000)
        first = resolve_mapping(Mapping("percentile", 0.0, 100.0), source, 1000, z=0)
    assert (middle.min, middle.max) == (20.0, 100.0)  # slice 2, the middle one
    assert (first.min, first.max) == (0.0, 1.0)  # constant: max = min + 1


def test_other_kinds_resolve_to_themselves(tmp_path):
    with _tiff(tmp_path / "i.tif", np.zeros((4, 4), np.uint8)) as source:
        for mapping in (Mapping("none"), Mapping("tile_minmax"), Mapping("range", min=0, max=9)):
            assert resolve_mapping(mapping, source, 10) is mapping
    assert mapping_json(Mapping("none")) == {"kind": "none"}
    assert mapping_json(Mapping("percentile", 1.0, 99.0)) == {
        "kind": "percentile",
        "low": 1.0,
        "high": 99.0,
    }


def test_percentiles_ignore_nan_infinities_and_channels_sam_does_not_see(tmp_path):
    image = np.array([[np.nan, 1.0, 2.0, np.inf, -np.inf, 3.0]], np.float32)
    with _tiff(tmp_path / "f.tif", image) as source:
        resolved = resolve_mapping(Mapping("percentile", 0.0, 100.0), source, 100)
    assert (resolved.min, resolved.max) == (1.0, 3.0)
    with _tiff(tmp_path / "n.tif", np.full((2, 2), np.nan, np.float32)) as source:
        resolved = resolve_mapping(Mapping("percentile", 1.0, 99.0), source, 100)
    assert (resolved.min, resolved.max) == (0.0, 1.0)
    rgba = np.zeros((4, 4, 4), np.uint16)
    rgba[..., :3] = 100
    rgba[0, 0, :3] = 200
    rgba[..., 3] = 65535  # alpha: not one of the channels SAM sees
    with _tiff(tmp_path / "a.tif", rgba, photometric="rgb", extrasamples=["unassalpha"]) as source:
        assert source.axes == "yxc"
        resolved = resolve_mapping(Mapping("percentile", 0.0, 100.0), source, 100)
    assert (resolved.min, resolved.max) == (100.0, 200.0)
