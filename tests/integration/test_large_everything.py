"""Segment everything on a large image, served: one job per tile on the image the large model
holds (its blocks read on the server), pieces joined across tiles.

Parity (the official generator's equality with the served everything model is
tests/parity/test_everything_parity.py): each tile's job answers exactly what the everything
model answers for that tile's pixels sent as an image, so the block read on the server is the
right one; pieces of one object are joined. (Which pieces join, and each instance's exact
mask, are checked on known objects in tests/unit/test_stitch.py and
tests/unit/test_everything_tiled.py: random weights have no objects.)
"""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.client import SAM2TritonClient
from triton_sam.client import everything as job
from triton_sam.serving import masks
from triton_sam.serving.tiles import TileGrid
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

# Random weights predict noise masks (predicted IoU ~0.45): keep what the generator makes.
PARAMS = {
    "points_per_side": 4,
    "pred_iou_thresh": 0.0,
    "stability_score_offset": 0.02,
    "stability_score_thresh": 0.3,
}


def test_tiled_everything_equals_each_tiles_job_and_joins_across_edges(
    sam2_tiny_server, monkeypatch
):
    image = sample_image(300, 280)  # W x H
    shape = image.shape[:2]
    answered = {}
    real = job.generate

    def recording(endpoint, model, inputs, **options):
        result = real(endpoint, model, inputs, **options)
        answered[tuple(int(v) for v in inputs["block"])] = result.instances
        return result

    monkeypatch.setattr(job, "generate", recording)
    with SAM2TritonClient(sam2_tiny_server.http_url) as client:
        with client.open_array(image, tile=128, halo=32, progress=False) as large:
            done = []
            result = large.segment_everything(
                grpc_url=sam2_tiny_server.grpc_url,
                progress=lambda d, t: done.append((d, t)),
                **PARAMS,
            )
        grid = TileGrid(shape, (128, 128), (32, 32))
        assert result.tiles == len(grid) == 9 and done[-1] == (9, 9)
        assert len(answered) == 9
        monkeypatch.setattr(job, "generate", real)
        for tile in (0, 4):  # a corner tile and the middle one, sent as plain images
            outer = grid.outer(tile)
            direct = client.generate_masks(
                np.ascontiguousarray(image[outer.slices()]),
                grpc_url=sam2_tiny_server.grpc_url,
                **PARAMS,
            )
            served = answered[(*outer.begin, *outer.end)]
            assert [r["segmentation"] for r in served] == [
                r["segmentation"] for r in direct.instances
            ]
            assert [r["predicted_iou"] for r in served] == [
                r["predicted_iou"] for r in direct.instances
            ]
    pieces = sum(len(v) for v in answered.values())
    assert 0 < len(result) <= pieces
    full = [np.zeros(shape, bool) for _ in result.instances]
    for k, inst in enumerate(result.instances):
        r, c = inst.offset
        full[k][r : r + inst.mask.shape[0], c : c + inst.mask.shape[1]] = inst.mask
    # Random weights answer masks that fill the block they are given, so every object here
    # crosses tile edges (measured: 9 pieces, one per tile, joined into 2 instances).
    assert len(result) < pieces
    assert sum(len(inst.pieces) for inst in result.instances) <= pieces
    records = result.records()
    for k, record in enumerate(records):
        np.testing.assert_array_equal(
            masks.decode_rle(record["segmentation"]["counts"], shape), full[k]
        )
    print(f"{pieces} pieces from 9 tiles -> {len(result)} instances")


def test_the_benchmark_row_runs_both_sides_on_the_same_tiles(
    sam1_vit_b_server, sam1_vit_b_spec, sam1_vit_b_checkpoint
):
    """`triton-sam bench everything-large`'s row at a CI size: the served tiled jobs and
    micro-sam's TiledAutomaticMaskGenerator on the same weights and tiles; the row raises
    unless the server's encoders ran once per tile and micro-sam embedded the same tiles."""
    from triton_sam.bench.large_everything import everything_row, markdown
    from triton_sam.bench.micro_sam_ref import micro_sam, reference_predictor

    micro_sam()  # a clear ImportError (run `make micro-sam`) rather than a half-run row

    pixels = sample_image(250, 120)[..., 0]  # W x H: grey, one row of two tiles
    predictor = reference_predictor(sam1_vit_b_spec, sam1_vit_b_checkpoint)
    # random weights: nothing passes micro-sam's default filters, so both keep every mask
    thresholds = {"pred_iou_thresh": 0.0, "stability_score_thresh": 0.0, "box_nms_thresh": 0.7}
    options = {"mapping": {"kind": "tile_minmax"}, "tile": 128, "halo": 32, "progress": False}
    with (
        SAM2TritonClient(sam1_vit_b_server.http_url, model_type="sam1") as client,
        client.open_array(pixels, **options) as image,
    ):
        row = everything_row(
            image, pixels, predictor, sam1_vit_b_server.http_url,
            grpc_url=sam1_vit_b_server.grpc_url, points_per_side=2, thresholds=thresholds,
        )  # fmt: skip
    assert row.tiles == 2 and row.side == (120, 250)
    # micro-sam drops every mask touching its tile's edge, and random weights' masks fill
    # their tiles: its count may be 0 here. Its side ran (it embedded the same 2 tiles).
    assert row.ours_instances > 0 and row.micro_sam_s > 0
    assert row.ratio == round(row.ours_s / row.micro_sam_s, 2)
    assert "micro-sam TiledAutomaticMaskGenerator" in markdown(row)
