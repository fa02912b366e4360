"""Prompt validation and decoder-input building (pure, no server)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from triton_sam.client import prompts
from triton_sam.errors import InputValidationError
from triton_sam.models import get_family

FAMILY = get_family("sam2")
HW = (427, 640)


def build(**kwargs):
    base = dict(point_coords=None, point_labels=None, box=None, mask_input=None)
    return prompts.build_decoder_prompts(**{**base, **kwargs}, orig_hw=HW, family=FAMILY)


def test_click_is_scaled_to_the_square_input_and_padded():
    out = build(point_coords=[[320, 213.5]], point_labels=[1])
    np.testing.assert_allclose(out["point_coords"][0], [[512, 512], [0, 0]], rtol=1e-6)
    np.testing.assert_array_equal(out["point_labels"], [[1, -1]])
    assert out["has_mask_input"].item() == 0.0
    assert out["mask_input"].shape == (1, 1, 256, 256)
    assert all(a.dtype == np.float32 for a in out.values())


def test_box_corners_come_first_labelled_2_3_then_clicks_then_padding():
    out = build(box=[64, 42.7, 320, 213.5], point_coords=[[10, 20]], point_labels=[0])
    np.testing.assert_array_equal(out["point_labels"], [[2, 3, 0, -1]])
    np.testing.assert_allclose(out["point_coords"][0, :2], [[102.4, 102.4], [512, 512]], rtol=1e-5)


def test_sam1_style_layout_puts_box_after_clicks_without_padding():
    sam1_like = dataclasses.replace(FAMILY, box_before_points=False, pad_with_box=False)
    out = prompts.build_decoder_prompts(
        point_coords=[[10, 20]],
        point_labels=[1],
        box=[64, 42.7, 320, 213.5],
        mask_input=None,
        orig_hw=HW,
        family=sam1_like,
    )
    np.testing.assert_array_equal(out["point_labels"], [[1, 2, 3]])
    only_clicks = prompts.build_decoder_prompts(
        point_coords=[[10, 20]],
        point_labels=[1],
        box=None,
        mask_input=None,
        orig_hw=HW,
        family=sam1_like,
    )
    np.testing.assert_array_equal(only_clicks["point_labels"], [[1, -1]])


def test_mask_input_sets_the_flag_and_accepts_all_upstream_shapes():
    for shape in [(256, 256), (1, 256, 256), (1, 1, 256, 256)]:
        out = build(point_coords=[[1, 1]], point_labels=[1], mask_input=np.ones(shape))
        assert out["has_mask_input"].item() == 1.0
        assert out["mask_input"].shape == (1, 1, 256, 256)


def test_batched_point_forms_are_accepted():
    out = build(point_coords=[[[5, 5], [6, 6]]], point_labels=[[1, 0]])
    assert out["point_coords"].shape == (1, 3, 2)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(), "point_coords"),
        (dict(point_coords=[[1, 1]]), "point_labels"),
        (dict(point_labels=[1]), "point_coords"),
        (dict(point_coords=[1, 1], point_labels=[1]), "point_coords"),
        (dict(point_coords=[[1, 1, 1]], point_labels=[1]), "point_coords"),
        (dict(point_coords=[[1, 1]], point_labels=[1, 0]), "point_labels"),
        (dict(point_coords=[[1, 1]], point_labels=[2]), "point_labels"),
        (dict(point_coords=[[np.nan, 1]], point_labels=[1]), "point_coords"),
        (dict(point_coords=[[np.inf, 1]], point_labels=[1]), "point_coords"),
        (dict(point_coords=[[641, 1]], point_labels=[1]), "point_coords"),
        (dict(point_coords=[[-1, 1]], point_labels=[1]), "point_coords"),
        (dict(point_coords=[["a", 1]], point_labels=[1]), "point_coords"),
        (dict(box=[10, 10, 5, 20]), "box"),
        (dict(box=[10, 10, 20]), "box"),
        (dict(box=[[0, 0, 5, 5], [1, 1, 6, 6]]), "box"),
        (dict(box=[0, 0, 700, 5]), "box"),
        (dict(point_coords=[[1, 1]], point_labels=[1], mask_input=np.ones((64, 64))), "mask_input"),
        (
            dict(point_coords=[[1, 1]], point_labels=[1], mask_input=np.full((256, 256), np.nan)),
            "mask_input",
        ),
    ],
)
def test_bad_prompts_raise_a_typed_error_naming_the_field(kwargs, field):
    with pytest.raises(InputValidationError) as info:
        build(**kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(field)


def test_output_names_follow_multimask_flag():
    assert prompts.output_names(False) == ("masks", "iou_predictions")
    assert prompts.output_names(True) == ("multimask_masks", "multimask_iou_predictions")
    with pytest.raises(InputValidationError, match="multimask_output"):
        prompts.output_names("yes")  # type: ignore[arg-type]
