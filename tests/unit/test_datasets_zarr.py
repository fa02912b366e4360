"""zarr v2/v3 and OME-Zarr readers (serving/datasets/zarr_source.py) on stores written here.

Arrays and groups of both zarr formats, OME-Zarr 0.4 (zarr v2) and 0.5 (zarr v3) multiscale
images with their axes (time squeezed, channels moved last), levels, z reads, and what is
refused (a group without a key, a key naming nothing, a time series, unknown axes).

The stores are written with tensorstore and plain JSON, as zarr-python writes them: the
tests run under the project venv (Python 3.11) and under the GPU container's lock
(requirements/lock-container.txt, Python 3.10), where zarr-python 3 does not install.
"""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

from triton_sam.serving.bounds import RequestError
from triton_sam.serving.datasets import open_source

RNG = np.random.default_rng(31)
V3_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}]


def _metadata(path, zarr_format, attributes=None):
    """A group's metadata file (and its attributes), as zarr-python writes it."""
    path.mkdir(parents=True, exist_ok=True)
    if zarr_format == 3:
        node = {"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}
        (path / "zarr.json").write_text(json.dumps(node))
        return
    (path / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    if attributes:
        (path / ".zattrs").write_text(json.dumps(attributes))


def _array(path, data, chunks, *, name=None, zarr_format=2, shards=None, write=True):
    """``data`` (only its shape and dtype when ``write`` is False) as a zarr array at
    ``path``, or at ``name`` inside the group ``path`` (the folders between become groups, as
    zarr-python's ``create_array(name)`` makes them); ``shards``: a sharded v3 array of
    ``chunks`` inner chunks."""
    path = Path(path)
    for part in (name or "").split("/")[:-1]:
        path = path / part
        _metadata(path, zarr_format)
    path = path / name.split("/")[-1] if name else path
    kvstore = {"driver": "file", "path": str(path)}
    if zarr_format == 2:
        metadata = {"shape": data.shape, "chunks": chunks, "dtype": data.dtype.str}
        spec = {"driver": "zarr", "kvstore": kvstore, "metadata": metadata}
    else:
        codecs = V3_CODECS
        if shards is not None:
            inner = {"chunk_shape": chunks, "codecs": V3_CODECS, "index_codecs": V3_CODECS}
            codecs, chunks = [{"name": "sharding_indexed", "configuration": inner}], shards
        metadata = {
            "shape": data.shape,
            "data_type": data.dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "codecs": codecs,
        }
        spec = {"driver": "zarr3", "kvstore": kvstore, "metadata": metadata}
    array = ts.open(spec, create=True).result()
    if write:
        array[...].write(data).result()
    return array


def _chunk_files(path):
    """Chunks (or shards) stored: every file of the array but its metadata."""
    return sum(
        1
        for p in Path(path).rglob("*")
        if p.is_file() and not p.name.startswith((".z", "zarr.json"))
    )


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
    group = tmp_path / "g.zarr"
    _metadata(group, zarr_format)
    raw = RNG.random((40, 50), dtype=np.float32)
    _array(group, raw, (16, 16), name="volumes/raw", zarr_format=zarr_format)
    _array(group, raw > 0.5, (16, 16), name="volumes/mask", zarr_format=zarr_format)
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
    for index, data in enumerate(levels):
        _array(path, data, chunks, name=str(index), zarr_format=zarr_format)
    multiscale = {
        "axes": axes,
        "datasets": [{"path": str(i), "coordinateTransformations": []} for i in range(len(levels))],
    }
    if zarr_format == 2:
        _metadata(path, 2, {"multiscales": [{"version": "0.4", **multiscale}]})
    else:
        _metadata(path, 3, {"ome": {"version": "0.5", "multiscales": [multiscale]}})


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
    _metadata(tmp_path / "b.zarr", 2)
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


def _blank(shape, dtype):
    """An array's shape and dtype without its memory (what ``_array(write=False)`` needs)."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def test_a_chunk_above_the_bound_is_refused_before_any_read(tmp_path):
    # 64 MiB: at the bound, refused one pixel beyond it
    _array(tmp_path / "big.zarr", _blank((8192, 8192), np.uint8), (8192, 8192), write=False)
    assert _chunk_files(tmp_path / "big.zarr") == 0
    open_source(tmp_path / "big.zarr").close()
    _array(tmp_path / "bigger.zarr", _blank((8193, 8192), np.uint8), (8193, 8192), write=False)
    with pytest.raises(RequestError, match=r"64 MiB each; expected at most 64 MiB"):
        open_source(tmp_path / "bigger.zarr")


def test_a_sharded_v3_array_reads_and_bounds_its_inner_chunks(tmp_path):
    # OME-Zarr 0.5 writers shard: a read decodes the inner chunks it touches, so the bound
    # applies to them, not to the shard (here 128 MiB, inner chunks of 32 KiB)
    data = RNG.integers(0, 60000, (300, 200)).astype(np.uint16)
    _array(tmp_path / "s.zarr", data, (100, 100), zarr_format=3, shards=(300, 200))
    assert _chunk_files(tmp_path / "s.zarr") == 1  # one shard of 6 inner chunks
    with open_source(tmp_path / "s.zarr") as source:
        np.testing.assert_array_equal(
            source.read(slice(50, 290), slice(7, 199)), data[50:290, 7:199]
        )
    big = _blank((8192, 8192), np.uint16)
    _array(tmp_path / "big.zarr", big, (128, 128), zarr_format=3, shards=(8192, 8192), write=False)
    open_source(tmp_path / "big.zarr").close()


def _peak_rss_growth(read):
    """``read()`` and how far it raised the process's peak resident memory above what was
    resident before (Linux: VmHWM reset through /proc/self/clear_refs). It counts what
    tensorstore's C++ allocates, which tracemalloc does not see."""

    def status(name):
        text = Path("/proc/self/status").read_text()
        return int(re.search(rf"^{name}:\s+(\d+) kB", text, re.M)[1]) * 1024

    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    result = read()
    return result, status("VmHWM") - before


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_region_of_a_40000_px_array_decodes_only_its_chunks(tmp_path, zarr_format):
    """The zarr twin of the TIFF slide test: 40,000 x 40,000 uint8 chunked 512 (1.6 GB
    decoded), only the 3 x 3 chunks under the region stored. The read may allocate the
    region (1 MiB) and those chunks (256 KiB each); 16 MiB is 1% of the array. Measured
    twice: numpy's and Python's allocations (tracemalloc), and the resident memory the
    whole process gained (tensorstore's own buffers included)."""
    full = _blank((40_000, 40_000), np.uint8)
    array = _array(tmp_path / "big.zarr", full, (512, 512), zarr_format=zarr_format, write=False)
    rows, cols = slice(20_000, 21_024), slice(30_100, 31_124)
    array[rows, cols].write(np.full((1024, 1024), 7, np.uint8)).result()
    assert _chunk_files(tmp_path / "big.zarr") == 9
    with open_source(tmp_path / "big.zarr") as source:
        source.read(slice(0, 8), slice(0, 8))  # tensorstore's first-use setup, not the read's
        tracemalloc.start()
        try:
            block, grown = _peak_rss_growth(lambda: source.read(rows, cols))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert block.shape == (1024, 1024) and (block == 7).all()
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert grown < 16 * 2**20, f"resident memory grew {grown / 2**20:.1f} MiB"


def test_stores_zarr_python_writes_read_back(tmp_path):
    """What zarr-python itself writes, with its default format and codecs: zarr 3 in the
    project venv (v3, zstd), zarr 2 in the container's lock (v2, blosc). The same calls
    write both; an OME-Zarr image's attributes are set through the group."""
    zarr = pytest.importorskip("zarr")  # in both locks: tifffile's TIFF store is read with it
    data = RNG.integers(0, 60000, (2, 90, 70)).astype(np.uint16)
    array = zarr.open_array(
        str(tmp_path / "a.zarr"), mode="w", shape=data.shape, chunks=(1, 32, 32), dtype="u2"
    )
    array[...] = data
    with open_source(tmp_path / "a.zarr") as source:
        assert (source.axes, source.shape) == ("zyx", (2, 90, 70))
        np.testing.assert_array_equal(
            source.read(slice(5, 80), slice(9, 61), z=1), data[1, 5:80, 9:61]
        )
    group = zarr.open_group(str(tmp_path / "o.zarr"), mode="w")
    level = group.create_dataset("0", shape=data.shape, chunks=(1, 32, 32), dtype="u2")
    level[...] = data
    multiscale = {"axes": ["z", "y", "x"], "datasets": [{"path": "0"}]}
    group.attrs["multiscales"] = [{"version": "0.4", **multiscale}]
    with open_source(tmp_path / "o.zarr") as source:
        np.testing.assert_array_equal(source.read(slice(0, 90), slice(0, 70), z=0), data[0])
