"""Segment-everything pieces (serving/everything/) against the official generators' helpers.

The references are upstream's own functions (``segment_anything/utils/amg.py``,
``torchvision.ops.batched_nms``) where they are importable; the project's unit tier runs
without torch, so those comparisons skip when torch is absent.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from triton_sam.serving import everything as ev
from triton_sam.serving.bounds import RequestError
from triton_sam.serving.masks import decode_rle


# -- params ---------------------------------------------------------------------------------
def test_defaults_are_the_official_ones() -> None:
    assert ev.defaults("sam1").pred_iou_thresh == 0.88
    assert ev.defaults("sam2").pred_iou_thresh == 0.8
    assert ev.parse_params("sam2", "") == ev.defaults("sam2")
    assert ev.parse_params("sam2", None) == ev.defaults("sam2")


def test_overrides_applied() -> None:
    p = ev.parse_params("sam2", '{"points_per_side": 8, "use_m2m": true, "box_nms_thresh": 0.5}')
    assert (p.points_per_side, p.use_m2m, p.box_nms_thresh) == (8, True, 0.5)
    assert ev.parse_params("sam1", {"points_per_side": 4.0}).points_per_side == 4


@pytest.mark.parametrize(
    ("family", "text", "field"),
    [
        ("sam1", '{"points_per_side": 0}', "params.points_per_side"),
        ("sam1", '{"points_per_side": 10000}', "params.points_per_side"),
        ("sam1", '{"points_per_side": 2.5}', "params.points_per_side"),
        ("sam1", '{"points_per_side": true}', "params.points_per_side"),
        ("sam1", '{"points_per_batch": 0}', "params.points_per_batch"),
        ("sam2", '{"pred_iou_thresh": NaN}', "params.pred_iou_thresh"),
        ("sam2", '{"stability_score_offset": -Infinity}', "params.stability_score_offset"),
        ("sam2", {"pred_iou_thresh": math.nan}, "params.pred_iou_thresh"),
        ("sam2", {"stability_score_thresh": math.inf}, "params.stability_score_thresh"),
        ("sam2", '{"box_nms_thresh": 1.5}', "params.box_nms_thresh"),
        ("sam2", '{"crop_overlap_ratio": 1}', "params.crop_overlap_ratio"),
        ("sam2", '{"crop_n_layers": 9}', "params.crop_n_layers"),
        ("sam2", '{"points_per_side": 128, "crop_n_layers": 2}', "params.points_per_side"),
        ("sam2", '{"min_mask_region_area": 100}', "params.min_mask_region_area"),
        ("sam2", '{"pred_iou_thresh": "0.5"}', "params.pred_iou_thresh"),
        ("sam2", '{"use_m2m": 1}', "params.use_m2m"),
        ("sam1", '{"use_m2m": true}', "params.use_m2m"),
        ("sam1", '{"multimask_output": false}', "params.multimask_output"),
        ("sam2", '{"bogus": 1}', "params.bogus"),
        ("sam2", '{"point_grids": []}', "params.point_grids"),
        ("sam2", "[1, 2]", "params"),
        ("sam2", "{not json", "params"),
        (
            "sam2",
            '{"points_per_side": 3, "crop_n_layers": 1, "crop_n_points_downscale_factor": 4}',
            "params.crop_n_points_downscale_factor",
        ),
    ],
)
def test_refusals_name_the_field(family: str, text, field: str) -> None:
    with pytest.raises(RequestError) as info:
        ev.parse_params(family, text)
    assert info.value.field == field
    assert str(info.value).startswith(field + ":")


def test_unknown_family() -> None:
    with pytest.raises(RequestError, match="family"):
        ev.defaults("sam3")


# -- plan ------------------------------------------------------------------------------------
def test_plan_matches_upstream() -> None:
    amg = pytest.importorskip("segment_anything.utils.amg")
    for n, layers, factor in [(32, 0, 1), (8, 2, 2), (5, 1, 1)]:
        got = ev.layer_grids(n, layers, factor)
        want = amg.build_all_layer_point_grids(n, layers, factor)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    for hw in [(480, 640), (333, 1000), (17, 23)]:
        for layers in range(4):
            assert ev.crop_boxes(hw, layers, 512 / 1500) == amg.generate_crop_boxes(
                hw, layers, 512 / 1500
            )
    jobs = ev.plan(ev.EverythingParams(points_per_side=4, crop_n_layers=1), (100, 200))
    assert len(jobs) == 5 and jobs[1].layer == 1
    box = jobs[1].box
    np.testing.assert_array_equal(
        jobs[1].points,
        amg.build_point_grid(4) * np.array([box[3] - box[1], box[2] - box[0]])[None, ::-1],
    )


# -- NMS -------------------------------------------------------------------------------------
def _random_boxes(rng: np.random.Generator, n: int, grid: bool) -> np.ndarray:
    xy = rng.integers(0, 60, (n, 2)) if grid else rng.uniform(0, 60, (n, 2))
    wh = rng.integers(1, 40, (n, 2)) if grid else rng.uniform(0, 40, (n, 2))
    return np.concatenate([xy, xy + wh], axis=1).astype(np.float32)


@pytest.mark.parametrize("seed", range(6))
def test_nms_matches_torchvision(seed: int) -> None:
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("torchvision.ops")
    rng = np.random.default_rng(seed)
    n = [5, 50, 300, 1200, 200, 0][seed]  # 1200 boxes: torchvision's per-class path
    boxes = _random_boxes(rng, n, grid=seed % 2 == 0)
    # Ties: scores drawn from a few values (the crop-level NMS ties every mask of a crop).
    scores = rng.choice(np.float32([0.5, 0.7, 0.9]), n) if seed % 3 else rng.random(n)
    scores = scores.astype(np.float32)
    for threshold in (0.0, 0.3, 0.7, 1.0):
        want = ops.batched_nms(
            torch.from_numpy(boxes), torch.from_numpy(scores), torch.zeros(n), threshold
        ).numpy()
        np.testing.assert_array_equal(ev.nms(boxes, scores, threshold), want)


def test_nms_degenerate_boxes() -> None:
    """Zero-area boxes give IoU 0/0 = NaN, which suppresses nothing (as torchvision)."""
    boxes = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 5, 5]], np.float32)
    np.testing.assert_array_equal(ev.nms(boxes, np.float32([1, 1, 1]), 0.5), [0, 1, 2])


# -- RLE, uncrop, edges -----------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_uncropped_rle_decodes_to_the_mask(seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, w = 37, 53
    box = (5, 7, 40, 30)
    mask = rng.random((box[3] - box[1], box[2] - box[0])) > [0.5, 0.0, 1.0, 0.9][seed]
    runs = ev.uncropped_runs(mask, box, (h, w))
    full = np.zeros((h, w), bool)
    full[box[1] : box[3], box[0] : box[2]] = mask
    from triton_sam.serving.masks import compress_counts

    np.testing.assert_array_equal(decode_rle(compress_counts(runs), (h, w)), full)
    assert runs[1::2].sum() == full.sum()


def test_rle_matches_upstream_uncompressed() -> None:
    torch = pytest.importorskip("torch")
    amg = pytest.importorskip("segment_anything.utils.amg")
    rng = np.random.default_rng(0)
    masks = rng.random((4, 19, 23)) > 0.6
    masks[1] = True
    masks[2] = False
    want = amg.mask_to_rle_pytorch(torch.from_numpy(masks))
    for m, rle in zip(masks, want, strict=True):
        assert ev.uncropped_runs(m, (0, 0, 23, 19), (19, 23)).tolist() == rle["counts"]


def test_near_crop_edge_matches_upstream() -> None:
    torch = pytest.importorskip("torch")
    amg = pytest.importorskip("segment_anything.utils.amg")
    rng = np.random.default_rng(1)
    crop = [100, 0, 400, 300]
    boxes = rng.integers(0, 300, (200, 4))
    boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2])
    want = amg.is_box_near_crop_edge(torch.from_numpy(boxes), crop, [0, 0, 500, 300]).numpy()
    np.testing.assert_array_equal(ev.near_crop_edge(boxes, tuple(crop), (300, 500)), want)


# -- driver ------------------------------------------------------------------------------------
def _fake_decode(features, feeds):
    """Two masks per prompt: a square around the point, and a bigger one."""
    hw = tuple(int(v) for v in feeds[ev.IN_CROP_HW])
    masks, boxes, index = [], [], []
    for i, (x, y) in enumerate(feeds[ev.IN_POINTS]):
        for r in (3, 8):
            m = np.zeros(hw, bool)
            y0, y1 = max(0, int(y) - r), min(hw[0], int(y) + r)
            x0, x1 = max(0, int(x) - r), min(hw[1], int(x) + r)
            m[y0:y1, x0:x1] = True
            masks.append(m)
            boxes.append([x0, y0, x1 - 1, y1 - 1])
            index.append(i)
    k = len(masks)
    return {
        ev.OUT_MASKS: np.array(masks).reshape(k, *hw),
        ev.OUT_IOU: np.linspace(0.9, 0.5, k, dtype=np.float32),
        ev.OUT_STABILITY: np.ones(k, np.float32),
        ev.OUT_BOXES: np.array(boxes, np.int64).reshape(k, 4),
        ev.OUT_PROMPT_INDEX: np.array(index, np.int64),
    }


def test_generator_progress_records_and_cancel() -> None:
    params = ev.EverythingParams(points_per_side=4, points_per_batch=5, crop_n_layers=1)
    seen = []
    gen = ev.Generator(
        params,
        family="sam2",
        embed=lambda box: box,
        decode=_fake_decode,
        progress=lambda d, t: seen.append((d, t)),
    )
    records = gen.run((64, 96))
    total = gen.total_batches((64, 96))
    assert seen[-1] == (total, total) and total == 5 * 4
    assert records
    for r in records:
        mask = decode_rle(r["segmentation"]["counts"], (64, 96))
        assert mask.sum() == r["area"]
        ys, xs = np.nonzero(mask)
        assert r["bbox"] == [xs.min(), ys.min(), xs.max() - xs.min(), ys.max() - ys.min()]
    calls = []
    gen = ev.Generator(
        params,
        family="sam1",
        embed=lambda box: box,
        decode=_fake_decode,
        cancelled=lambda: len(calls) > 2,
        progress=lambda d, t: calls.append(d),
    )
    with pytest.raises(ev.Cancelled):
        gen.run((64, 96))
    assert len(calls) == 3


def test_batch_memory_bound_names_points_per_batch() -> None:
    params = ev.EverythingParams(points_per_batch=256)
    ev.check_image("sam2", params, (480, 640))
    with pytest.raises(RequestError) as info:
        ev.check_image("sam2", params, (2048, 2048))
    assert info.value.field == "params.points_per_batch"
    gen = ev.Generator(params, family="sam1", embed=lambda b: b, decode=_fake_decode)
    with pytest.raises(RequestError, match="points_per_batch <= "):
        gen.run((1024, 1024))


def test_a_job_s_prompts_are_bounded_over_its_crops() -> None:
    """The official default grid with 3 crop layers (87,040 prompts) and the largest grid
    with one layer (81,920) are admitted; one more layer on the largest grid is not."""
    for params in (
        {"points_per_side": 32, "crop_n_layers": 3},
        {"points_per_side": ev.MAX_POINTS_PER_SIDE, "crop_n_layers": 1},
        {
            "points_per_side": ev.MAX_POINTS_PER_SIDE,
            "crop_n_layers": 3,
            "crop_n_points_downscale_factor": 4,
        },
    ):
        ev.parse_params("sam2", params)
    with pytest.raises(RequestError, match="params.points_per_side"):
        ev.parse_params("sam2", {"points_per_side": ev.MAX_POINTS_PER_SIDE, "crop_n_layers": 2})
