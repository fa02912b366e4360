"""Tiled segment everything from the client's side: one job per tile, joined, written.

The server's jobs are stood in for by a function answering, for the block a request names,
what the official generator's ``coco_rle`` mode would answer if it found exactly the objects
of a known label image (each cut to the block). So the expected instances are exact.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from triton_sam.client import everything as job
from triton_sam.client.everything import EverythingResult
from triton_sam.client.everything_tiled import segment_everything_tiled
from triton_sam.errors import RequestCancelledError
from triton_sam.serving import masks
from triton_sam.serving.protocol import everything as protocol
from triton_sam.serving.tiles import TileGrid

SHAPE = (300, 420)
GRID = TileGrid(SHAPE, (128, 128), (32, 32))  # 3 x 4 tiles


def objects():
    rows, cols = np.ogrid[: SHAPE[0], : SHAPE[1]]
    found = [
        (rows - 128) ** 2 + (cols - 128) ** 2 <= 50**2,  # over four tiles
        (rows - 40) ** 2 + (cols - 300) ** 2 <= 15**2,  # inside one tile
        (rows >= 200) & (rows < 230) & (cols >= 10) & (cols < 410),  # a bar over four tiles
    ]
    return found


class Jobs:
    """generate() as the server answers it, for the objects above."""

    def __init__(self, cancel_after=None):
        self.requests, self.cancel_after = [], cancel_after

    def __call__(self, endpoint, model, inputs, progress=None, **options):
        self.requests.append((model, inputs, options))
        r0, c0, r1, c1 = (int(v) for v in inputs[protocol.BLOCK])
        records = []
        for k, whole in enumerate(objects()):
            part = whole[r0:r1, c0:c1]
            if not part.any():
                continue
            ys, xs = np.nonzero(part)
            records.append(
                {
                    "segmentation": {
                        "size": [r1 - r0, c1 - c0],
                        "counts": masks.encode_rle(part).decode(),
                    },
                    # the official bbox: [x, y, w, h] with inclusive ends (w = max - min)
                    "bbox": [int(xs.min()), int(ys.min()), int(np.ptp(xs)), int(np.ptp(ys))],
                    "predicted_iou": 0.9 - 0.1 * k,
                }
            )
        if progress is not None:
            progress(1, 1)
        return EverythingResult((r1 - r0, c1 - c0), records)


def test_each_object_is_one_instance_with_its_whole_mask(monkeypatch):
    jobs = Jobs()
    monkeypatch.setattr(job, "generate", jobs)
    seen = []
    result = segment_everything_tiled(
        "endpoint", "sam2_everything", "h" * 32, GRID, z=3, progress=lambda d, t: seen.append(d)
    )
    assert result.tiles == len(GRID) == 12 and seen == list(range(1, 13))
    assert len(result) == 3
    expected = objects()
    for record in result.records():
        full = masks.decode_rle(record["segmentation"]["counts"], SHAPE)
        assert sum(np.array_equal(full, e) for e in expected) == 1
        assert record["area"] == full.sum()
    model, inputs, _ = jobs.requests[5]
    assert model == "sam2_everything" and inputs[protocol.Z].tolist() == [3]
    assert inputs[protocol.BLOCK].tolist() == list(
        GRID.outer(5).begin + GRID.outer(5).end
    )  # the tile with its halo


def test_label_blocks_paint_the_whole_image_block_by_block(monkeypatch):
    monkeypatch.setattr(job, "generate", Jobs())
    result = segment_everything_tiled("endpoint", "m", "h" * 32, GRID)
    labels = np.zeros(SHAPE, np.uint32)
    for block, part in result.label_blocks(chunk=(100, 150)):
        assert part.shape == block.shape
        labels[block.slices()] = part
    assert set(np.unique(labels)) == {0, 1, 2, 3}
    for k, inst in enumerate(result.instances):  # the objects do not overlap: each exact
        placed = np.zeros(SHAPE, bool)
        r, c = inst.offset
        placed[r : r + inst.mask.shape[0], c : c + inst.mask.shape[1]] = inst.mask
        np.testing.assert_array_equal(labels == k + 1, placed)


def test_cancel_stops_between_tiles_and_returns_nothing(monkeypatch):
    jobs = Jobs()
    monkeypatch.setattr(job, "generate", jobs)
    cancel = threading.Event()

    def progress(done, total):
        if done == 2:
            cancel.set()

    with pytest.raises(RequestCancelledError):
        segment_everything_tiled("e", "m", "h" * 32, GRID, progress=progress, cancel=cancel)
    assert len(jobs.requests) == 2


def test_the_label_image_is_an_ome_zarr_written_chunk_by_chunk(monkeypatch, tmp_path):
    import zarr

    monkeypatch.setattr(job, "generate", Jobs())
    result = segment_everything_tiled("endpoint", "m", "h" * 32, GRID)
    result.write_ome_zarr(tmp_path / "labels.ome.zarr", chunk=(128, 128))
    group = zarr.open_group(str(tmp_path / "labels.ome.zarr"), mode="r")
    (scales,) = group.attrs["multiscales"]
    assert scales["version"] == "0.4" and scales["datasets"][0]["path"] == "0"
    assert [a["name"] for a in scales["axes"]] == ["y", "x"] and "image-label" in group.attrs
    labels = group["0"]
    assert labels.shape == SHAPE and labels.chunks == (128, 128) and labels.dtype == np.uint32
    expected = np.zeros(SHAPE, np.uint32)
    for block, part in result.label_blocks(chunk=(128, 128)):
        expected[block.slices()] = part
    np.testing.assert_array_equal(labels[:], expected)
    assert set(np.unique(expected)) == {0, 1, 2, 3}
