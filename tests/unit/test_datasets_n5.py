"""N5 reader (serving/datasets/n5_source.py) on containers tensorstore writes here.

N5 lists dimensions x first (``"dimensions": [x, y, z]``, as Paintera and BigDataViewer
write them); the reader reverses them, so a (z, y, x) volume written the N5 way reads back as
the same (z, y, x) numpy array.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorstore as ts

from triton_sam.serving.bounds import RequestError
from triton_sam.serving.datasets import open_source

RNG = np.random.default_rng(31)


def _write_n5(path, data, block, attributes=None):
    """``data`` in C order (z, y, x), written as N5 does: dimensions and blocks x first."""
    metadata = {
        "dimensions": list(reversed(data.shape)),
        "blockSize": list(reversed(block)),
        "dataType": str(data.dtype),
        "compression": {"type": "gzip"},
    }
    spec = {"driver": "n5", "kvstore": {"driver": "file", "path": str(path)}, "metadata": metadata}
    store = ts.open(spec, create=True).result()
    store[...].write(data.T).result()
    if attributes:
        text = json.loads((path / "attributes.json").read_text())
        (path / "attributes.json").write_text(json.dumps({**text, **attributes}))


def test_a_volume_is_read_z_y_x_although_n5_stores_x_first(tmp_path):
    volume = RNG.integers(0, 60000, (6, 50, 40)).astype(np.uint16)
    _write_n5(tmp_path / "v.n5", volume, (2, 16, 16))
    stored = json.loads((tmp_path / "v.n5" / "attributes.json").read_text())
    assert stored["dimensions"] == [40, 50, 6]  # x, y, z: N5's order
    with open_source(tmp_path / "v.n5") as source:
        assert (source.axes, source.shape, source.dtype) == ("zyx", (6, 50, 40), np.uint16)
        for z in (0, 5):
            block = source.read(slice(7, 41), slice(3, 33), z=z)
            np.testing.assert_array_equal(block, volume[z, 7:41, 3:33])


def test_an_image_and_its_axes_attribute(tmp_path):
    image = RNG.random((30, 20), dtype=np.float32)
    _write_n5(tmp_path / "i.n5", image, (8, 8))
    with open_source(tmp_path / "i.n5") as source:
        assert (source.axes, source.shape, source.dtype) == ("yx", (30, 20), np.float32)
        np.testing.assert_array_equal(source.read(slice(0, 30), slice(4, 19)), image[:, 4:19])
    # channels first in C order, named by the dataset's "axes" (x first, as N5 lists them)
    planes = RNG.integers(0, 255, (5, 30, 20)).astype(np.uint8)
    _write_n5(tmp_path / "c.n5", planes, (5, 8, 8), {"axes": ["x", "y", "c"]})
    with open_source(tmp_path / "c.n5") as source:
        assert (source.axes, source.shape) == ("yxc", (30, 20, 5))
        block = source.read(slice(2, 30), slice(0, 11))
    np.testing.assert_array_equal(block, np.moveaxis(planes, 0, -1)[2:30, :11])


def test_a_group_needs_a_key_naming_a_dataset(tmp_path):
    root = tmp_path / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text('{"n5": "4.0.0"}')
    raw = RNG.integers(0, 255, (16, 12)).astype(np.uint8)
    _write_n5(root / "volumes" / "raw", raw, (8, 8))
    _write_n5(root / "labels", raw, (8, 8))
    with pytest.raises(RequestError, match=r"request\.key: .* N5 group: .*'labels', 'volumes/raw'"):
        open_source(root)
    with open_source(root, key="volumes/raw") as source:
        np.testing.assert_array_equal(source.read(slice(0, 16), slice(0, 12)), raw)
    with pytest.raises(RequestError, match=r"request\.key: got 'volumes/x', no such dataset"):
        open_source(root, key="volumes/x")
    with pytest.raises(RequestError, match=r"request\.key: got 'x', expected none"):
        open_source(root / "labels", key="x")


def test_a_key_through_a_link_out_of_the_container_is_refused(tmp_path):
    outside = tmp_path / "outside"
    _write_n5(outside, np.zeros((8, 8), np.uint8), (8, 8))
    root = tmp_path / "c.n5"
    root.mkdir()
    (root / "attributes.json").write_text('{"n5": "4.0.0"}')
    (root / "link").symlink_to(outside)
    with pytest.raises(RequestError, match=r"request\.key: got 'link', no such dataset"):
        open_source(root, key="link")


def test_unreadable_n5_metadata_is_refused(tmp_path):
    (tmp_path / "bad.n5").mkdir()
    (tmp_path / "bad.n5" / "attributes.json").write_text('{"dimensions": [4, 4]}')
    with pytest.raises(RequestError, match=r"^request\.dataset: not a readable N5 dataset"):
        open_source(tmp_path / "bad.n5")
    (tmp_path / "bad.n5" / "attributes.json").write_text("[1, 2]")
    with pytest.raises(RequestError, match=r"^request\.dataset: not an N5 container"):
        open_source(tmp_path / "bad.n5")


def test_a_scale_pyramid_group_is_one_image_with_its_levels(tmp_path):
    # Paintera's layout: volumes/raw/s0 (full), s1 (half), each an N5 dataset
    root = tmp_path / "p.n5"
    root.mkdir()
    (root / "attributes.json").write_text('{"n5": "4.0.0"}')
    full = RNG.integers(0, 255, (4, 64, 48)).astype(np.uint8)
    raw = root / "volumes" / "raw"
    _write_n5(raw / "s0", full, (2, 16, 16))
    _write_n5(raw / "s1", full[:, ::2, ::2], (2, 16, 16))
    (raw / "attributes.json").write_text('{"multiScale": true}')
    for source in (open_source(root, key="volumes/raw"), open_source(raw)):
        with source:
            assert (source.axes, source.levels) == ("zyx", ((4, 64, 48), (4, 32, 24)))
            block = source.read(slice(3, 30), slice(5, 20), z=2, level=1)
            np.testing.assert_array_equal(block, full[2, ::2, ::2][3:30, 5:20])
    with open_source(root, key="volumes/raw/s1") as source:  # one level alone
        assert source.levels == ((4, 32, 24),)
