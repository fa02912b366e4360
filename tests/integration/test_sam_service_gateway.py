"""Janelia SAM_service's endpoints through the gateway, over real HTTP, against Triton.

The gateway (``triton_sam/gateway``) runs on uvicorn in this process, in front of the embedded
Triton serving the random-init SAM1 ViT-B export (``sam1_vit_b_server``); requests go over the
wire with ``requests``, ``/embedded_model`` as Paintera's loader sends it (chunked multipart,
JPEG, ``Accept-Encoding: gzip,deflate``: see tests/gateway_support.py for the Paintera file it
replays). The formats are SAM_service's code (JaneliaSciComp/SAM_service
``sam_service/sam_queue.py`` and ``sam_service/sam_fast_api.py``, branch dev at a0f3346).

Encodes are slow on CPU (ViT-B: seconds each): the module makes four (the parity embedding,
the one request of a session left after two cancellations, a ``/prediction`` in each of two
tenants).

Tolerances:
- embedding vs ``SamPredictor.get_image_embedding()`` on the same weights and the same decoded
  JPEG: |ours - upstream| <= 1e-4, as tests/parity/test_sam1_parity.py (onnxruntime vs torch
  reassociation; measured there <= 1.1e-5);
- masks (``/from_model``, ``/prediction``) vs the official predictor's best multimask output:
  IoU >= 0.99 (the logits differ by <= 5e-5, so only pixels at the threshold can flip).
"""

from __future__ import annotations

import base64
import gzip
import io
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from gateway_support import paintera_embed, running_gateway
from PIL import Image
from prompt_matrix import iou

from triton_sam.bench.counters import read_counters, session_encoder
from triton_sam.gateway import BackendOptions, GatewayOptions, create_app
from triton_sam.tools.sample import sample_image

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(900)]

EMBEDDING_ATOL = 1e-4
MIN_IOU = 0.99
H, W = 480, 640
CLICK = (210, 190)  # (x, y)


def _jpeg() -> bytes:
    buffer = io.BytesIO()  # what Java's ImageIO writes for a TYPE_INT_RGB image: baseline JFIF
    Image.fromarray(sample_image(W, H)).save(buffer, "JPEG", quality=75)
    return buffer.getvalue()


JPEG = _jpeg()
RGB = np.asarray(Image.open(io.BytesIO(JPEG)).convert("RGB"))  # the gateway decodes with PIL


@pytest.fixture(scope="module")
def upstream(sam1_vit_b_spec, sam1_vit_b_checkpoint):
    from segment_anything import SamPredictor

    from triton_sam.export.sam1 import build_model

    predictor = SamPredictor(build_model(sam1_vit_b_spec, sam1_vit_b_checkpoint))
    predictor.set_image(RGB)
    masks, scores, _ = predictor.predict(
        point_coords=np.array([CLICK]), point_labels=np.array([1]), multimask_output=True
    )
    # SAM_service's /from_model: SamOnnxModel(return_single_mask=True) on one click = the
    # multimask output with the best score.
    return predictor.get_image_embedding().numpy(), masks[int(np.argmax(scores))]


@pytest.fixture(scope="module")
def gateway(sam1_vit_b_server):
    backend = BackendOptions(url=sam1_vit_b_server.grpc_url, protocol="grpc", model_type="sam1")
    # one worker: the second request waits in the gateway, where a cancel drops it
    options = GatewayOptions(backend=backend, workers=1, max_upload_bytes=8 * 2**20)
    app = create_app(options)
    with running_gateway(app) as url:
        yield url, app.state.gateway, sam1_vit_b_server


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + 120  # a bound on waiting, not a measured threshold
    while not condition():
        assert time.monotonic() < deadline, f"gateway never reached: {what}"
        time.sleep(0.01)


def _embedding(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4").reshape(1, 256, 64, 64)


def test_new_session_ids_are_uuid4_text(gateway):
    url, _, _ = gateway
    a, b = (requests.get(f"{url}/new_session_id", timeout=10) for _ in range(2))
    assert a.status_code == 200 and a.headers["content-type"].startswith("text/plain")
    assert len(a.text) == 36 and a.text.count("-") == 4 and a.text != b.text


def test_models_and_health(gateway):
    url, _, _ = gateway
    health = requests.get(f"{url}/health", timeout=30)
    assert health.status_code == 200, health.text
    assert health.json()["status"] == "ok" and all(health.json()["triton"].values())
    models = requests.get(f"{url}/models", timeout=10).json()
    assert models["default"] == "sam1"
    assert models["models"][0]["embedding_shape"] == [1, 256, 64, 64]


def test_embedding_cancellation_and_compression_as_paintera_sends_them(gateway, upstream):
    """A (no session) runs; B, C of a Paintera session queue behind it: C's cancel_pending
    cancels B, /cancel_pending cancels C, D (compressed) runs. Triton's own counters: the
    encoder ran A and D only."""
    url, state, server = gateway
    encoder = state.backend.connection().encoder_model
    before = read_counters(server.http_url, None, encoder)
    session = requests.get(f"{url}/new_session_id", timeout=10).text
    with ThreadPoolExecutor(4) as pool:
        a = pool.submit(paintera_embed, url, JPEG, None, compress=False)
        _wait(lambda: state.embeds.running() == 1, "A running")
        b = pool.submit(paintera_embed, url, JPEG, session)
        _wait(lambda: state.embeds.queued(session) == 1, "B queued")
        c = pool.submit(paintera_embed, url, JPEG, session)  # cancel_pending=true: B goes
        assert b.result().status_code == 499
        assert b.result().headers["Cancelled-By-Client"] == "1"
        _wait(lambda: state.embeds.queued(session) == 1, "C queued")
        cancel = requests.post(f"{url}/cancel_pending", files={"session_id": (None, session)})
        assert cancel.status_code == 200 and cancel.text == ""
        assert c.result().status_code == 499
        assert c.result().headers["Cancelled-By-Client"] == "1"
        d = pool.submit(paintera_embed, url, JPEG, session, stream=True)
        plain, compressed = a.result(), d.result()
    assert plain.status_code == 200 and plain.headers["content-type"].startswith("text/plain")
    ours = _embedding(plain.text)
    np.testing.assert_allclose(ours, upstream[0], atol=EMBEDDING_ATOL, rtol=0)
    # encoding=compress: gzip of the base64 text (SAM_service's order), whatever was asked
    assert compressed.status_code == 200
    assert compressed.headers["Content-Encoding"] == "gzip"
    assert compressed.headers["Content-Type"] == "application/gzip"
    raw = compressed.raw.read(decode_content=False)
    assert gzip.decompress(raw) == plain.content  # the same image, the same encoder
    after = read_counters(server.http_url, None, encoder)
    assert after.inference_count - before.inference_count == 2  # B and C never reached it
    assert state.embeds.stats.cancelled_queued >= 2


def test_from_model_answers_the_official_predictors_mask(gateway, upstream):
    url, _, _ = gateway
    text = base64.b64encode(upstream[0].astype("<f4").tobytes())  # as /embedded_model answers
    fields = {"x": str(CLICK[0]), "y": str(CLICK[1]), "img_x": str(W), "img_y": str(H)}
    files = {
        "model": ("model.txt", text, "text/plain"),
        **{k: (None, v) for k, v in fields.items()},
    }
    r = requests.post(f"{url}/from_model", files=files, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"] == "image/png", r.text
    mask = np.asarray(Image.open(io.BytesIO(r.content)))
    assert mask.shape == (H, W) and set(np.unique(mask)) <= {0, 255}
    assert iou(mask > 0, upstream[1]) >= MIN_IOU


def test_prediction_keeps_the_image_on_the_server(gateway, upstream):
    url, state, server = gateway
    conn = state.backend.connection()
    encoder = session_encoder(server.http_url, conn.session_model) or conn.encoder_model
    files = {"image": ("image.jpg", JPEG, "image/jpeg"), "x": (None, "210"), "y": (None, "190")}
    first = requests.post(f"{url}/prediction", files=files, timeout=600)
    assert first.status_code == 200, first.text
    assert iou(np.asarray(Image.open(io.BytesIO(first.content))) > 0, upstream[1]) >= MIN_IOU
    before = read_counters(server.http_url, None, encoder)
    again = requests.post(f"{url}/prediction", files=files, timeout=600)
    assert again.content == first.content
    assert read_counters(server.http_url, None, encoder).inference_count == before.inference_count
    # The tenant header travels to Triton: another tenant's cache does not have the image.
    other = requests.post(
        f"{url}/prediction", files=files, headers={"triton-sam-tenant": "lab-b"}, timeout=600
    )
    assert other.content == first.content
    after = read_counters(server.http_url, None, encoder)
    assert after.inference_count == before.inference_count + 1


def test_bad_inputs_get_typed_errors_naming_the_field(gateway):
    url, state, _ = gateway

    def embed(**kwargs):
        return requests.post(f"{url}/embedded_model", timeout=30, **kwargs)

    not_image = embed(files={"image": ("x.jpg", b"not an image", "image/jpeg")})
    assert not_image.status_code == 400 and not_image.json()["field"] == "image"
    big = io.BytesIO()
    Image.new("L", (5000, 4000)).save(big, "PNG")  # 20 MP, a small file: refused from its header
    huge = embed(files={"image": ("big.png", big.getvalue(), "image/png")})
    assert huge.status_code == 413 and huge.json()["code"] == "LimitExceeded"
    unknown = embed(files={"image": ("a.jpg", JPEG), "session_id": (None, "my-own-session")})
    assert unknown.status_code == 400
    assert unknown.json() | {"message": ""} == {
        "code": "SessionNotFound",
        "field": "session_id",
        "message": "",
    }
    flag = requests.get(f"{url}/new_session_id", timeout=10).text
    bad_flag = embed(
        files={
            "image": ("a.jpg", JPEG),
            "session_id": (None, flag),
            "cancel_pending": (None, "maybe"),
        }
    )
    assert bad_flag.status_code == 400 and bad_flag.json()["field"] == "cancel_pending"
    head = b'--b\r\nContent-Disposition: form-data; name="image"; filename="a.jpg"\r\n\r\n'
    too_long = requests.post(  # chunked, no Content-Length: refused while it streams
        f"{url}/embedded_model",
        data=iter([head, *(b"x" * 2**20 for _ in range(9))]),
        headers={"Content-Type": "multipart/form-data; boundary=b"},
        timeout=30,
    )
    assert too_long.status_code == 413 and too_long.json()["field"] == "body"
    no_image = embed(files={"session_id": (None, flag)})  # Paintera's cancel, sent here
    assert no_image.status_code == 400 and no_image.json()["field"] == "image"
    wrong_model = requests.post(
        f"{url}/from_model",
        files={
            "model": ("m", b"AAAA"),
            "x": (None, "1"),
            "y": (None, "1"),
            "img_x": (None, "8"),
            "img_y": (None, "8"),
        },
        timeout=30,
    )
    assert wrong_model.status_code == 400 and wrong_model.json()["field"] == "model"
    tenant = requests.post(  # another tenant cannot use (or cancel with) this tenant's id
        f"{url}/cancel_pending",
        files={"session_id": (None, flag)},
        headers={"triton-sam-tenant": "other-lab"},
        timeout=10,
    )
    assert tenant.status_code == 400 and tenant.json()["code"] == "SessionNotFound"
    assert requests.get(f"{url}/health", timeout=30).status_code == 200  # still serving
