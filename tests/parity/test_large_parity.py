"""Large images: the server's ``sam1_large`` vs micro-sam 1.8.14's tiled prompts, and vs SAM
on a window holding an object that crosses tiles (parity (a) and (c) of large images).

The same random-init SAM1 ViT-B everywhere: the checkpoint the session exports
(tests/conftest.py) serves ``sam1_large`` (each tile embedded by ``sam1_session``, onnxruntime)
and drives micro-sam's own code through the official ``SamPredictor`` (torch;
tests/micro_sam_support.py). The image is a synthetic uint16 section, 1000 x 900 (rows x
cols), uploaded with ``create`` + ``put`` and mapping ``tile_minmax`` (micro-sam's
``_to_image``: each embedded block stretched from its own min to max); tile (512, 512), halo
(64, 64), as micro-sam's ``precompute_image_embeddings(tile_shape=, halo=)``: a 2 x 2 grid. Only
the tiles the prompts need are embedded: 0 (core [0, 512)^2) and 3 (core [512, 1000) x
[512, 900), an outer block of 552 x 452 at offset (448, 448): non-square and shifted).

The server is spoken to as the contract says (triton_sam/serving/protocol/large.py): plain
``tritonclient.http``, BYTES ``request`` (JSON) in, BYTES ``answer`` (JSON) out, masks as a
crop's COCO RLE at an offset in full-image pixels.

Tolerances (stated; the server's tile is the session model's image, so the whole-image SAM1
parity of tests/parity/test_sam1_parity.py carries over tile by tile):
- scores: |ours - micro-sam| <= 1e-5 (as SAM1 parity: onnxruntime vs torch, measured there
  <= 1.0e-7).
- masks: IoU >= 0.999. A mask is logits > 0; ours and torch's logits differ by <= 6.3e-7
  (SAM1 parity), so only pixels whose logit lies within that of 0 can flip: SAM1 parity
  measured min IoU 0.99999 over whole images. 0.999 leaves 100x that, and still fails a
  mapping that differs from micro-sam's (one grey level on part of a tile moves logits by
  ~1e-3) or any other tile or offset.
- (c): IoU >= 0.95 with SAM on a window holding the whole object (the issue's bound; the
  server's ``auto`` mode answers it from a window of its own choosing, re-prompted).
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np
import pytest
from micro_sam_support import (
    micro_sam,
    reference_predictor,
    segment_from_box,
    segment_from_points,
    tiled_embeddings,
    to_sam_rgb,
)
from prompt_matrix import iou
from servers import module_server

from triton_sam.serving.masks import decode_rle
from triton_sam.serving.protocol.large import PIXEL_INPUTS
from triton_sam.serving.tiles import TileGrid

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(1200)]

SCORE_ATOL = 1e-5
MIN_IOU = 0.999
MIN_WINDOW_IOU = 0.95

SHAPE = (1000, 900)  # rows, cols: no larger than the server's 1024 px window (asserted)
TILE, HALO = (512, 512), (64, 64)
GRID = TileGrid(SHAPE, TILE, HALO)
MODEL = "sam1_large"

# micro-sam's coordinates: (row, col) points, [row0, col0, row1, col1] boxes.
POINT_CASES = {
    "click": ([[200, 300]], [1]),  # one positive point: micro-sam's use_best_multimask
    "clicks_with_negative": ([[200, 300], [400, 100]], [1, 0]),
    "click_dropped": ([[100, 100], [100, 700]], [1, 1]),  # centre in tile 0; col 700 dropped
    "click_tile_3": ([[760, 700]], [1]),
    "clicks_tile_3": ([[760, 700], [600, 560]], [1, 0]),
}
BOX_CASES = {"box": [120, 200, 330, 420], "box_tile_3": [650, 600, 870, 800]}
TILES = (0, 3)
CROSSING_CLICK = (300, 480)  # on the bright band crossing tiles 0 and 1; micro-sam cuts it


def section(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """A uint16 grey section as EM/LM gives them: a dim noisy background and bright blobs,
    one of them a band across the vertical tile edge at column 512."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[: shape[0], : shape[1]].astype(np.float32)
    image = 1200 + rng.normal(0, 150, shape)
    blobs = [
        (200, 300, 60, 60, 1.0),  # (row, col, sigma row, sigma col, relative height)
        (760, 700, 70, 60, 1.0),
        (300, 512, 60, 170, 1.0),
        (512, 250, 150, 50, 0.8),
        (512, 512, 110, 110, 0.6),
    ]
    for r, c, sr, sc, height in blobs:
        image += height * 9000 * np.exp(-(((yy - r) / sr) ** 2 + ((xx - c) / sc) ** 2) / 2)
    return image.clip(0, 65535).astype(np.uint16)


IMAGE = section(SHAPE)


# -- micro-sam's side --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def predictor(sam1_vit_b_spec, sam1_vit_b_checkpoint):
    return reference_predictor(sam1_vit_b_spec, sam1_vit_b_checkpoint)


@pytest.fixture(scope="module")
def embeddings(predictor):
    """micro-sam's tiled embeddings of tiles 0 and 3 only."""
    return tiled_embeddings(predictor, IMAGE, TILE, HALO, TILES)


def micro_sam_points(predictor, embeddings, name) -> tuple[np.ndarray, float]:
    points, labels = POINT_CASES[name]
    return segment_from_points(predictor, embeddings, points, labels)


def touches_an_inner_edge(mask: np.ndarray, block) -> bool:
    """The mask reaches a side of ``block`` beyond which the image goes on (it is cut)."""
    crop = mask[block.slices()]
    sides = (
        (crop[0], block.begin[0] > 0),
        (crop[-1], block.end[0] < SHAPE[0]),
        (crop[:, 0], block.begin[1] > 0),
        (crop[:, -1], block.end[1] < SHAPE[1]),
    )
    return any(edge.any() and image_goes_on for edge, image_goes_on in sides)


def test_the_tile_minmax_mapping_is_micro_sams_to_image():
    for tile_id in TILES:
        block = IMAGE[GRID.outer(tile_id).slices()]
        np.testing.assert_array_equal(to_sam_rgb(block), micro_sam().util._to_image(block))


def test_micro_sams_tiled_mask_is_sam_on_the_tiles_outer_block(predictor, embeddings):
    """The reference read right: micro-sam's mask for a prompt in tile 3 is the official
    predictor's on that tile's outer block, mapped by ``tile_minmax``, pasted at its offset."""
    from segment_anything import SamPredictor

    outer = GRID.outer(3)
    official = SamPredictor(predictor.model)
    official.set_image(to_sam_rgb(IMAGE[outer.slices()]))
    points, labels = POINT_CASES["clicks_tile_3"]
    xy = (np.asarray(points) - outer.begin)[:, ::-1].astype(np.float64)
    masks, scores, _ = official.predict(
        point_coords=xy, point_labels=np.asarray(labels), multimask_output=False
    )
    expected = np.zeros(SHAPE, bool)
    expected[outer.slices()] = masks[0]
    mask, score = micro_sam_points(predictor, embeddings, "clicks_tile_3")
    assert np.array_equal(mask, expected)
    assert score == pytest.approx(float(scores[0]), abs=1e-6)
    assert 0.01 < mask[outer.slices()].mean() < 0.99  # not degenerate: the IoUs mean something


# -- the server's side -------------------------------------------------------------------------
class LargeImage:
    """One image held by ``sam1_large``, spoken to as the contract says (plain HTTP infer)."""

    def __init__(self, url: str):
        import tritonclient.http as httpclient

        self.client = httpclient.InferenceServerClient(url)
        self.handle: str | None = None
        self.image: dict = {}

    def call(self, request: dict, pixels: np.ndarray | None = None) -> dict:
        import tritonclient.http as httpclient

        inputs = [httpclient.InferInput("request", [1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([json.dumps(request).encode()], dtype=object))
        if pixels is not None:  # [rows, cols, channels], in the input of its dtype
            pixels = pixels[..., None] if pixels.ndim == 2 else pixels
            dtype = {np.dtype(np.uint8): "UINT8", np.dtype(np.uint16): "UINT16"}[pixels.dtype]
            name = PIXEL_INPUTS[pixels.dtype.name]
            inputs.append(httpclient.InferInput(name, list(pixels.shape), dtype))
            inputs[1].set_data_from_numpy(pixels)
        result = self.client.infer(MODEL, inputs)
        return json.loads(result.as_numpy("answer")[0])

    def upload(self, image: np.ndarray, pieces: int = 2) -> None:
        """``create`` with micro-sam's tiling and mapping, then ``put`` in row bands."""
        self.image = self.call(
            {
                "op": "create",
                "shape": list(image.shape),
                "dtype": str(image.dtype),
                "mapping": {"kind": "tile_minmax"},
                "tile": list(TILE),
                "halo": list(HALO),
            }
        )
        self.handle = self.image["handle"]
        assert self.image["grid"] == list(GRID.blocks_per_axis) and not self.image["complete"]
        bands = np.array_split(np.arange(image.shape[0]), pieces)
        for band in bands:
            put = {"op": "put", "handle": self.handle, "offset": [int(band[0]), 0]}
            answer = self.call(put, np.ascontiguousarray(image[band[0] : band[-1] + 1]))
        assert answer["complete"] and answer["received"] == image.size

    def predict(self, **fields) -> dict:
        return self.call({"op": "predict", "handle": self.handle, **fields})

    def close(self) -> None:
        if self.handle is not None:
            self.call({"op": "close", "handle": self.handle})
        # An open keep-alive connection holds a stopping Triton for its whole exit timeout
        # (10 s: "Found 1 HTTP service connections" every second of this module's teardown).
        self.client.close()


@pytest.fixture(scope="module")
def large(sam1_vit_b_build):
    with contextmanager(module_server)(sam1_vit_b_build[0]) as server:  # tests/servers.py
        image = LargeImage(server.http_address)
        assert image.client.is_model_ready(MODEL), f"{MODEL} is not in the served repository"
        image.upload(IMAGE)
        yield image
        image.close()


def full_mask(answer_mask: dict) -> np.ndarray:
    """A mask of the answer (crop RLE + offset) as a full-image bool array."""
    out = np.zeros(SHAPE, bool)
    rows, cols = answer_mask["size"]
    if rows and cols:
        r, c = answer_mask["offset"]
        out[r : r + rows, c : c + cols] = decode_rle(answer_mask["counts"], (rows, cols))
    assert int(out.sum()) == answer_mask["area"]
    return out


_EMBEDDED_TILES: set[int] = set()  # tiles this module's handle has had embedded


def tile_answer(large, expected_tile: int, **fields) -> dict:
    """A ``tile``-mode prediction, checked to be answered on ``expected_tile`` and to have run
    the encoder once, the first time that tile is asked, and never after."""
    answer = large.predict(mode="tile", **fields)
    assert answer["mode"] == "tile" and answer["tiles"] == [expected_tile], answer
    assert answer["embedded"] == (0 if expected_tile in _EMBEDDED_TILES else 1), answer
    _EMBEDDED_TILES.add(expected_tile)
    assert answer["image_size"] == list(SHAPE)
    return answer


def assert_same_as_micro_sam(ours: dict, mask: np.ndarray, score: float, tile_id: int) -> None:
    got = full_mask(ours)
    outer = GRID.outer(tile_id)
    assert 0.01 < mask[outer.slices()].mean() < 0.99  # micro-sam's mask is not degenerate
    assert not got[~_block_mask(outer)].any()  # tile mode: the mask ends at the outer block
    assert iou(got, mask) >= MIN_IOU, (iou(got, mask), int(got.sum()), int(mask.sum()))
    assert ours["score"] == pytest.approx(score, abs=SCORE_ATOL)


def _block_mask(block) -> np.ndarray:
    inside = np.zeros(SHAPE, bool)
    inside[block.slices()] = True
    return inside


@pytest.mark.parametrize("name", list(POINT_CASES))
def test_points_in_a_tile_core_match_micro_sam(large, predictor, embeddings, name):
    points, labels = POINT_CASES[name]
    tile_id, kept = GRID.tile_of(np.asarray(points))
    # micro-sam's use_best_multimask: one positive point (counted after the points outside
    # the tile are dropped) asks three masks and keeps the best; the server answers best first.
    kept_labels = np.asarray(labels)[kept]
    best_of_three = bool(len(kept_labels) == 1 and kept_labels[0] == 1)
    answer = tile_answer(
        large,
        tile_id,
        points=[[c, r] for r, c in points],  # the contract's points are (x, y)
        labels=labels,
        multimask_output=best_of_three,
    )
    assert len(answer["masks"]) == (3 if best_of_three else 1)
    mask, score = micro_sam_points(predictor, embeddings, name)
    assert_same_as_micro_sam(answer["masks"][0], mask, score, tile_id)


@pytest.mark.parametrize("name", list(BOX_CASES))
def test_a_box_in_a_tile_core_matches_micro_sam(large, predictor, embeddings, name):
    r0, c0, r1, c1 = BOX_CASES[name]
    tile_id, _ = GRID.tile_of(np.array([[r0, c0], [r1, c1]]))  # the box's centre
    answer = tile_answer(large, tile_id, box=[c0, r0, c1, r1])
    mask, score = segment_from_box(predictor, embeddings, BOX_CASES[name])
    assert_same_as_micro_sam(answer["masks"][0], mask, score, tile_id)


def test_an_object_across_tiles_comes_back_whole(large, predictor, embeddings):
    """(c): a click on an object that crosses tiles. With random weights there are no
    objects, so the object is SAM's own mask (best of three, as a click asks) on a window
    holding the whole image: the official predictor on all of it, mapped as a window is
    (``tile_minmax`` over the window). Our ``auto`` mode must give it back (IoU >= 0.95);
    micro-sam's tiled answer, cut at tile 0's outer block, is printed beside it (measured:
    the object covers all four tile cores, micro-sam's IoU with it 0.066: random weights give
    masks that fill the frame they are given, so a cut frame keeps little of them)."""
    from segment_anything import SamPredictor

    assert all(w >= s for w, s in zip(large.image["window"], SHAPE, strict=True))
    official = SamPredictor(predictor.model)
    official.set_image(to_sam_rgb(IMAGE))
    xy = np.array([CROSSING_CLICK[::-1]], np.float64)
    masks, scores, _ = official.predict(
        point_coords=xy, point_labels=np.array([1]), multimask_output=True
    )
    reference = masks[int(np.argmax(scores))]
    crossed = [i for i in range(len(GRID)) if reference[GRID.core(i).slices()].any()]
    assert len(crossed) >= 2, crossed  # the object does cross tiles

    cut, cut_score = segment_from_points(predictor, embeddings, [list(CROSSING_CLICK)], [1])
    assert touches_an_inner_edge(cut, GRID.outer(0))  # micro-sam's mask is cut there
    # tile mode gives micro-sam's cut mask, and says it is cut
    click = dict(points=[xy[0].tolist()], labels=[1], multimask_output=True)
    in_tile = tile_answer(large, 0, **click)["masks"][0]
    assert in_tile["cut"]
    assert_same_as_micro_sam(in_tile, cut, cut_score, 0)

    answer = large.predict(**click)  # mode auto: the default
    assert answer["mode"] == "window" and not answer["masks"][0]["cut"], answer
    ours = full_mask(answer["masks"][0])
    ours_iou, micro_sam_iou = iou(ours, reference), iou(cut, reference)
    print(
        f"\n(c) object across tiles {crossed}: IoU with SAM on the window {ours_iou:.4f} "
        f"(auto mode), micro-sam's tile-cut mask {micro_sam_iou:.4f}"
    )
    assert ours_iou >= MIN_WINDOW_IOU
