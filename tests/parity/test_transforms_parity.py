"""The client's image_io, model_frame and postprocess (numpy + PIL) against the upstream torch
code paths they reproduce.

SAM2 ("square"): ``sam2.utils.transforms.SAM2Transforms`` (ToTensor, torchvision Resize with
antialias, Normalize; transform_coords/boxes; postprocess_masks = F.interpolate).
SAM1 ("longest_side"): ``segment_anything`` ``ResizeLongestSide`` + ``Sam.preprocess`` /
``Sam.postprocess_masks``, called on a stub holding pixel_mean/std and img_size.

Tolerances (stated, tight; measured on CPU in parentheses):
- preprocess, square: max abs diff <= 5e-6 in normalised units (<= 8.3e-7 at 1024 and
  3.6e-7 at 1008: float32 rounding; PIL's float resize, whose weights are float64, is
  off by up to 1.8e-5 at 1008 and fails this).
- preprocess, longest_side: <= 5e-6 (0: same PIL uint8 resize, same float32 arithmetic).
- coordinates: <= 1e-4 px in the 1024 frame, i.e. at most one float32 ulp (0 measured).
- postprocess (mask upsampling), two assertions:
  1. values: max abs diff <= LOGIT_ULPS (4) float32 ulps of the largest |logit| in the
     reference, i.e. 1.5e-5 at |logit| ~46 (measured: 2 ulps, 7.6e-6). Stated in ulps of the
     magnitude because that is what float32 reordering changes: our separable banded matmuls
     sum the two taps of each axis in another order than torch's fused 4-term sum, and each
     rounding moves the result by at most half an ulp of the magnitude.
  2. decisions: the binary masks (logit > 0) disagree on at most MASK_FLIP_FRACTION (1e-5)
     of the pixels: only logits within a few ulps of 0 may flip.
  Both fail for a real bug: a half-pixel offset, a wrong crop or size moves values by a
  sizeable fraction of the neighbours' difference (test_a_shifted_grid_fails_both_checks).
  Why not 5e-5 absolute as before: torch's vectorised CPU kernels (AVX2/AVX512, what this
  machine and CI dispatch to) compute the source coordinate with a fused multiply-add; its
  scalar fallback (ATEN_CPU_CAPABILITY=default) rounds twice. The two differ by one float32
  ulp of the coordinate for some outputs, up to 3.4e-4 on these random logits. We follow the
  fused form (see serving.resample._bilinear_taps); the old absolute bound hid which one we matched.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from triton_sam.client import image_io, model_frame, postprocess
from triton_sam.models import get_family
from triton_sam.models.spec import Preprocessing
from triton_sam.serving import resample
from triton_sam.tools.sample import sample_image

# The upstream packages are the reference: without them there is nothing to compare to.
torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
sam2_transforms = pytest.importorskip("sam2.utils.transforms")
pytest.importorskip("segment_anything")
import torch.nn.functional as F  # noqa: E402
from segment_anything.modeling import Sam  # noqa: E402
from segment_anything.utils.transforms import ResizeLongestSide  # noqa: E402
from torchvision.transforms import Normalize, Resize, ToTensor  # noqa: E402

PREPROCESS_ATOL = 5e-6
COORD_ATOL = 1e-4
LOGIT_ULPS = 4
MASK_FLIP_FRACTION = 1e-5

SAM2_PRE = get_family("sam2").preprocessing
# segment_anything/build_sam.py: ImageEncoderViT(img_size=1024), Sam(pixel_mean, pixel_std).
SAM1_MEAN = (123.675, 116.28, 103.53)
SAM1_STD = (58.395, 57.12, 57.375)
SAM1_PRE = Preprocessing(
    image_size=1024,
    resize="longest_side",
    pixel_mean=SAM1_MEAN,
    pixel_std=SAM1_STD,
    pixel_scale=1.0,
    mask_size=256,
)
SAM1_STUB = SimpleNamespace(
    pixel_mean=torch.Tensor(SAM1_MEAN).view(-1, 1, 1),
    pixel_std=torch.Tensor(SAM1_STD).view(-1, 1, 1),
    image_encoder=SimpleNamespace(img_size=1024),
)


def _random(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# (name, HxWx3 uint8): downscaling, upscaling, non-square both ways, identity, tiny.
IMAGES = {
    "random_2000x1500_down": _random(1500, 2000),
    "natural_2000x1500_down": sample_image(2000, 1500),
    "natural_640x427_up": sample_image(640, 427),
    "random_640x427_up": _random(427, 640, seed=1),
    "random_333x1777_tall": _random(1777, 333, seed=2),
    "random_1024x1024_same": _random(1024, 1024, seed=3),
    "random_7x5_tiny": _random(5, 7, seed=4),
    "random_1x1_pixel": _random(1, 1, seed=5),
    "random_3000x1_line": _random(1, 3000, seed=6),
}


def _hw_id(hw: tuple[int, int]) -> str:
    return f"{hw[1]}x{hw[0]}"  # W x H, like the image names


def _logit_mismatch(ours: np.ndarray, ref: np.ndarray) -> list[str]:
    """What breaks the two postprocess checks (empty when ours agrees with the reference)."""
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    problems = []
    atol = LOGIT_ULPS * float(np.spacing(np.float32(np.abs(ref).max())))
    diff = _max_diff(ours, ref)
    if diff > atol:
        problems.append(f"max abs diff {diff:.3g} > {LOGIT_ULPS} ulps ({atol:.3g})")
    flips = float(np.mean((ours > 0) != (ref > 0)))
    if flips > MASK_FLIP_FRACTION:
        problems.append(f"binary masks differ on {flips:.3g} of pixels > {MASK_FLIP_FRACTION}")
    return problems


def _max_diff(ours: np.ndarray, ref: np.ndarray) -> float:
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return float(np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max())


@pytest.fixture(scope="module")
def sam2_tf():
    return sam2_transforms.SAM2Transforms(resolution=1024, mask_threshold=0.0)


# -- preprocessing ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(IMAGES))
def test_square_preprocess_matches_sam2_transforms(name, sam2_tf):
    image = IMAGES[name]
    ref = sam2_tf(image)[None].numpy()
    ours = model_frame.preprocess(image, SAM2_PRE)
    assert ours.dtype == np.float32 and ours.flags.c_contiguous
    assert _max_diff(ours, ref) <= PREPROCESS_ATOL


def test_square_preprocess_of_a_pil_image_matches_sam2_transforms(sam2_tf):
    from PIL import Image

    pil = Image.fromarray(IMAGES["natural_640x427_up"])
    ref = sam2_tf(pil)[None].numpy()
    ours = model_frame.preprocess(image_io.load_image(pil), SAM2_PRE)
    assert _max_diff(ours, ref) <= PREPROCESS_ATOL


@pytest.mark.parametrize("name", ["natural_2000x1500_down", "natural_640x427_up"])
def test_square_preprocess_follows_the_spec_size_and_stats(name):
    # SAM3 tracker geometry: 1008 square, mean/std 0.5 on [0, 1].
    pre = Preprocessing(1008, "square", (0.5,) * 3, (0.5,) * 3, 1.0 / 255.0, 252)
    pipeline = torch.nn.Sequential(Resize((1008, 1008)), Normalize([0.5] * 3, [0.5] * 3))
    image = IMAGES[name]
    ref = pipeline(ToTensor()(image))[None].numpy()
    assert _max_diff(model_frame.preprocess(image, pre), ref) <= PREPROCESS_ATOL


# A 3000x1 line has no longest-side resize (its short side rounds to 0 px): unit-tested.
@pytest.mark.parametrize("name", [n for n in IMAGES if n != "random_3000x1_line"])
def test_longest_side_preprocess_matches_segment_anything(name):
    image = IMAGES[name]
    resized = ResizeLongestSide(1024).apply_image(image)
    x = torch.as_tensor(resized).permute(2, 0, 1).contiguous()[None]
    ref = Sam.preprocess(SAM1_STUB, x).numpy()
    ours = model_frame.preprocess(image, SAM1_PRE)
    assert ours.dtype == np.float32
    assert _max_diff(ours, ref) <= PREPROCESS_ATOL


# -- prompts ------------------------------------------------------------------------------------
HW_CASES = [(427, 640), (1500, 2000), (1777, 333), (5, 7)]


@pytest.mark.parametrize("hw", HW_CASES, ids=_hw_id)
def test_square_coords_and_boxes_match_sam2_transforms(hw, sam2_tf):
    h, w = hw
    rng = np.random.default_rng(5)
    points = rng.uniform(0, 1, (2, 7, 2)) * [w, h]
    boxes = np.sort(rng.uniform(0, 1, (4, 2, 2)) * [w, h], axis=1).reshape(4, 4)
    ref_pts = sam2_tf.transform_coords(
        torch.as_tensor(points, dtype=torch.float), normalize=True, orig_hw=hw
    ).numpy()
    ref_box = sam2_tf.transform_boxes(
        torch.as_tensor(boxes, dtype=torch.float), normalize=True, orig_hw=hw
    ).numpy()
    ours_pts = model_frame.transform_coords(points, hw, SAM2_PRE)
    ours_box = model_frame.transform_boxes(boxes, hw, SAM2_PRE)
    assert ours_pts.dtype == np.float32 and ours_box.shape == (4, 2, 2)
    assert _max_diff(ours_pts, ref_pts) <= COORD_ATOL
    assert _max_diff(ours_box, ref_box) <= COORD_ATOL


@pytest.mark.parametrize("hw", HW_CASES, ids=_hw_id)
def test_longest_side_coords_and_boxes_match_resize_longest_side(hw):
    h, w = hw
    rng = np.random.default_rng(6)
    points = rng.uniform(0, 1, (7, 2)) * [w, h]
    boxes = np.sort(rng.uniform(0, 1, (4, 2, 2)) * [w, h], axis=1).reshape(4, 4)
    tf = ResizeLongestSide(1024)
    # SamPredictor feeds these to the model as float32.
    ref_pts = tf.apply_coords(points, hw).astype(np.float32)
    ref_box = tf.apply_boxes(boxes, hw).astype(np.float32).reshape(-1, 2, 2)
    assert _max_diff(model_frame.transform_coords(points, hw, SAM1_PRE), ref_pts) <= COORD_ATOL
    assert _max_diff(model_frame.transform_boxes(boxes, hw, SAM1_PRE), ref_box) <= COORD_ATOL


@pytest.mark.parametrize("hw", HW_CASES, ids=_hw_id)
def test_longest_side_resized_hw_matches_get_preprocess_shape(hw):
    expected = ResizeLongestSide.get_preprocess_shape(hw[0], hw[1], 1024)
    assert model_frame.resized_hw(hw, SAM1_PRE) == expected


# -- postprocessing -----------------------------------------------------------------------------
# Up (typical), large (4000x3000 photo), down (smaller than 256), identity, 1 pixel.
POST_HW = [(427, 640), (3000, 4000), (100, 80), (256, 256), (1, 1), (1777, 333)]


def _logits(batch: int, masks: int, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (10 * rng.standard_normal((batch, masks, 256, 256))).astype(np.float32)


@pytest.mark.parametrize("hw", POST_HW, ids=_hw_id)
def test_square_postprocess_matches_sam2_transforms(hw, sam2_tf):
    batch, masks = (1, 1) if hw == (3000, 4000) else (2, 3)
    low = _logits(batch, masks)
    ref = sam2_tf.postprocess_masks(torch.from_numpy(low), hw).numpy()
    ours = postprocess.postprocess_masks(low, hw, SAM2_PRE)
    assert ours.dtype == np.float32 and ours.shape == (batch, masks, *hw)
    assert _logit_mismatch(ours, ref) == []


@pytest.mark.parametrize("hw", POST_HW, ids=_hw_id)
def test_longest_side_postprocess_matches_sam(hw):
    batch, masks = (1, 1) if hw == (3000, 4000) else (2, 3)
    low = _logits(batch, masks, seed=8)
    input_size = ResizeLongestSide.get_preprocess_shape(hw[0], hw[1], 1024)
    ref = Sam.postprocess_masks(SAM1_STUB, torch.from_numpy(low), input_size, hw).numpy()
    ours = postprocess.postprocess_masks(low, hw, SAM1_PRE)
    assert ours.shape == (batch, masks, *hw)
    assert _logit_mismatch(ours, ref) == []


def test_square_postprocess_matches_plain_interpolate_for_other_mask_sizes():
    # SAM3's decoder returns 252x252 (1008 / 4); the same interpolation applies.
    low = (10 * np.random.default_rng(9).standard_normal((1, 3, 252, 252))).astype(np.float32)
    ref = F.interpolate(torch.from_numpy(low), (427, 640), mode="bilinear", align_corners=False)
    pre = Preprocessing(1008, "square", (0.5,) * 3, (0.5,) * 3, 1.0 / 255.0, 252)
    assert _logit_mismatch(postprocess.postprocess_masks(low, (427, 640), pre), ref.numpy()) == []


def _shifted_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear taps with a classic bug: the half-pixel centre offset left out."""
    scale = np.float32(in_size) / np.float32(out_size)
    src = np.minimum(scale * np.arange(out_size, dtype=np.float32), np.float32(in_size - 1))
    start = np.minimum(src.astype(np.int64), in_size - 2)
    frac = src - start.astype(np.float32)
    return start, np.stack([1 - frac, frac], axis=1).astype(np.float32)


@pytest.mark.parametrize("hw", [(427, 640), (1777, 333)], ids=_hw_id)
def test_a_shifted_grid_fails_both_checks(hw, sam2_tf, monkeypatch):
    # The checks must be sharp enough to see a half-pixel offset, not only a wrong size.
    low = _logits(1, 3)
    ref = sam2_tf.postprocess_masks(torch.from_numpy(low), hw).numpy()
    monkeypatch.setattr(resample, "_bilinear_taps", _shifted_taps)
    problems = _logit_mismatch(postprocess.postprocess_masks(low, hw, SAM2_PRE), ref)
    assert len(problems) == 2, problems


def test_a_crop_off_by_one_pixel_fails_both_checks(monkeypatch):
    # SAM1 crops the unpadded region before the last resize; one row too many must show.
    hw = (427, 640)
    low = _logits(1, 3, seed=8)
    input_size = ResizeLongestSide.get_preprocess_shape(hw[0], hw[1], 1024)
    ref = Sam.postprocess_masks(SAM1_STUB, torch.from_numpy(low), input_size, hw).numpy()
    wrong = (input_size[0] + 1, 1024)
    monkeypatch.setattr(model_frame.SamPredictorRule, "resized_hw", lambda self, hw, size: wrong)
    problems = _logit_mismatch(postprocess.postprocess_masks(low, hw, SAM1_PRE), ref)
    assert len(problems) == 2, problems


def test_clamp_low_res_matches_sam2_image_predictor():
    low = 20 * _logits(1, 3)
    ref = torch.clamp(torch.from_numpy(low), -32.0, 32.0).numpy()
    np.testing.assert_array_equal(postprocess.clamp_low_res(low), ref)
