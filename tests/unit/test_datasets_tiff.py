"""TIFF readers (serving/datasets/tiff_source.py) on files the tests write with tifffile.

Tiled and striped, compressed (zlib, LZW, JPEG through imagecodecs) and not (memory-mapped),
BigTIFF, OME-TIFF volumes, pyramidal slides; each region read equals numpy slicing of the
written array, and a region of a 40,000 px slide is read without allocating the slide.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
import tifffile

from triton_sam.serving.bounds import RequestError
from triton_sam.serving.datasets import MAX_CHUNK_BYTES, open_source

RNG = np.random.default_rng(31)


def _image(shape, dtype="uint16"):
    return RNG.integers(0, np.iinfo(dtype).max, shape, dtype=dtype)


@pytest.mark.parametrize(
    "options",
    [
        {"tile": (64, 64), "compression": "zlib"},
        {"tile": (32, 48), "compression": "lzw"},
        {"rowsperstrip": 16, "compression": "zlib"},
        {"rowsperstrip": 7, "compression": "lzw"},
        {},  # uncompressed, one strip: memory-mapped
        {"bigtiff": True, "tile": (64, 64), "compression": "zstd"},
        {"bigtiff": True},
    ],
    ids=["tiled-zlib", "tiled-lzw", "striped-zlib", "striped-lzw", "plain", "bigtiff", "bigplain"],
)
def test_a_region_read_equals_numpy_slicing(tmp_path, options):
    image = _image((300, 200))
    path = tmp_path / "image.tif"
    tifffile.imwrite(path, image, **options)
    with open_source(path) as source:
        assert (source.axes, source.shape, source.dtype) == ("yx", (300, 200), np.uint16)
        assert source.levels == ((300, 200),)
        block = source.read(slice(37, 201), slice(5, 170))
    np.testing.assert_array_equal(block, image[37:201, 5:170])
    assert block.flags.c_contiguous and block.flags.writeable


def test_rgb_is_yxc_and_big_endian_reads_native(tmp_path):
    rgb = _image((96, 80, 3), "uint8")
    tifffile.imwrite(tmp_path / "rgb.tif", rgb, photometric="rgb", tile=(32, 32))
    grey = _image((50, 40)).astype(">u2")
    tifffile.imwrite(tmp_path / "be.tif", grey, byteorder=">")
    with open_source(tmp_path / "rgb.tif") as source:
        assert (source.axes, source.shape) == ("yxc", (96, 80, 3))
        np.testing.assert_array_equal(source.read(slice(10, 90), slice(3, 77)), rgb[10:90, 3:77])
    with open_source(tmp_path / "be.tif") as source:
        block = source.read(slice(0, 50), slice(0, 40))
    assert block.dtype == np.dtype("=u2")
    np.testing.assert_array_equal(block, grey)


def test_jpeg_tiles_decode_through_imagecodecs(tmp_path):
    rgb = np.full((128, 128, 3), 120, np.uint8)
    tifffile.imwrite(tmp_path / "j.tif", rgb, photometric="rgb", tile=(64, 64), compression="jpeg")
    with open_source(tmp_path / "j.tif") as source:
        block = source.read(slice(60, 70), slice(60, 70))
    # JPEG is lossy, but a flat image decodes to within one grey level of itself
    assert block.shape == (10, 10, 3) and np.abs(block.astype(int) - 120).max() <= 1


@pytest.mark.parametrize("compression", [None, "zlib"])
def test_an_ome_tiff_volume_reads_slice_by_slice(tmp_path, compression):
    volume = _image((5, 60, 70))
    path = tmp_path / "v.ome.tif"
    tifffile.imwrite(path, volume, metadata={"axes": "ZYX"}, compression=compression)
    with open_source(path) as source:
        assert (source.axes, source.shape) == ("zyx", (5, 60, 70))
        for z in (0, 3, 4):
            np.testing.assert_array_equal(
                source.read(slice(10, 50), slice(0, 70), z=z), volume[z, 10:50]
            )
        with pytest.raises(RequestError, match=r"request\.z: got 5, expected a slice in \[0, 5\)"):
            source.read(slice(0, 1), slice(0, 1), z=5)
        with pytest.raises(RequestError, match=r"request\.z: got None"):
            source.read(slice(0, 1), slice(0, 1))
        # numpy integers (a grid's arithmetic) are integers; bools and floats are not
        block = source.read(slice(np.int64(2), np.int32(9)), slice(0, np.int64(70)), z=np.int64(1))
        np.testing.assert_array_equal(block, volume[1, 2:9])
        with pytest.raises(RequestError, match=r"request\.z: got True"):
            source.read(slice(0, 1), slice(0, 1), z=True)
        with pytest.raises(RequestError, match=r"^region: rows: got"):
            source.read(slice(0.0, 1), slice(0, 1), z=0)


def test_an_ome_tiff_with_channels_first_reads_channels_last(tmp_path):
    image = _image((2, 40, 30))
    tifffile.imwrite(tmp_path / "c.ome.tif", image, metadata={"axes": "CYX"}, tile=(16, 16))
    with open_source(tmp_path / "c.ome.tif") as source:
        assert (source.axes, source.shape) == ("yxc", (40, 30, 2))
        block = source.read(slice(5, 25), slice(7, 30))
    np.testing.assert_array_equal(block, np.moveaxis(image, 0, -1)[5:25, 7:30])


def _pyramid(path, image, levels=3):
    with tifffile.TiffWriter(path) as writer:
        kwargs = {"tile": (32, 32), "compression": "zlib", "photometric": "rgb"}
        writer.write(image, subifds=levels - 1, **kwargs)
        for level in range(1, levels):
            writer.write(image[:: 2**level, :: 2**level], subfiletype=1, **kwargs)


def test_a_pyramidal_slide_has_its_levels_and_reads_each(tmp_path):
    image = _image((256, 192, 3), "uint8")
    _pyramid(tmp_path / "slide.tif", image)
    with open_source(tmp_path / "slide.tif") as source:
        assert source.levels == ((256, 192, 3), (128, 96, 3), (64, 48, 3))
        for level in range(3):
            coarse = image[:: 2**level, :: 2**level]
            block = source.read(slice(3, 60), slice(1, 40), level=level)
            np.testing.assert_array_equal(block, coarse[3:60, 1:40])
        with pytest.raises(RequestError, match=r"request\.level: got 3, expected 0\.\.2"):
            source.read(slice(0, 1), slice(0, 1), level=3)
    with open_source(tmp_path / "slide.tif", key="1") as source:  # a level as full resolution
        assert source.levels == ((128, 96, 3), (64, 48, 3))
    with pytest.raises(RequestError, match=r"request\.key: got '3', expected a pyramid level"):
        open_source(tmp_path / "slide.tif", key="3")


def test_regions_outside_the_image_are_refused(tmp_path):
    tifffile.imwrite(tmp_path / "i.tif", _image((30, 20)))
    with open_source(tmp_path / "i.tif") as source:
        for rows, cols in [
            (slice(0, 31), slice(0, 5)),
            (slice(-1, 5), slice(0, 5)),
            (slice(5, 5), slice(0, 5)),
            (slice(0, 5), slice(0, 21)),
            (slice(0, 10, 2), slice(0, 5)),
            (slice(None, 5), slice(0, 5)),
        ]:
            with pytest.raises(RequestError, match=r"^region: (rows|cols): got"):
                source.read(rows, cols)
        with pytest.raises(RequestError, match=r"request\.z: got 0, expected none"):
            source.read(slice(0, 5), slice(0, 5), z=0)


def test_a_file_of_one_huge_compressed_strip_is_refused(tmp_path):
    # 4100 x 4100 uint32 in one zlib strip: 64.1 MiB decoded by the smallest read
    side = 4100
    tifffile.imwrite(
        tmp_path / "strip.tif",
        (np.zeros((side, side), np.uint32) for _ in range(1)),
        shape=(side, side),
        dtype="uint32",
        rowsperstrip=side,
        compression="zstd",
    )
    assert side * side * 4 > MAX_CHUNK_BYTES
    with pytest.raises(RequestError, match=r"request\.dataset: got chunks .* re-save it tiled"):
        open_source(tmp_path / "strip.tif")


def test_a_region_of_a_40000_px_slide_does_not_allocate_the_slide(tmp_path):
    """40,000 x 40,000 uint8 (1.6 GB decoded), zero tiles of 512 px compressed with zstd
    (a 0.2 MB file). Opening it and reading a 1024 x 1024 region may allocate the region
    (1 MiB), the tiles it touches (at most 3 x 3 of 256 KiB each, decoded one by one) and
    tifffile's tile tables (6,241 offsets and byte counts); the bound, 16 MiB, is 1% of the
    slide: a reader that decoded the slide, a row of tiles (20 MiB) or a level would exceed
    it. tracemalloc sees numpy's and Python's allocations (imagecodecs decodes into numpy)."""
    side, tile = 40_000, 512
    count = math.ceil(side / tile) ** 2
    zeros = np.zeros((tile, tile), np.uint8)
    path = tmp_path / "slide.tif"
    tifffile.imwrite(
        path,
        (zeros for _ in range(count)),
        shape=(side, side),
        dtype="uint8",
        tile=(tile, tile),
        compression="zstd",
        compressionargs={"level": 1},
    )
    tracemalloc.start()
    try:
        with open_source(path) as source:
            block = source.read(slice(20_000, 21_024), slice(30_100, 31_124))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert source.shape == (side, side) and block.shape == (1024, 1024) and not block.any()
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_a_plain_page_stack_is_a_volume_and_a_time_series_is_refused(tmp_path):
    volume = _image((4, 20, 30))
    tifffile.imwrite(tmp_path / "stack.tif", volume, photometric="minisblack")
    assert tifffile.TiffFile(tmp_path / "stack.tif").series[0].axes[0] not in "ZYXSC"
    with open_source(tmp_path / "stack.tif") as source:
        assert (source.axes, source.shape) == ("zyx", (4, 20, 30))
        np.testing.assert_array_equal(
            source.read(slice(0, 20), slice(9, 30), z=2), volume[2, :, 9:]
        )
    tifffile.imwrite(tmp_path / "t.ome.tif", _image((2, 3, 8, 8)), metadata={"axes": "TZYX"})
    with pytest.raises(RequestError, match=r"got TIFF axes TZYX .* save one per file"):
        open_source(tmp_path / "t.ome.tif")
