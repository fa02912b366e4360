"""The request bounds and the server-side image intake (``triton_sam.serving.bounds`` /
``.intake``), without a server: each bound refuses with the field's name, decoding handles the
formats the client always handled, and the server's preprocessing is the client's."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from triton_sam.client import image_io, model_frame
from triton_sam.client.prompts import build_decoder_prompts
from triton_sam.errors import InputValidationError
from triton_sam.models import get_family
from triton_sam.serving import bounds, intake

SAM2 = get_family("sam2")


def points(n: int, value: float = 10.0) -> dict[str, np.ndarray]:
    return {
        "point_coords": np.full((1, n, 2), value, np.float32),
        "point_labels": np.ones((1, n), np.float32),
    }


def refused(field: str, prompts: dict[str, np.ndarray], **limits) -> str:
    with pytest.raises(bounds.RequestError) as info:
        bounds.check_prompts(prompts, **limits)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")
    return str(info.value)


def test_point_count_is_bounded_box_corners_included():
    bounds.check_prompts(points(bounds.MAX_POINTS))
    assert "20000 points" in refused("point_coords", points(20_000))
    assert "3 points" in refused("point_coords", points(3), max_points=2)
    hf = {"input_points": np.zeros((1, 1, 65, 2), np.float32)}
    refused("input_points", hf)


def test_the_decoder_graphs_bound_an_item_and_a_whole_batch_and_serve_what_clients_send():
    """The graphs' own bounds (``export.onnx_utils.bound_points``) sit above what a request
    of our clients carries, and the decoder's batch size keeps a full batch of those requests
    within the batch total: the dynamic batcher never forms a batch the graph refuses."""
    from triton_sam.repository.config import RepositoryOptions

    assert bounds.MAX_POINTS <= bounds.GRAPH_MAX_POINTS <= bounds.GRAPH_MAX_BATCH_POINTS
    default = RepositoryOptions().decoder_max_batch_size
    assert default * bounds.MAX_POINTS <= bounds.GRAPH_MAX_BATCH_POINTS
    most = bounds.GRAPH_MAX_BATCH_POINTS // bounds.MAX_POINTS
    RepositoryOptions(decoder_max_batch_size=most)
    with pytest.raises(InputValidationError, match=f"expected at most {most}") as info:
        RepositoryOptions(decoder_max_batch_size=most + 1)
    assert info.value.field == "decoder_max_batch_size"


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e9])
def test_coordinates_must_be_finite_and_sane(value):
    refused("point_coords", points(1, value))


def test_labels_must_match_the_points_and_the_decoder_values():
    prompts = points(2)
    prompts["point_labels"] = np.array([[1.0, 7.0]], np.float32)
    assert "7.0" in refused("point_labels", prompts)
    prompts["point_labels"] = np.ones((1, 3), np.float32)
    refused("point_labels", prompts)
    hf = {
        "input_points": np.zeros((1, 1, 2, 2), np.float32),
        "input_labels": np.array([[[1, 0]]], np.int64),
    }
    bounds.check_prompts(hf)


def test_one_prompt_set_and_one_box_per_request():
    batched = {k: np.concatenate([v, v]) for k, v in points(1).items()}
    refused("point_coords", batched)
    refused("input_boxes", {"input_boxes": np.zeros((1, 2, 4), np.float32)})
    bounds.check_prompts({"input_boxes": np.zeros((1, 1, 4), np.float32)})


def test_mask_input_must_be_finite_and_has_mask_input_binary():
    mask = {"mask_input": np.full((1, 1, 256, 256), 50.0, np.float32)}  # large logits: fine
    bounds.check_prompts(mask)
    refused("mask_input", {"mask_input": np.full((1, 1, 256, 256), np.nan, np.float32)})
    refused("has_mask_input", {"has_mask_input": np.full((1, 1), 0.5, np.float32)})


def test_the_client_checks_the_same_bounds_before_sending():
    # SAM2's decoder gets a padding point after clicks without a box: 64 clicks are 65 points
    coords = np.full((bounds.MAX_POINTS, 2), 5.0)
    with pytest.raises(InputValidationError, match="point_coords: got 65 points") as info:
        build_decoder_prompts(
            point_coords=coords,
            point_labels=np.ones(len(coords)),
            box=None,
            mask_input=None,
            orig_hw=(100, 100),
            family=SAM2,
        )
    assert info.value.field == "point_coords"
    build_decoder_prompts(
        point_coords=coords[:63],
        point_labels=np.ones(63),
        box=None,
        mask_input=None,
        orig_hw=(100, 100),
        family=SAM2,
    )
    # a box takes two of the 64 points (and SAM2 still pads: SAM2ImagePredictor's layout)
    build_decoder_prompts(
        point_coords=coords[:61],
        point_labels=np.ones(61),
        box=[1, 1, 50, 50],
        mask_input=None,
        orig_hw=(100, 100),
        family=SAM2,
    )
    with pytest.raises(InputValidationError, match="point_coords"):
        build_decoder_prompts(
            point_coords=coords[:62],
            point_labels=np.ones(62),
            box=[1, 1, 50, 50],
            mask_input=None,
            orig_hw=(100, 100),
            family=SAM2,
        )


# -- decoding -----------------------------------------------------------------------------------
def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (30, 40, 3), dtype=np.uint8)
GRAY16 = RNG.integers(0, 65536, (30, 40), dtype=np.uint16)
FILES = {
    "png_rgb": lambda: encode(Image.fromarray(RGB), "PNG"),
    "png_rgba": lambda: encode(Image.fromarray(RGB).convert("RGBA"), "PNG"),
    "png_gray": lambda: encode(Image.fromarray(RGB[..., 0]), "PNG"),
    "png_palette": lambda: encode(Image.fromarray(RGB).convert("P"), "PNG"),
    "png_16bit": lambda: encode(Image.fromarray(GRAY16), "PNG"),
    "tiff": lambda: encode(Image.fromarray(RGB), "TIFF"),
    "bmp": lambda: encode(Image.fromarray(RGB), "BMP"),
    "webp": lambda: encode(Image.fromarray(RGB), "WEBP", lossless=True),
    "jpeg": lambda: encode(Image.fromarray(RGB), "JPEG", quality=90),
}


@pytest.mark.parametrize("kind", sorted(FILES))
def test_the_server_decodes_files_as_the_client_does(kind):
    data = FILES[kind]()
    server = intake.decode_image(data, max_pixels=bounds.MAX_IMAGE_PIXELS)
    client = image_io.load_image(data)
    assert server.dtype == np.uint8 and server.shape == (30, 40, 3)
    np.testing.assert_array_equal(server, client)
    if kind in ("png_rgb", "tiff", "bmp", "webp"):  # lossless
        np.testing.assert_array_equal(server, RGB)


def bomb_png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


@pytest.mark.parametrize("size", [(5000, 5000), (100_000, 100_000)])
def test_a_decompression_bomb_is_refused_from_its_header(size):
    with pytest.raises(bounds.RequestError, match=r"image_bytes: ") as info:
        intake.decode_image(bomb_png(*size), max_pixels=bounds.MAX_IMAGE_PIXELS)
    assert info.value.field == "image_bytes"


def test_bytes_that_are_no_image_are_refused():
    with pytest.raises(bounds.RequestError, match="image_bytes: cannot decode 5 bytes"):
        intake.decode_image(b"hello", max_pixels=100)


def test_raw_pixels_are_checked():
    assert intake.check_rgb(RGB[None], max_pixels=10**6).shape == (30, 40, 3)
    with pytest.raises(bounds.RequestError, match="image_rgb: got dtype float32"):
        intake.check_rgb(RGB.astype(np.float32), max_pixels=10**6)
    with pytest.raises(bounds.RequestError, match="image_rgb: got 40x30"):
        intake.check_rgb(RGB, max_pixels=100)


# -- preprocessing and ids ------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["sam1", "sam2", "sam3"])
def test_the_server_preprocesses_from_its_config_as_the_client_does(family):
    pre = get_family(family).preprocessing
    server_pre = intake.preprocessing_from_json(intake.preprocessing_json(pre))
    np.testing.assert_array_equal(
        intake.preprocess(RGB, server_pre), model_frame.preprocess(RGB, pre)
    )


def test_ids_depend_on_pixels_models_and_preprocessing():
    from triton_sam.serving import images

    pre = intake.preprocessing_json(SAM2.preprocessing)
    ns = intake.session_namespace("sam2_session", "sam2_encoder", pre, "rgb")
    same = images.image_id(RGB, ns)
    assert same == images.image_id(RGB.copy(), ns)
    changed = RGB.copy()
    changed[0, 0, 0] ^= 1
    assert images.image_id(changed, ns) != same
    other_pre = intake.preprocessing_json(get_family("sam1").preprocessing)
    for namespace in (
        intake.session_namespace("sam2_session", "other_encoder", pre, "rgb"),
        intake.session_namespace("other_session", "sam2_encoder", pre, "rgb"),
        intake.session_namespace("sam2_session", "sam2_encoder", other_pre, "rgb"),
    ):
        assert images.image_id(RGB, namespace) != same


def test_finished_mask_helpers():
    from triton_sam.serving import prompt_frame

    mask = np.zeros((5, 7), bool)
    mask[1:3, 2:6] = True
    bits = np.frombuffer(prompt_frame.pack_bits(mask), np.uint8)
    np.testing.assert_array_equal(np.unpackbits(bits, count=35).reshape(5, 7), mask)
    assert prompt_frame.mask_box(mask).tolist() == [2, 1, 5, 2]
    assert prompt_frame.mask_box(np.zeros((3, 3), bool)).tolist() == [0, 0, 0, 0]


# -- one prompt set, one box: never merged ------------------------------------------------------
def test_ten_boxes_as_corner_points_are_refused_naming_the_labels():
    coords = np.tile(np.array([[10, 10], [50, 50]], np.float32), (10, 1))[None]  # [1, 20, 2]
    labels = np.tile(np.array([2, 3], np.float32), 10)[None]
    message = refused("point_labels", {"point_coords": coords, "point_labels": labels})
    assert "got 10 boxes" in message and "at most 1" in message
    one_box = {"point_coords": coords[:, :2], "point_labels": labels[:, :2]}
    bounds.check_prompts(one_box)  # one box is the contract


def test_our_clients_box_and_click_is_one_box():
    built = build_decoder_prompts(
        point_coords=[[5, 5]],
        point_labels=[1],
        box=[1, 1, 20, 20],
        mask_input=None,
        orig_hw=(100, 100),
        family=SAM2,
    )
    bounds.check_prompts(built)


@pytest.mark.parametrize("shape", [(2, 1), (2, 1, 2), (3,), ()])
def test_a_batch_of_prompt_sets_is_refused_naming_the_field(shape):
    with pytest.raises(bounds.RequestError) as info:
        bounds.check_batch("image_id", shape)
    count = shape[0] if shape else 0
    assert str(info.value).startswith(f"image_id: got {count} prompt sets")
    assert "expected 1 per request" in str(info.value)
    bounds.check_batch("image_id", (1, 1))


def test_pixel_coordinates_beyond_the_frame_bound_name_the_pixel_field():
    pixels = np.array([[1e9, 5.0]])
    with pytest.raises(bounds.RequestError) as info:
        bounds.check_pixel_coords("points", pixels, pixels * 1.6)
    assert info.value.field == "points" and "point_coords" not in str(info.value)
    bounds.check_pixel_coords("points", np.array([[5.0, 5.0]]), np.array([[8.0, 8.0]]))
