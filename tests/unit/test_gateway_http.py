"""The SAM_service gateway over real HTTP (uvicorn) with a stand-in for Triton.

The stand-in's encodes wait until the test releases them, so the queue's states are reached
deterministically (the test waits for them; no timing thresholds). What Triton really runs is
tests/integration/test_sam_service_gateway.py's.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from gateway_support import paintera_embed, running_gateway
from PIL import Image

from triton_sam.gateway import BackendOptions, GatewayOptions, create_app

pytest.importorskip("uvicorn")


class FakeBackend:
    """Encodes that finish when released; ``started`` counts what would have reached Triton."""

    options = BackendOptions()

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self.is_ready = True

    async def embed(self, rgb, *, tenant, request_id):
        self.started += 1
        await asyncio.to_thread(self.release.wait)
        return np.full((1, 256, 64, 64), rgb.shape[0], dtype=np.float32)

    async def ready(self):
        return {"server": self.is_ready, "sam1_encoder": self.is_ready}

    def model_names(self):
        return {"encoder": "sam1_encoder", "decoder": "sam1_decoder", "session": "sam1_session"}


def _png(h: int = 20, w: int = 30) -> bytes:
    import io

    buffer = io.BytesIO()
    Image.new("RGB", (w, h), (9, 99, 199)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture()
def gateway():
    backend = FakeBackend()
    options = GatewayOptions(workers=1, max_queued=2, max_queued_per_session=1)
    app = create_app(options, backend=backend)
    with running_gateway(app) as url:
        yield url, app.state.gateway, backend
        backend.release.set()


def _wait(condition) -> None:
    deadline = time.monotonic() + 30  # a bound on waiting, not a measured threshold
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_running_work_is_answered_499_at_once_when_its_session_cancels(gateway):
    url, state, backend = gateway
    session = requests.get(f"{url}/new_session_id", timeout=5).text
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(paintera_embed, url, _png(), session)
        _wait(lambda: backend.started == 1)
        r = requests.post(f"{url}/cancel_pending", files={"session_id": (None, session)})
        assert r.status_code == 200
        answer = running.result(timeout=30)  # answered while the encode still "runs"
    assert answer.status_code == 499 and answer.headers["Cancelled-By-Client"] == "1"
    assert answer.content == b""
    assert state.embeds.stats.cancelled_running == 1


def test_full_queues_answer_429_at_once(gateway):
    url, state, backend = gateway
    session = requests.get(f"{url}/new_session_id", timeout=5).text
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(paintera_embed, url, _png(), None)
        _wait(lambda: state.embeds.running() == 1)
        second = pool.submit(
            requests.post,
            f"{url}/embedded_model",
            files={"image": ("a.png", _png()), "session_id": (None, session)},
        )
        _wait(lambda: state.embeds.queued(session) == 1)
        third = requests.post(
            f"{url}/embedded_model",
            files={"image": ("a.png", _png()), "session_id": (None, session)},
            timeout=10,
        )
        assert third.status_code == 429 and third.headers["Retry-After"] == "1"
        assert third.json()["code"] == "Overloaded" and third.json()["field"] == "session_id"
        backend.release.set()
        assert first.result().status_code == 200 and second.result().status_code == 200
    assert backend.started == 2


def test_embedding_text_and_paths_with_a_double_slash(gateway):
    url, _, backend = gateway
    backend.release.set()
    r = paintera_embed(url, _png(h=20), None, compress=True)  # posts to //embedded_model
    assert r.status_code == 200
    embedding = np.frombuffer(base64.b64decode(r.text), dtype="<f4")
    assert embedding.shape == (256 * 64 * 64,) and embedding[0] == 20


def test_health_is_503_while_triton_is_not_ready(gateway):
    url, _, backend = gateway
    backend.is_ready = False
    r = requests.get(f"{url}/health", timeout=5)
    assert r.status_code == 503 and r.json()["status"] == "unavailable"


def test_content_length_over_the_bound_is_refused_before_reading(gateway):
    import http.client
    import json
    from urllib.parse import urlsplit

    url, state, _ = gateway
    conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=10)
    conn.putrequest("POST", "/embedded_model")  # announces more than allowed, sends nothing
    conn.putheader("Content-Type", "multipart/form-data; boundary=b")
    conn.putheader("Content-Length", str(state.options.max_upload_bytes + 1))
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413 and json.loads(r.read())["field"] == "body"
    conn.close()


def test_images_that_are_not_images_or_too_large_are_typed(gateway):
    import io

    url, _, backend = gateway
    bad = requests.post(
        f"{url}/embedded_model", files={"image": ("x.jpg", b"GIF89a?", "image/jpeg")}, timeout=10
    )
    assert bad.status_code == 400 and bad.json()["code"] == "InvalidInput"
    assert bad.json()["field"] == "image"
    big = io.BytesIO()
    Image.new("L", (5000, 4000)).save(big, "PNG")  # over 4096 x 4096 pixels; a small file
    huge = requests.post(
        f"{url}/embedded_model", files={"image": ("b.png", big.getvalue())}, timeout=10
    )
    assert huge.status_code == 413 and huge.json()["code"] == "LimitExceeded"
    assert backend.started == 0  # neither reached the encoder
