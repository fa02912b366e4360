"""The session model owns its inputs, against the embedded Triton, SAM2.1-tiny.

Raw ``tritonclient`` requests bypass our client, as a hostile or foreign client would:

- cache poisoning: a client that sends image B's pixels under image A's id binds nothing: the
  server keys B's features by B's own content (and answers that id), A's id stays unbound,
  and user A then gets A's masks (exactly the stateless path's);
- bounds: 20,000 points, NaN, bad labels, several prompt sets, a decompression bomb, bytes
  that are no image are each refused with INVALID_ARG naming the field; the server stays
  ready and the next good request works; past the session model, the decoder graph refuses
  too many points per item and per batch, naming the input;
- images in as bytes: a PNG / JPEG path is sent as the file's bytes, decoded and
  preprocessed by the server, and gives exactly the masks of the client-side (stateless)
  path; a 1-megapixel JPEG's ``set_image`` request shrinks from 12 MiB of float32 to the
  file's size.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from triton_sam.client import SAM2TritonClient, embedding_path
from triton_sam.models import get_family
from triton_sam.tools.sample import sample_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.triton,
    pytest.mark.timeout(900),
    pytest.mark.uses_servers("sam1_vit_b_server", "sam3_server"),
]

SESSION = "sam2_session"
FAMILY = get_family("sam2")
IMAGE_A = sample_image(160, 120, seed=1)
IMAGE_B = sample_image(160, 120, seed=2)
CLICK = {"point_coords": [[60, 50]], "point_labels": [1]}


def infer(client, inputs: dict[str, np.ndarray], outputs=("encoded",)) -> dict[str, np.ndarray]:
    """One raw KServe v2 request (binary tensors), no triton_sam code on the way."""
    tensors = []
    for name, value in inputs.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value, binary_data=True)
        tensors.append(tensor)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs]
    result = client.infer(SESSION, tensors, outputs=wanted)
    return {n: result.as_numpy(n) for n in outputs}


def text(value: str) -> np.ndarray:
    return np.array([[value.encode()]], dtype=np.object_)


def answered_id(out: dict[str, np.ndarray]) -> str:
    return bytes(out["image_id"].reshape(-1)[0]).decode()


def png_bytes(rgb: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return buffer.getvalue()


def bomb_png(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (grayscale): tiny on the wire, huge decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (width + 1) * 16)  # a few rows; never decoded anyway
    chunks = chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


@pytest.fixture(scope="module")
def raw(sam2_tiny_server):
    client = httpclient.InferenceServerClient(sam2_tiny_server.http_address)
    yield client
    client.close()


def predict_masks(url: str, image, *, server_side: bool) -> tuple[np.ndarray, np.ndarray]:
    with SAM2TritonClient(url, use_server_embeddings=server_side) as client:
        client.set_image(image)
        prediction = client.predict_full(**CLICK)
        return prediction.low_res_logits, prediction.iou_predictions


# -- ids the server computes ---------------------------------------------------------------
def test_an_image_cannot_be_embedded_under_another_images_id(sam2_tiny_server, raw):
    id_a = embedding_path.image_id(IMAGE_A, FAMILY, "sam2_encoder", SESSION)
    # Client B sends B's pixels claiming A's id: the claim binds nothing; the server keeps B
    # under the id it computed from B's pixels and says so.
    out = infer(raw, {"image_rgb": IMAGE_B[None], "image_id": text(id_a)}, ("encoded", "image_id"))
    id_b = answered_id(out)
    assert id_b == embedding_path.image_id(IMAGE_B, FAMILY, "sam2_encoder", SESSION) != id_a
    # The same without the claim: the same id, already held.
    out = infer(raw, {"image_rgb": IMAGE_B[None]}, ("encoded", "image_id"))
    assert answered_id(out) == id_b and int(out["encoded"].reshape(-1)[0]) == 0
    # A's id is bound to nothing: a probe misses, so user A embeds A and gets A's masks.
    with pytest.raises(InferenceServerException, match="EmbeddingNotFound"):
        infer(raw, {"image_id": text(id_a)})
    url = sam2_tiny_server.http_url
    session_logits, session_scores = predict_masks(url, IMAGE_A, server_side=True)
    local_logits, local_scores = predict_masks(url, IMAGE_A, server_side=False)
    np.testing.assert_array_equal(session_logits, local_logits)  # same graph, same features
    np.testing.assert_array_equal(session_scores, local_scores)
    b_logits, _ = predict_masks(url, IMAGE_B, server_side=False)
    assert not np.array_equal(session_logits, b_logits)  # the two images do differ


def test_the_same_picture_gets_the_same_id_as_bytes_or_pixels(raw):
    from_pixels = answered_id(infer(raw, {"image_rgb": IMAGE_A[None]}, ("image_id",)))
    data = np.array([[png_bytes(IMAGE_A)]], dtype=np.object_)
    out = infer(raw, {"image_bytes": data}, ("encoded", "image_id"))
    assert answered_id(out) == from_pixels and int(out["encoded"].reshape(-1)[0]) == 0


# -- bounds enforced on the server ------------------------------------------------------------
def click(n: int = 1, *, coords=None, labels=None) -> dict[str, np.ndarray]:
    coords = np.full((1, n, 2), 100.0, np.float32) if coords is None else coords
    labels = np.ones((1, n), np.float32) if labels is None else labels
    return {"point_coords": coords, "point_labels": labels}


BAD_REQUESTS = {
    "20000_points": ("point_coords", click(20_000)),
    "65_points": ("point_coords", click(65)),
    "nan_coords": ("point_coords", click(coords=np.array([[[np.nan, 1.0]]], np.float32))),
    "inf_coords": ("point_coords", click(coords=np.array([[[np.inf, 1.0]]], np.float32))),
    "huge_coords": ("point_coords", click(coords=np.array([[[1e9, 1.0]]], np.float32))),
    "label_7": ("point_labels", click(labels=np.array([[7.0]], np.float32))),
    "label_count": ("point_labels", click(2, labels=np.ones((1, 3), np.float32))),
    "nan_mask": (
        "mask_input",
        {**click(), "mask_input": np.full((1, 1, 256, 256), np.nan, np.float32)},
    ),
    "long_logits_key": ("logits_key", {**click(), "logits_key": text("k" * 4096)}),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_out_of_bounds_clicks_are_refused_and_the_server_stays_ready(sam2_tiny_server, raw, case):
    field, prompts = BAD_REQUESTS[case]
    image_id = answered_id(infer(raw, {"image_rgb": IMAGE_A[None]}, ("image_id",)))
    with pytest.raises(InferenceServerException, match=f"^.*{field}: ") as info:
        infer(raw, {"image_id": text(image_id), **prompts}, ("masks", "iou_predictions"))
    assert "400" in str(info.value.status())
    assert raw.is_server_ready() and raw.is_model_ready(SESSION)
    out = infer(raw, {"image_id": text(image_id), **click()}, ("masks", "iou_predictions"))
    assert out["masks"].shape == (1, 1, 256, 256) and np.isfinite(out["masks"]).all()


def test_too_many_points_sent_straight_to_the_decoder_are_refused_per_item_and_per_batch(raw):
    """Past the session model: Triton bounds the batch dim (``max_batch_size``, its own HTTP
    400) but cannot bound a variable dim; the decoder graph bounds the points of an item and of
    the whole batch (``export.onnx_utils.bound_points``) before any attention is computed. On
    the onnxruntime backend that refusal is HTTP 500 (r24.10 reports every onnxruntime error as
    INTERNAL); its message names the input."""
    from triton_sam.serving.bounds import GRAPH_MAX_BATCH_POINTS, GRAPH_MAX_POINTS

    def decode(batch: int, n: int) -> dict[str, np.ndarray]:
        inputs = {
            **{t.name: np.zeros((batch, *t.shape), np.float32) for t in FAMILY.encoder_outputs},
            "mask_input": np.zeros((batch, 1, 256, 256), np.float32),
            "has_mask_input": np.zeros((batch, 1), np.float32),
            "point_coords": np.full((batch, n, 2), 100.0, np.float32),
            "point_labels": np.ones((batch, n), np.float32),
        }
        tensors = []
        for name, value in inputs.items():
            tensor = httpclient.InferInput(name, list(value.shape), "FP32")
            tensor.set_data_from_numpy(value, binary_data=True)
            tensors.append(tensor)
        result = raw.infer("sam2_decoder", tensors)
        return {"masks": result.as_numpy("masks")}

    guard = f"point_coords: at most {GRAPH_MAX_POINTS} points per item and "
    per_batch = GRAPH_MAX_BATCH_POINTS // GRAPH_MAX_POINTS  # items of the most points
    for batch, n in [(1, 20_000), (1, GRAPH_MAX_POINTS + 1), (per_batch + 1, GRAPH_MAX_POINTS)]:
        with pytest.raises(InferenceServerException, match=guard):
            decode(batch, n)
        assert raw.is_server_ready() and raw.is_model_ready("sam2_decoder")
    # the ceilings themselves are served
    assert decode(1, GRAPH_MAX_POINTS)["masks"].shape[0] == 1
    assert decode(per_batch, GRAPH_MAX_POINTS)["masks"].shape[0] == per_batch
    assert np.isfinite(decode(1, 2)["masks"]).all()


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("over_limit", bomb_png(5000, 5000), "image_bytes: got 5000x5000"),
        ("bomb", bomb_png(100_000, 100_000), "image_bytes: refused by PIL's decompression-bomb"),
        ("garbage", b"not an image at all", "image_bytes: cannot decode"),
    ],
)
def test_bad_image_bytes_are_refused_before_decoding(raw, name, data, expected):
    with pytest.raises(InferenceServerException, match=expected):
        infer(raw, {"image_bytes": np.array([[data]], dtype=np.object_)})
    assert raw.is_server_ready() and raw.is_model_ready(SESSION)
    assert answered_id(infer(raw, {"image_rgb": IMAGE_A[None]}, ("image_id",)))


def test_our_client_refuses_the_same_bounds_before_sending(sam2_tiny_server):
    from triton_sam.errors import InputValidationError

    with SAM2TritonClient(sam2_tiny_server.http_url) as client:
        client.set_image(IMAGE_A)
        points = np.full((65, 2), 10.0)
        with pytest.raises(InputValidationError, match="point_coords: got 66 points"):
            client.predict(point_coords=points, point_labels=np.ones(65))


# -- images in as bytes -------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_a_file_is_sent_as_its_bytes_and_decoded_on_the_server(sam2_tiny_server, tmp_path, fmt):
    path = tmp_path / f"image.{fmt}"
    Image.fromarray(sample_image(640, 427, seed=5)).save(path, quality=90)
    url = sam2_tiny_server.http_url
    with SAM2TritonClient(url) as client:
        client.set_image(path)
        sent = client.last_request_bytes
        ours = client.predict_full(**CLICK)
    local_logits, local_scores = predict_masks(url, path, server_side=False)
    # PNG is lossless; the JPEG is decoded by the same PIL on both sides: exact either way.
    np.testing.assert_array_equal(ours.low_res_logits, local_logits)
    np.testing.assert_array_equal(ours.iou_predictions, local_scores)
    assert sent <= path.stat().st_size + 512  # the file, plus the request's JSON header


def test_set_image_bytes_for_a_1_megapixel_jpeg(sam2_tiny_server, tmp_path):
    path = tmp_path / "photo.jpg"
    Image.fromarray(sample_image(1280, 800, seed=7)).save(path, quality=90)
    url = sam2_tiny_server.http_url
    with SAM2TritonClient(url, use_server_embeddings=False) as before:
        before.set_image(path)  # what every set_image sent before: the float32 encoder input
        float_bytes = before.last_request_bytes
    with SAM2TritonClient(url) as after:
        after.set_image(path)
        file_bytes = after.last_request_bytes
    print(
        f"set_image of a 1280x800 JPEG ({path.stat().st_size} B file): before {float_bytes} B "
        f"(float32 [1,3,1024,1024]), after {file_bytes} B ({float_bytes / file_bytes:.0f}x less)"
    )
    assert float_bytes == 3 * 1024 * 1024 * 4
    assert file_bytes <= path.stat().st_size + 512


@pytest.mark.parametrize("family", ["sam1", "sam3"])
def test_every_family_decodes_and_preprocesses_on_the_server(family, request, tmp_path):
    """SAM1 (longest side + pad, PIL resize) and the SAM3 tracker (1008, uint8 resize): the
    file bytes the server decodes and preprocesses give exactly the stateless path's masks
    (whose parity with the official predictors tests/parity checks)."""
    server = request.getfixturevalue(f"{'sam1_vit_b' if family == 'sam1' else family}_server")
    path = tmp_path / "image.png"
    Image.fromarray(sample_image(300, 200, seed=9)).save(path)
    prompt = {"point_coords": [[120, 80]], "point_labels": [1], "box": [40, 30, 220, 160]}
    results = []
    for server_side in (True, False):
        with SAM2TritonClient(
            server.http_url, model_type=family, use_server_embeddings=server_side
        ) as client:
            assert client.uses_server_embeddings == server_side
            client.set_image(path)
            results.append(client.predict_full(**prompt))
    np.testing.assert_array_equal(results[0].low_res_logits, results[1].low_res_logits)
    np.testing.assert_array_equal(results[0].iou_predictions, results[1].iou_predictions)
