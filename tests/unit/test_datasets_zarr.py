"""zarr v2/v3 and OME-Zarr readers (serving/datasets/zarr_source.py) on stores written here.

Arrays and groups of both zarr formats, OME-Zarr 0.4 (zarr v2) and 0.5 (zarr v3) multiscale
images with their axes (time squeezed, channels moved last), levels, z reads, and what is
refused (a group without a key, a key naming nothing, a time series, unknown axes).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import zarr

from triton_sam.serving.bounds import RequestError
from triton_sam.serving.datasets import open_source

RNG = np.random.default_rng(31)


def _array(group_or_path, data, chunks, *, name=None, zarr_format=2):
    if name is None:
        array = zarr.create_array(
            store=str(group_or_path), shape=data.shape, chunks=chunks, dtype=data.dtype,
            zarr_format=zarr_format,
        )  # fmt: skip
    else:
        array = group_or_path.create_array(name, shape=data.shape, chunks=chunks, dtype=data.dtype)
    array[...] = data
    return array


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize(
    ("shape", "chunks", "axes"),
    [
        ((130, 97), (32, 40), "yx"),
        ((130, 97, 3), (64, 64, 3), "yxc"),
        ((6, 70, 50), (2, 32, 32), "zyx"),
        ((4, 40, 30, 2), (1, 16, 16, 2), "zyxc"),
    ],
)
def test_an_array_reads_regions_as_numpy_slices(tmp_path, zarr_format, shape, chunks, axes):
    data = RNG.integers(0, 4000, shape).astype(np.uint16)
    _array(tmp_path / "a.zarr", data, chunks, zarr_format=zarr_format)
    with open_source(tmp_path / "a.zarr") as source:
        assert (source.axes, source.shape, source.dtype) == (axes, shape, np.uint16)
        volume = data if axes[0] == "z" else data[None]
        for z in range(volume.shape[0]):
            block = source.read(slice(3, 29), slice(11, 27), z=z if axes[0] == "z" else None)
            np.testing.assert_array_equal(block, volume[z, 3:29, 11:27])


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_group_needs_a_key_and_lists_its_arrays(tmp_path, zarr_format):
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=zarr_format)
    raw = RNG.random((40, 50), dtype=np.float32)
    _array(group, raw, (16, 16), name="volumes/raw")
    _array(group, raw > 0.5, (16, 16), name="volumes/mask")
    with pytest.raises(RequestError, match=r"request\.key: .* zarr group: name one of its arr"):
        open_source(tmp_path / "g.zarr")
    with pytest.raises(RequestError, match=r"'volumes/mask', 'volumes/raw'"):
        open_source(tmp_path / "g.zarr")
    with open_source(tmp_path / "g.zarr", key="volumes/raw") as source:
        np.testing.assert_array_equal(source.read(slice(0, 40), slice(10, 50)), raw[:, 10:])
    with pytest.raises(RequestError, match=r"request\.key: got 'volumes', a group"):
        open_source(tmp_path / "g.zarr", key="volumes")
    with pytest.raises(RequestError, match=r"request\.key: got 'nope', no such array"):
        open_source(tmp_path / "g.zarr", key="nope")
    with pytest.raises(RequestError, match=r"request\.dataset: got pixels of dtype bool"):
        open_source(tmp_path / "g.zarr", key="volumes/mask")
    with pytest.raises(RequestError, match=r"request\.key: got 'x', expected none: .* an array"):
        open_source(tmp_path / "g.zarr" / "volumes" / "raw", key="x")


@pytest.mark.parametrize("key", ["../g.zarr", "a//b", "/abs", "a/./b", "a\\b", "a\0b", ""])
def test_keys_that_could_leave_the_dataset_are_refused(tmp_path, key):
    _array(tmp_path / "a.zarr", np.zeros((4, 4), np.uint8), (4, 4))
    with pytest.raises(RequestError, match=r"^request\.key: got .* expected a path inside"):
        open_source(tmp_path / "a.zarr", key=key)


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [(np.complex64, (8, 8)), (np.bool_, (8, 8)), (np.uint8, (2, 2, 8, 8, 8))],
)
def test_arrays_without_intensities_or_with_too_many_dims_are_refused(tmp_path, dtype, shape):
    _array(tmp_path / "a.zarr", np.zeros(shape, dtype), shape)
    with pytest.raises(RequestError, match=r"^request\.dataset: got"):
        open_source(tmp_path / "a.zarr")


def _ome(path, levels, axes, *, zarr_format, chunks):
    """An OME-Zarr image: NGFF 0.4 on zarr v2, 0.5 (attributes under "ome") on zarr v3."""
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    for index, data in enumerate(levels):
        _array(group, data, chunks, name=str(index))
    multiscale = {
        "axes": axes,
        "datasets": [{"path": str(i), "coordinateTransformations": []} for i in range(len(levels))],
    }
    if zarr_format == 2:
        group.attrs["multiscales"] = [{"version": "0.4", **multiscale}]
    else:
        group.attrs["ome"] = {"version": "0.5", "multiscales": [multiscale]}
    return group


AXES_TCZYX = [
    {"name": "t", "type": "time"},
    {"name": "c", "type": "channel"},
    {"name": "z", "type": "space"},
    {"name": "y", "type": "space"},
    {"name": "x", "type": "space"},
]


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_an_ome_zarr_volume_squeezes_time_and_moves_channels_last(tmp_path, zarr_format):
    full = RNG.integers(0, 60000, (1, 2, 5, 64, 48)).astype(np.uint16)
    levels = [full, full[..., ::2, ::2], full[..., ::4, ::4]]
    _ome(
        tmp_path / "v.ome.zarr",
        levels,
        AXES_TCZYX,
        zarr_format=zarr_format,
        chunks=(1, 1, 2, 16, 16),
    )
    with open_source(tmp_path / "v.ome.zarr") as source:
        assert (source.axes, source.shape) == ("zyxc", (5, 64, 48, 2))
        assert source.levels == ((5, 64, 48, 2), (5, 32, 24, 2), (5, 16, 12, 2))
        for level, data in enumerate(levels):
            block = source.read(slice(1, 15), slice(2, 12), z=3, level=level)
            np.testing.assert_array_equal(block, np.moveaxis(data[0, :, 3, 1:15, 2:12], 0, -1))
    with open_source(tmp_path / "v.ome.zarr", key="1") as source:
        assert source.levels == ((5, 32, 24, 2), (5, 16, 12, 2))
    with pytest.raises(RequestError, match=r"request\.key: got 'raw', expected a pyramid level"):
        open_source(tmp_path / "v.ome.zarr", key="raw")


def test_an_ome_zarr_single_channel_image_by_axis_names(tmp_path):
    # NGFF 0.3 names the axes as strings; one channel is squeezed: a grey "yx" image
    image = RNG.integers(0, 255, (1, 40, 30)).astype(np.uint8)
    _ome(tmp_path / "i.zarr", [image], ["c", "y", "x"], zarr_format=2, chunks=(1, 16, 16))
    with open_source(tmp_path / "i.zarr") as source:
        assert (source.axes, source.shape) == ("yx", (40, 30))
        np.testing.assert_array_equal(source.read(slice(0, 40), slice(5, 30)), image[0, :, 5:])


def test_an_ome_zarr_image_inside_a_group_opens_by_key(tmp_path):
    # bioformats2raw's layout: the image is the group's child "0"
    image = RNG.integers(0, 255, (1, 1, 1, 20, 20)).astype(np.uint8)
    _ome(tmp_path / "b.zarr" / "0", [image], AXES_TCZYX, zarr_format=2, chunks=(1, 1, 1, 8, 8))
    zarr.open_group(str(tmp_path / "b.zarr"), mode="a", zarr_format=2)
    with pytest.raises(RequestError, match=r"its arrays and images: '0'"):
        open_source(tmp_path / "b.zarr")
    with open_source(tmp_path / "b.zarr", key="0") as source:
        assert (source.axes, source.shape) == ("yx", (20, 20))


@pytest.mark.parametrize(
    ("shape", "axes", "message"),
    [
        ((3, 1, 1, 8, 8), AXES_TCZYX, "a time series of 3 points"),
        ((8, 8), ["y", "w"], "OME-Zarr axis 'w' is none of t, c, z, y, x"),
        ((8, 8), ["y"], "expected one entry per dimension"),
        ((8, 8, 2), ["z", "y", "z"], "expected distinct letters"),
    ],
)
def test_ome_zarr_axes_that_are_not_one_image_are_refused(tmp_path, shape, axes, message):
    _ome(tmp_path / "o.zarr", [np.zeros(shape, np.uint8)], axes, zarr_format=2, chunks=shape)
    with pytest.raises(RequestError, match=rf"^request\.dataset: .*{message}"):
        open_source(tmp_path / "o.zarr")


def test_a_chunk_above_the_bound_is_refused_before_any_read(tmp_path):
    array = zarr.create_array(
        store=str(tmp_path / "big.zarr"), shape=(8192, 8192), chunks=(8192, 8192), dtype="uint8"
    )  # 64 MiB: at the bound, refused one pixel beyond it
    assert array.nchunks_initialized == 0
    open_source(tmp_path / "big.zarr").close()
    zarr.create_array(
        store=str(tmp_path / "bigger.zarr"), shape=(8193, 8192), chunks=(8193, 8192), dtype="uint8"
    )
    with pytest.raises(RequestError, match=r"64 MiB each; expected at most 64 MiB"):
        open_source(tmp_path / "bigger.zarr")


def test_a_sharded_v3_array_reads_and_bounds_its_inner_chunks(tmp_path):
    # OME-Zarr 0.5 writers shard: a read decodes the inner chunks it touches, so the bound
    # applies to them, not to the shard (here 128 MiB, inner chunks of 32 KiB)
    data = RNG.integers(0, 60000, (300, 200)).astype(np.uint16)
    array = zarr.create_array(
        store=str(tmp_path / "s.zarr"), shape=data.shape, chunks=(100, 100), shards=(300, 200),
        dtype=data.dtype,
    )  # fmt: skip
    array[...] = data
    with open_source(tmp_path / "s.zarr") as source:
        np.testing.assert_array_equal(
            source.read(slice(50, 290), slice(7, 199)), data[50:290, 7:199]
        )
    zarr.create_array(
        store=str(tmp_path / "big.zarr"), shape=(8192, 8192), chunks=(128, 128),
        shards=(8192, 8192), dtype="uint16",
    )  # fmt: skip
    open_source(tmp_path / "big.zarr").close()


def test_a_region_of_a_40000_px_array_decodes_only_its_chunks(tmp_path):
    """The zarr twin of the TIFF slide test: 40,000 x 40,000 uint8 chunked 512 (1.6 GB
    decoded), only the 3 x 3 chunks under the region stored. The read may allocate the
    region (1 MiB) and those chunks (256 KiB each); 16 MiB is 1% of the array."""
    array = zarr.create_array(
        store=str(tmp_path / "big.zarr"), shape=(40_000, 40_000), chunks=(512, 512), dtype="uint8"
    )
    rows, cols = slice(20_000, 21_024), slice(30_100, 31_124)
    array[rows, cols] = 7
    assert array.nchunks_initialized == 9
    tracemalloc.start()
    try:
        with open_source(tmp_path / "big.zarr") as source:
            block = source.read(rows, cols)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert block.shape == (1024, 1024) and (block == 7).all()
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"
