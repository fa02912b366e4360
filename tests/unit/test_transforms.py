"""The client's image_io, model_frame and postprocess without torch: image loading, geometry,
validation errors.

Parity with the upstream torch code lives in tests/parity/test_transforms_parity.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from triton_sam.client import image_io, model_frame, postprocess
from triton_sam.errors import ConfigError, InputValidationError
from triton_sam.models import get_family
from triton_sam.models.spec import Preprocessing

SAM2_PRE = get_family("sam2").preprocessing
SAM1_PRE = Preprocessing(
    image_size=1024,
    resize="longest_side",
    pixel_mean=(123.675, 116.28, 103.53),
    pixel_std=(58.395, 57.12, 57.375),
    pixel_scale=1.0,
    mask_size=256,
)


def _rgb(h: int = 4, w: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _raises(field: str, func, *args) -> InputValidationError:
    """Call func(*args), expect InputValidationError for ``field``, return it."""
    with pytest.raises(InputValidationError) as info:
        func(*args)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    return info.value


def test_transforms_module_does_not_import_torch():
    names = ("image_io", "model_frame", "postprocess")
    modules = ", ".join(f"triton_sam.client.{m}" for m in names)
    code = f"import sys, {modules}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# -- load_image: accepted inputs ----------------------------------------------------------------
def test_contiguous_array_is_returned_without_a_copy():
    rgb = _rgb()
    assert np.shares_memory(image_io.load_image(rgb), rgb)


def test_strided_array_is_made_contiguous():
    flipped = _rgb()[:, ::-1]
    out = image_io.load_image(flipped)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, flipped)


@pytest.mark.parametrize("as_type", [str, Path])
def test_png_path_loads_exactly(tmp_path, as_type):
    rgb = _rgb(5, 7)
    path = tmp_path / "img.png"
    Image.fromarray(rgb).save(path)
    out = image_io.load_image(as_type(path))
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, rgb)


def test_exif_orientation_is_applied_to_files(tmp_path):
    rgb = _rgb(2, 3)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the viewer rotates 90 degrees clockwise
    path = tmp_path / "rotated.png"
    Image.fromarray(rgb).save(path, exif=exif)
    out = image_io.load_image(path)
    np.testing.assert_array_equal(out, np.rot90(rgb, k=-1))


def test_grayscale_becomes_three_equal_channels():
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    out = image_io.load_image(Image.fromarray(gray))
    assert out.shape == (3, 4, 3)
    np.testing.assert_array_equal(out, np.repeat(gray[..., None], 3, axis=-1))


def test_binary_image_becomes_black_and_white():
    out = image_io.load_image(Image.fromarray(np.array([[True, False]])))
    np.testing.assert_array_equal(out[..., 0], [[255, 0]])


def test_rgba_drops_alpha_without_compositing():
    rgba = np.array([[[10, 20, 30, 0], [40, 50, 60, 128]]], dtype=np.uint8)
    out = image_io.load_image(Image.fromarray(rgba))
    np.testing.assert_array_equal(out, rgba[..., :3])


def test_palette_image_maps_through_its_palette():
    img = Image.new("P", (2, 1))
    img.putpalette([0, 0, 0, 200, 100, 50] + [0] * (256 * 3 - 6))
    img.putpixel((1, 0), 1)
    out = image_io.load_image(img)
    np.testing.assert_array_equal(out, [[[0, 0, 0], [200, 100, 50]]])


def test_cmyk_is_converted_to_rgb():
    img = Image.new("CMYK", (1, 1), (0, 255, 255, 0))  # pure red in CMYK
    np.testing.assert_array_equal(image_io.load_image(img), [[[255, 0, 0]]])


SIXTEEN_BIT = np.array([[0, 128, 129, 257, 128 * 257, 65534, 65535]], dtype=np.uint16)
EIGHT_BIT = np.array([[0, 0, 1, 1, 128, 255, 255]], dtype=np.uint8)  # round(v / 257)


def test_16_bit_pil_image_is_scaled_not_clipped():
    out = image_io.load_image(Image.fromarray(SIXTEEN_BIT))
    np.testing.assert_array_equal(out, np.repeat(EIGHT_BIT[..., None], 3, axis=-1))


def test_16_bit_png_file_is_scaled_not_clipped(tmp_path):
    path = tmp_path / "deep.png"
    Image.fromarray(SIXTEEN_BIT).save(path)
    np.testing.assert_array_equal(image_io.load_image(path)[..., 1], EIGHT_BIT)


def test_32_bit_integer_image_is_read_as_16_bit_and_clipped():
    wide = np.array([[-5, 257, 70000]], dtype=np.int32)
    out = image_io.load_image(Image.fromarray(wide))
    np.testing.assert_array_equal(out[..., 2], [[0, 1, 255]])


# -- load_image: errors -------------------------------------------------------------------------
def test_missing_file_is_rejected(tmp_path):
    err = _raises("image", image_io.load_image, tmp_path / "nope.png")
    assert "nope.png" in str(err)


def test_directory_is_rejected(tmp_path):
    _raises("image", image_io.load_image, tmp_path)


def test_non_image_file_is_rejected(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("not an image")
    err = _raises("image", image_io.load_image, str(path))
    assert "cannot read" in str(err)


def test_truncated_file_is_rejected(tmp_path):
    path = tmp_path / "cut.png"
    Image.fromarray(_rgb(64, 64)).save(path)
    path.write_bytes(path.read_bytes()[:200])
    _raises("image", image_io.load_image, path)


@pytest.mark.parametrize("value", [None, 3, [[1, 2, 3]], b"\x89PNG"])
def test_unsupported_types_are_rejected(value):
    err = _raises("image", image_io.load_image, value)
    assert type(value).__name__ in str(err) and "expected" in str(err)


@pytest.mark.parametrize(
    ("shape", "hint"),
    [((4, 6), "shape (4, 6)"), ((4, 6, 4), "[..., :3]"), ((4, 6, 1), "HxWx3"), ((1, 4, 6, 3), "")],
)
def test_array_with_wrong_shape_is_rejected(shape, hint):
    err = _raises("image", image_io.load_image, np.zeros(shape, np.uint8))
    assert hint in str(err)


@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.int64, bool])
def test_array_with_wrong_dtype_is_rejected(dtype):
    err = _raises("image", image_io.load_image, np.zeros((4, 6, 3), dtype))
    assert np.dtype(dtype).name in str(err) and "uint8" in str(err)


@pytest.mark.parametrize("shape", [(0, 6, 3), (4, 0, 3)])
def test_empty_array_is_rejected(shape):
    err = _raises("image", image_io.load_image, np.zeros(shape, np.uint8))
    assert "empty" in str(err)


def test_empty_pil_image_is_rejected():
    err = _raises("image", image_io.load_image, Image.new("RGB", (0, 5)))
    assert "empty" in str(err)


def test_float_pil_image_is_rejected():
    err = _raises("image", image_io.load_image, Image.new("F", (3, 3)))
    assert "'F'" in str(err)


# -- preprocess -----------------------------------------------------------------------------
@pytest.mark.parametrize("pre", [SAM2_PRE, SAM1_PRE], ids=["square", "longest_side"])
def test_preprocess_returns_a_batched_float32_square(pre):
    out = model_frame.preprocess(_rgb(427, 640), pre)
    assert out.shape == (1, 3, 1024, 1024) and out.dtype == np.float32
    assert out.flags.c_contiguous


@pytest.mark.parametrize("size", [1024, 1008])
def test_square_preprocess_of_a_flat_image_is_the_normalised_colour(size):
    # Resize weights sum to 1, so a flat colour stays flat: (c * scale - mean) / std.
    pre = Preprocessing(size, "square", SAM2_PRE.pixel_mean, SAM2_PRE.pixel_std, 1 / 255, 256)
    colour = np.array([200, 100, 50], np.uint8)
    out = model_frame.preprocess(np.broadcast_to(colour, (300, 700, 3)).copy(), pre)
    expected = (colour / 255 - np.array(pre.pixel_mean)) / np.array(pre.pixel_std)
    np.testing.assert_allclose(
        out[0], np.broadcast_to(expected[:, None, None], out[0].shape), atol=1e-6
    )


def test_longest_side_preprocess_pads_bottom_right_with_zeros_after_normalising():
    out = model_frame.preprocess(np.zeros((427, 640, 3), np.uint8), SAM1_PRE)
    new_h = 683  # int(427 * 1024 / 640 + 0.5)
    black = -np.array(SAM1_PRE.pixel_mean) / np.array(SAM1_PRE.pixel_std)
    np.testing.assert_allclose(out[0, :, :new_h, :].mean(axis=(1, 2)), black, rtol=1e-6)
    assert np.all(out[0, :, new_h:, :] == 0)


def test_preprocess_rejects_what_load_image_would_have_fixed():
    _raises("image", model_frame.preprocess, Image.new("RGB", (4, 4)), SAM2_PRE)
    _raises("image", model_frame.preprocess, np.zeros((4, 4, 4), np.uint8), SAM2_PRE)
    _raises("image", model_frame.preprocess, np.zeros((4, 4, 3), np.float32), SAM2_PRE)


def test_longest_side_rejects_an_image_too_thin_to_resize():
    # 1 x 3000: the short side becomes int(1024 / 3000 + 0.5) = 0 pixels.
    err = _raises("image", model_frame.preprocess, np.zeros((1, 3000, 3), np.uint8), SAM1_PRE)
    assert "0 pixels" in str(err)


def test_every_registered_family_has_its_upstream_rule():
    from triton_sam.models.registry import family_names, get_family

    expected = {"sam1": model_frame.SamPredictorRule, "sam2": model_frame.Sam2TransformsRule}
    for name in family_names():
        rule = model_frame.resize_rule(get_family(name).preprocessing)
        if name in expected:
            assert type(rule) is expected[name]
        elif name.startswith("sam3"):
            assert type(rule) is model_frame.Sam3ProcessorRule


def test_unknown_resize_rule_is_a_config_error():
    bad = Preprocessing(1024, "stretch", (0, 0, 0), (1, 1, 1), 1.0, 256)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="resize"):
        model_frame.preprocess(_rgb(), bad)


# -- coordinates --------------------------------------------------------------------------------
def test_square_coords_scale_each_axis_by_its_own_side():
    out = model_frame.transform_coords(np.array([[320.0, 213.5], [0, 427]]), (427, 640), SAM2_PRE)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[512, 512], [0, 1024]], rtol=1e-6)


def test_longest_side_coords_scale_both_axes_to_the_resized_image():
    # 427x640 -> 683x1024: x * 1024 / 640, y * 683 / 427.
    out = model_frame.transform_coords([[640.0, 427.0]], (427, 640), SAM1_PRE)
    np.testing.assert_allclose(out, [[1024, 683]], rtol=1e-6)
    assert model_frame.resized_hw((427, 640), SAM1_PRE) == (683, 1024)
    assert model_frame.resized_hw((427, 640), SAM2_PRE) == (1024, 1024)


def test_boxes_become_corner_point_pairs():
    out = model_frame.transform_boxes([64, 42.7, 320, 213.5], (427, 640), SAM2_PRE)
    assert out.shape == (1, 2, 2) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], [[102.4, 102.4], [512, 512]], rtol=1e-5)
    assert model_frame.transform_boxes(np.zeros((3, 4)), (427, 640), SAM2_PRE).shape == (3, 2, 2)


@pytest.mark.parametrize(
    "coords",
    [np.zeros((2, 3)), [[1.0, np.nan]], [["a", "b"]], 5.0],
    ids=["Nx3", "nan", "str", "0d"],
)
def test_bad_coords_are_rejected(coords):
    _raises("coords", model_frame.transform_coords, coords, (427, 640), SAM2_PRE)


@pytest.mark.parametrize("boxes", [np.zeros((2, 2)), [[0, 0, np.inf, 1]], "box"])
def test_bad_boxes_are_rejected(boxes):
    _raises("boxes", model_frame.transform_boxes, boxes, (427, 640), SAM2_PRE)


@pytest.mark.parametrize("orig_hw", [(0, 640), (427, -1), ("a", 2), None, (1, 2, 3)])
def test_bad_orig_hw_is_rejected(orig_hw):
    _raises("orig_hw", model_frame.transform_coords, [[1.0, 1.0]], orig_hw, SAM2_PRE)
    _raises("orig_hw", postprocess.postprocess_masks, np.zeros((1, 1, 4, 4)), orig_hw, SAM2_PRE)


# -- postprocess --------------------------------------------------------------------------------
def test_bilinear_upsampling_uses_half_pixel_centres_and_clamps_at_the_edges():
    # align_corners=False, 2 -> 4: sources -0.25 (clamped to 0), 0.25, 0.75, 1.25 (last pixel).
    low = np.array([[[[0.0, 4.0], [0.0, 4.0]]]], np.float32)
    out = postprocess.postprocess_masks(low, (2, 4), SAM2_PRE)
    np.testing.assert_allclose(out[0, 0], [[0, 1, 3, 4], [0, 1, 3, 4]], atol=1e-6)


@pytest.mark.parametrize("pre", [SAM2_PRE, SAM1_PRE], ids=["square", "longest_side"])
def test_postprocess_shape_dtype_and_flat_logits_stay_flat(pre):
    low = np.full((2, 3, 256, 256), -7.5, np.float32)
    out = postprocess.postprocess_masks(low, (3000, 4000), pre)
    assert out.shape == (2, 3, 3000, 4000) and out.dtype == np.float32
    # A convex combination of equal values is that value up to the rounding of its two
    # products and one sum: BLAS kernels that fuse the multiply-add (chosen per CPU) land 1 ulp
    # off (-7.4999995 on some machines), so exact equality tested the CPU, not the resize.
    np.testing.assert_array_max_ulp(out, np.full_like(out, -7.5), maxulp=1)


def test_longest_side_postprocess_drops_the_padding():
    # 427x640 fills the top 683 rows of the 1024 frame. Logits are +1 there and -1 from
    # low-res row 171 (frame rows 684+); only the last 2 original rows, which blend frame
    # row 682 with the padding as upstream does, may dip below 1.
    low = np.full((1, 1, 256, 256), 1.0, np.float32)
    low[..., 171:, :] = -1.0
    out = postprocess.postprocess_masks(low, (427, 640), SAM1_PRE)
    assert out[..., :-2, :].min() > 0.99


def test_postprocess_at_the_same_size_returns_a_copy():
    low = np.random.default_rng(0).standard_normal((1, 1, 256, 256)).astype(np.float32)
    out = postprocess.postprocess_masks(low, (256, 256), SAM2_PRE)
    np.testing.assert_array_equal(out, low)
    assert not np.shares_memory(out, low)


@pytest.mark.parametrize(
    "logits",
    [np.zeros((3, 256, 256)), np.zeros((1, 0, 256, 256)), [["x"]]],
    ids=["3d", "empty", "str"],
)
def test_bad_logits_are_rejected(logits):
    _raises("low_res_logits", postprocess.postprocess_masks, logits, (427, 640), SAM2_PRE)


def test_clamp_low_res_clips_to_32():
    out = postprocess.clamp_low_res(np.array([-100.0, -5.0, 0.0, 31.5, 1e6]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [-32, -5, 0, 31.5, 32])


def test_clamp_low_res_without_limit_only_casts_as_sam_predictor():
    out = postprocess.clamp_low_res(np.array([-100.0, 0.0, 1e6]), None)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [-100, 0, 1e6])


@pytest.mark.parametrize("family, expected", [("sam1", 100.0), ("sam2", 32.0)])
def test_prediction_returns_low_res_logits_as_the_familys_predictor(family, expected):
    from triton_sam.client.prediction import make_prediction

    low = np.full((1, 1, 256, 256), 100.0, np.float32)
    pred = make_prediction(low, np.ones((1, 1)), (64, 48), get_family(family).preprocessing)
    assert pred.low_res_logits.max() == expected
    assert pred.masks.shape == (1, 1, 64, 48)
