"""The Label Studio backend's pure protocol code: labeling configs, interactive context in
percent -> pixels, our brush RLE, polygons, result regions, token -> tenant (no server, no I/O).

The request shapes are Label Studio's (HumanSignal/label-studio 1.23.2
``label_studio/ml/api_connector.py`` ``_prep_prediction_req`` and ``setup``); the region fields
those its frontend sends for smart keypoints and rectangles, as the SAM examples read them
(HumanSignal/label-studio-ml-backend
``label_studio_ml/examples/segment_anything_2_image/model.py`` ``predict``).
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from triton_sam.errors import InputValidationError
from triton_sam.label_studio.auth import TokenTenants, Unauthenticated
from triton_sam.label_studio.config import parse_labeling_config
from triton_sam.label_studio.polygon import largest_outline
from triton_sam.label_studio.prompts import parse_context
from triton_sam.label_studio.results import mask_regions
from triton_sam.label_studio.rle import decode_mask, encode_mask

BRUSH_CONFIG = """<View>
  <Image name="image" value="$image" zoom="true"/>
  <BrushLabels name="tag" toName="image">
    <Label value="Cell" background="#FF0000"/><Label value="Nucleus" background="#0000FF"/>
  </BrushLabels>
  <KeyPointLabels name="tag2" toName="image" smart="true">
    <Label value="Cell" smart="true"/><Label value="Nucleus" smart="true"/>
  </KeyPointLabels>
  <RectangleLabels name="tag3" toName="image" smart="true">
    <Label value="Cell"/>
  </RectangleLabels>
</View>"""
POLYGON_CONFIG = """<View>
  <Image name="img" value="$url"/>
  <PolygonLabels name="poly" toName="img"><Label value="Cell"/></PolygonLabels>
  <RectangleLabels name="box" toName="img" smart="true"><Label value="Cell"/></RectangleLabels>
</View>"""


def keypoint(x: float, y: float, *, positive: bool = True, w: int = 320, h: int = 256) -> dict:
    return {
        "original_width": w,
        "original_height": h,
        "image_rotation": 0,
        "value": {"x": x, "y": y, "width": 0.6, "keypointlabels": ["Cell"]},
        "is_positive": positive,
        "id": "k1",
        "from_name": "tag2",
        "to_name": "image",
        "type": "keypointlabels",
        "origin": "manual",
    }


def rectangle(x: float, y: float, width: float, height: float, **extra) -> dict:
    value = {"x": x, "y": y, "width": width, "height": height, "rotation": 0}
    value.update(extra.pop("value", {}))
    region = {
        "original_width": 320,
        "original_height": 256,
        "image_rotation": 0,
        "value": {**value, "rectanglelabels": ["Cell"]},
        "type": "rectanglelabels",
        "from_name": "tag3",
        "to_name": "image",
    }
    region.update(extra)
    return region


# -- labeling config ---------------------------------------------------------------------------
def test_a_sam_brush_config_is_read():
    config = parse_labeling_config(BRUSH_CONFIG)
    assert (config.image_name, config.image_key) == ("image", "image")
    assert (config.output, config.output_name, config.result_type) == (
        "brush",
        "tag",
        "brushlabels",
    )
    assert config.output_labels == ("Cell", "Nucleus")
    assert config.prompt_names == ("tag2", "tag3")


def test_a_polygon_config_is_read():
    config = parse_labeling_config(POLYGON_CONFIG)
    assert (config.output, config.output_name, config.image_key) == ("polygon", "poly", "url")


@pytest.mark.parametrize(
    ("xml", "says"),
    [
        ('<View><Text name="t" value="$text"/></View>', "no <Image"),
        (
            '<View><Image name="i" value="$image"/><KeyPointLabels name="k" toName="i"/></View>',
            "controls on the image: KeyPointLabels",
        ),
        (
            '<View><Image name="i" value="$image"/><BrushLabels name="b" toName="i"/></View>',
            "controls on the image: BrushLabels",
        ),
        ("<View><Image", "not well-formed XML"),
        ('<!DOCTYPE x [<!ENTITY a "b">]><View/>', "a DTD or entity"),
        ("", "expected the labeling config"),
    ],
    ids=["no_image", "no_output", "no_prompt", "broken", "dtd", "empty"],
)
def test_an_unusable_config_is_refused_naming_the_field(xml, says):
    with pytest.raises(InputValidationError, match=f"^schema: .*{says}") as e:
        parse_labeling_config(xml, field="schema")
    assert e.value.field == "schema"


# -- interactive context -----------------------------------------------------------------------
def test_keypoints_in_percent_become_pixels_of_the_original_size():
    prompt = parse_context({"result": [keypoint(25.0, 50.0), keypoint(10.0, 12.5, positive=False)]})
    assert prompt is not None
    np.testing.assert_array_equal(prompt.points, [[80.0, 128.0], [32.0, 32.0]])
    np.testing.assert_array_equal(prompt.labels, [1, 0])
    assert prompt.box is None and prompt.size == (320, 256) and prompt.label == "Cell"
    assert not prompt.multimask  # two clicks: one mask


def test_a_rectangle_becomes_a_corner_box_and_a_lone_click_asks_for_three_masks():
    prompt = parse_context({"result": [rectangle(10.0, 25.0, 50.0, 50.0)]})
    np.testing.assert_array_equal(prompt.box, [32.0, 64.0, 192.0, 192.0])
    assert prompt.points.shape == (0, 2) and not prompt.multimask
    assert parse_context({"result": [keypoint(50.0, 50.0)]}).multimask


@pytest.mark.parametrize("context", [None, {}, {"result": []}])
def test_no_interaction_is_no_prompt(context):
    assert parse_context(context) is None


@pytest.mark.parametrize(
    ("regions", "field", "says"),
    [
        ([{**keypoint(5, 5), "image_rotation": 90}], "result[0].image_rotation", "only 0"),
        ([rectangle(5, 5, 10, 10, value={"rotation": 30})], "result[0].value.rotation", "only 0"),
        ([keypoint(120.0, 5)], "result[0].value.x", "expected percent"),
        ([keypoint(5, 5), keypoint(5, 5, w=640)], "result[1].original_width", "differs"),
        ([rectangle(1, 1, 2, 2), rectangle(5, 5, 2, 2)], "result", "2 rectangles"),
        ([{**keypoint(5, 5), "type": "polygonlabels"}], "result[0].type", "expected"),
        ([{**keypoint(5, 5), "original_width": 0}], "result[0].original_width", "pixels"),
    ],
    ids=["rotated_image", "rotated_box", "outside", "two_sizes", "two_boxes", "type", "size"],
)
def test_a_context_the_model_cannot_take_is_refused_naming_the_field(regions, field, says):
    with pytest.raises(InputValidationError, match=says) as e:
        parse_context({"result": regions})
    assert e.value.field == f"params.context.{field}"


# -- brush RLE ---------------------------------------------------------------------------------
def _masks() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    block = np.zeros((256, 320), bool)
    block[40:200, 30:290] = True
    block[90:120, 100:140] = False  # a hole
    return [
        np.zeros((1, 1), bool),
        np.ones((3, 5), bool),
        rng.random((17, 23)) > 0.5,  # runs of one pixel everywhere
        block,
        np.ones((300, 300), bool),  # one run of 360,000 values: several 2**16 pieces
    ]


@pytest.mark.parametrize("mask", _masks(), ids=["1px", "full", "noise", "block", "long_run"])
def test_rle_round_trip(mask):
    rle = encode_mask(mask)
    assert all(isinstance(b, int) and 0 <= b <= 255 for b in rle)
    np.testing.assert_array_equal(decode_mask(rle, *mask.shape), mask)


def test_rle_header_says_four_8_bit_channels_per_pixel_and_the_run_widths():
    bits = np.unpackbits(np.asarray(encode_mask(np.zeros((2, 3), bool)), dtype=np.uint8))
    number = int("".join(map(str, bits[:32])), 2)
    word = int("".join(map(str, bits[32:37])), 2) + 1
    widths = [int("".join(map(str, bits[37 + 4 * i : 41 + 4 * i])), 2) + 1 for i in range(4)]
    assert (number, word, widths) == (2 * 3 * 4, 8, [3, 4, 8, 16])
    # one run of 24 zeros: repeat=1, width index 2 (8 bits), 23, the value 0
    run = "".join(map(str, bits[53 : 53 + 1 + 2 + 8 + 8]))
    assert run == "1" + "10" + f"{23:08b}" + f"{0:08b}"


def test_rle_decoder_refuses_a_stream_of_another_size():
    with pytest.raises(ValueError, match="20 values, expected 2 \\* 3 \\* 4"):
        decode_mask(encode_mask(np.zeros((1, 5), bool)), 2, 3)
    with pytest.raises(ValueError, match="ends before its values do"):
        decode_mask(encode_mask(np.zeros((2, 3), bool))[:6], 2, 3)


# -- polygons ----------------------------------------------------------------------------------
def _filled(vertices: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Pixels whose centre lies inside the polygon (even-odd rule, pixel-corner vertices)."""
    h, w = shape
    ys, xs = np.mgrid[0:h, 0:w] + 0.5
    inside = np.zeros(shape, bool)
    x0, y0 = vertices[:, 0], vertices[:, 1]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    for a, b, c, d in zip(x0, y0, x1, y1, strict=True):
        crosses = (b > ys) != (d > ys)
        at = a + (ys - b) * (c - a) / np.where(d == b, 1, d - b)
        inside ^= crosses & (xs < at)
    return inside


def test_the_polygon_is_the_largest_regions_exact_outline_without_its_holes_or_islands():
    mask = np.zeros((40, 50), bool)
    mask[5:30, 4:30] = True
    mask[30:38, 10:14] = True  # an arm: the outline is not convex
    largest = mask.copy()
    mask[10:14, 10:14] = False  # a hole: a polygon has none
    mask[2:6, 40:48] = True  # an island: smaller, left out
    vertices = largest_outline(mask)
    assert len(vertices) == 8  # only the corners: 4 of the block, 4 more for the arm
    np.testing.assert_array_equal(_filled(vertices, mask.shape), largest)


def test_diagonal_neighbours_are_separate_regions_and_an_empty_mask_has_no_outline():
    mask = np.zeros((4, 4), bool)
    mask[0, 0] = True
    mask[1:4, 1:4] = True  # touches (0, 0) only at a corner
    vertices = largest_outline(mask)
    np.testing.assert_array_equal(vertices, [[1, 1], [4, 1], [4, 4], [1, 4]])
    assert largest_outline(np.zeros((3, 3), bool)) is None


# -- result regions ----------------------------------------------------------------------------
def test_a_brush_region_carries_the_mask_the_label_and_the_size():
    config = parse_labeling_config(BRUSH_CONFIG)
    prompt = parse_context({"result": [keypoint(50.0, 50.0)]})
    mask = np.zeros((256, 320), bool)
    mask[100:150, 120:200] = True
    [region] = mask_regions(mask, 0.75, config, prompt, field="params.context")
    assert {k: region[k] for k in ("from_name", "to_name", "type", "score")} == {
        "from_name": "tag",
        "to_name": "image",
        "type": "brushlabels",
        "score": 0.75,
    }
    assert (region["original_width"], region["original_height"]) == (320, 256)
    assert region["value"]["format"] == "rle" and region["value"]["brushlabels"] == ["Cell"]
    np.testing.assert_array_equal(decode_mask(region["value"]["rle"], 256, 320), mask)


def test_a_polygon_region_is_in_percent_and_a_label_outside_the_output_is_refused():
    config = parse_labeling_config(POLYGON_CONFIG)
    prompt = parse_context({"result": [rectangle(0, 0, 50, 50)]})
    mask = np.zeros((256, 320), bool)
    mask[64:128, 32:160] = True
    [region] = mask_regions(mask, 0.5, config, prompt, field="params.context")
    assert region["type"] == "polygonlabels" and region["value"]["closed"] is True
    assert region["value"]["points"] == [[10.0, 25.0], [50.0, 25.0], [50.0, 50.0], [10.0, 50.0]]
    brush = parse_labeling_config(BRUSH_CONFIG)
    other = parse_context(
        {"result": [{**keypoint(5, 5), "value": {"x": 5, "y": 5, "keypointlabels": ["Dog"]}}]}
    )
    with pytest.raises(InputValidationError, match="label 'Dog' is not one of 'tag'"):
        mask_regions(np.zeros((256, 320), bool), 0.5, brush, other, field="params.context")


# -- tokens -> tenants -------------------------------------------------------------------------
TOKEN_A, TOKEN_B = "a" * 64, "b" * 64


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_password_or_bearer_token_gives_its_tenant():
    tenants = TokenTenants({TOKEN_A: "lab-a", TOKEN_B: "lab-b"})
    assert tenants.tenant_of(_basic("label-studio", TOKEN_A)) == "lab-a"
    assert tenants.tenant_of(f"Bearer {TOKEN_B}") == "lab-b"


@pytest.mark.parametrize(
    "header",
    [None, "", _basic(TOKEN_A, "x"), f"Bearer {'c' * 64}", "Basic !!", f"Token {TOKEN_A}"],
    ids=["none", "empty", "token_as_user", "unknown", "malformed", "other_scheme"],
)
def test_anything_else_is_unauthenticated_and_the_message_holds_no_credential(header):
    with pytest.raises(Unauthenticated) as e:
        TokenTenants({TOKEN_A: "lab-a"}).tenant_of(header)
    assert TOKEN_A not in str(e.value) and "Authorization" in str(e.value)


def test_without_tokens_every_request_is_in_the_default_tenant():
    assert TokenTenants().tenant_of(None) == "" and not TokenTenants().enabled
