"""Bad input everywhere a user touches it: a typed error naming the field, fast, and the server
stays healthy.

One table: each case is (id, the exception class expected, the field its message must name,
what to do). Client-side cases never reach the server; server-side cases send malformed
tensors straight through the transport (bypassing the client's checks) or name a missing
model, and show that the server's refusal arrives as a typed exception carrying the server's
message. After every case the server must still answer ``/v2/health/ready``; at the end a good
request must still work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import struct
import time
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from triton_sam.client import SAM2TritonClient, SpeculativeSAM2Client, model_frame
from triton_sam.client.retry import NO_RETRY
from triton_sam.client.transport import Transport, resolve_endpoint
from triton_sam.errors import (
    ConfigError,
    InputValidationError,
    InvalidRequestError,
    ModelNotReadyError,
    ServerUnavailableError,
    TritonSamError,
    UnsupportedModelError,
)

pytestmark = [pytest.mark.triton, pytest.mark.slow]

H, W = 48, 64
CASE_TIMEOUT_S = 30.0
GOOD_CLICK = {"point_coords": [[32, 24]], "point_labels": [1]}


@dataclass
class Ctx:
    """What the cases act on: one set-up client of each kind and raw transports."""

    server: Any
    client: SAM2TritonClient  # gets the bad images (a failed set_image forgets the image)
    prompter: SAM2TritonClient  # keeps a good image, gets the bad prompts
    spec: SpeculativeSAM2Client
    http: Transport
    grpc: Transport
    features: dict[str, np.ndarray]
    tmp: Any


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (no pixel data needs to exist: the
    size must be refused before decoding)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    body = struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    idat = zlib.compress(b"\x00" * 16)
    idat_chunk = b"IDAT" + idat
    body += struct.pack(">I", len(idat)) + idat_chunk + struct.pack(">I", zlib.crc32(idat_chunk))
    return b"\x89PNG\r\n\x1a\n" + body


def _file(ctx: Ctx, name: str, data: bytes) -> str:
    path = ctx.tmp / name
    path.write_bytes(data)
    return str(path)


def _decoder_inputs(ctx: Ctx, **replace: np.ndarray | None) -> dict[str, np.ndarray]:
    """Well-formed decoder tensors (one click), with some replaced (None removes one)."""
    inputs = {
        **ctx.features,
        "point_coords": np.array([[[512.0, 512.0], [0.0, 0.0]]], np.float32),
        "point_labels": np.array([[1.0, -1.0]], np.float32),
        "mask_input": np.zeros((1, 1, 256, 256), np.float32),
        "has_mask_input": np.zeros((1, 1), np.float32),
    }
    for name, value in replace.items():
        if value is None:
            inputs.pop(name)
        else:
            inputs[name] = value
    return inputs


def _spec_run(ctx: Ctx, coro: Callable[[SpeculativeSAM2Client], Any]) -> Any:
    async def main() -> Any:
        return await coro(ctx.spec)

    return asyncio.run(main())


# (id, expected exception, field named in the message, action)
Case = tuple[str, type[Exception], str, Callable[[Ctx], Any]]
CASES: list[Case] = [
    # -- images ------------------------------------------------------------------------------
    ("image-corrupt-file", InputValidationError, "image",
     lambda c: c.client.set_image(_file(c, "bad.png", b"\x89PNG\r\n\x1a\nnot really"))),
    ("image-empty-file", InputValidationError, "image",
     lambda c: c.client.set_image(_file(c, "empty.jpg", b""))),
    ("image-corrupt-bytes", InputValidationError, "image",
     lambda c: c.client.set_image(b"GIF89a\x00garbage")),
    ("image-empty-bytes", InputValidationError, "image", lambda c: c.client.set_image(b"")),
    ("image-missing-file", InputValidationError, "image",
     lambda c: c.client.set_image(str(c.tmp / "nope.png"))),
    ("image-20000x20000-file", InputValidationError, "image",
     lambda c: c.client.set_image(_file(c, "huge.png", _png_header(20000, 20000)))),
    ("image-decompression-bomb", InputValidationError, "image",
     lambda c: c.client.set_image(_png_header(60000, 60000))),
    ("image-20000x20000-array", InputValidationError, "image",
     lambda c: c.client.set_image(np.broadcast_to(np.uint8(0), (20000, 20000, 3)))),
    ("image-float-array", InputValidationError, "image",
     lambda c: c.client.set_image(np.zeros((H, W, 3), np.float32))),
    ("image-rgba-array", InputValidationError, "image",
     lambda c: c.client.set_image(np.zeros((H, W, 4), np.uint8))),
    ("image-2d-array", InputValidationError, "image",
     lambda c: c.client.set_image(np.zeros((H, W), np.uint8))),
    ("image-empty-array", InputValidationError, "image",
     lambda c: c.client.set_image(np.zeros((0, W, 3), np.uint8))),
    ("image-float-pil", InputValidationError, "image",
     lambda c: c.client.set_image(Image.new("F", (W, H)))),
    ("image-wrong-type", InputValidationError, "image", lambda c: c.client.set_image([[1, 2]])),
    # -- prompts -----------------------------------------------------------------------------
    ("points-nan", InputValidationError, "point_coords",
     lambda c: c.prompter.predict([[np.nan, 3]], [1])),
    ("points-inf", InputValidationError, "point_coords",
     lambda c: c.prompter.predict([[np.inf, 3]], [1])),
    ("points-outside", InputValidationError, "point_coords",
     lambda c: c.prompter.predict([[W + 5, 3]], [1])),
    ("points-negative", InputValidationError, "point_coords",
     lambda c: c.prompter.predict([[-1, 3]], [1])),
    ("points-not-numbers", InputValidationError, "point_coords",
     lambda c: c.prompter.predict([["a", "b"]], [1])),
    ("points-wrong-shape", InputValidationError, "point_coords",
     lambda c: c.prompter.predict([[1, 2, 3]], [1])),
    ("points-zero", InputValidationError, "point_coords",
     lambda c: c.prompter.predict(np.zeros((0, 2)), np.zeros(0))),
    ("labels-length-mismatch", InputValidationError, "point_labels",
     lambda c: c.prompter.predict([[1, 2], [3, 4]], [1])),
    ("labels-unknown-2", InputValidationError, "point_labels",
     lambda c: c.prompter.predict([[1, 2]], [2])),
    ("labels-nan", InputValidationError, "point_labels",
     lambda c: c.prompter.predict([[1, 2]], [np.nan])),
    ("labels-missing", InputValidationError, "point_labels",
     lambda c: c.prompter.predict(point_coords=[[1, 2]])),
    ("prompt-empty", InputValidationError, "point_coords", lambda c: c.prompter.predict()),
    ("box-inverted", InputValidationError, "box",
     lambda c: c.prompter.predict(box=[40, 30, 10, 5])),
    ("box-wrong-length", InputValidationError, "box",
     lambda c: c.prompter.predict(box=[1, 2, 3, 4, 5])),
    ("box-nan", InputValidationError, "box", lambda c: c.prompter.predict(box=[1, 2, np.nan, 4])),
    ("box-outside", InputValidationError, "box",
     lambda c: c.prompter.predict(box=[0, 0, W, H + 9])),
    ("mask-input-wrong-shape", InputValidationError, "mask_input",
     lambda c: c.prompter.predict(**GOOD_CLICK, mask_input=np.zeros((64, 64)))),
    ("multimask-not-bool", InputValidationError, "multimask_output",
     lambda c: c.prompter.predict(**GOOD_CLICK, multimask_output="yes")),
    # -- models and configuration ------------------------------------------------------------
    ("unknown-model-type", UnsupportedModelError, "sam9",
     lambda c: SAM2TritonClient(c.server.http_url, model_type="sam9")),
    ("unknown-variant", UnsupportedModelError, "sam2.1_hiera_huge",
     lambda c: __import__("triton_sam.models", fromlist=["x"]).get_model("sam2.1_hiera_huge")),
    ("override-without-value", ConfigError, "overrides",
     lambda c: __import__("triton_sam.setup.settings", fromlist=["x"]).load_config(
         "sam2.1_hiera_tiny", ["export.fp16"])),
    ("override-unknown-key", ConfigError, "overrides",
     lambda c: __import__("triton_sam.setup.settings", fromlist=["x"]).load_config(
         "sam2.1_hiera_tiny", ["export.no_such_key=1"])),
    ("client-unknown-decoder-model", ServerUnavailableError, "no_such_decoder",
     lambda c: SAM2TritonClient(c.server.http_url, decoder_model="no_such_decoder")),
    # -- reaching the server: its refusal becomes a typed error with its message --------------
    ("server-unknown-model", ModelNotReadyError, "no_such_model",
     lambda c: c.http.infer("no_such_model", _decoder_inputs(c), ["masks"])),
    ("server-unknown-model-grpc", ModelNotReadyError, "no_such_model",
     lambda c: c.grpc.infer("no_such_model", _decoder_inputs(c), ["masks"])),
    ("server-wrong-shape", InvalidRequestError, "point_coords",
     lambda c: c.http.infer("sam2_decoder", _decoder_inputs(
         c, point_coords=np.zeros((1, 2, 3), np.float32)), ["masks"])),
    ("server-wrong-shape-grpc", InvalidRequestError, "point_coords",
     lambda c: c.grpc.infer("sam2_decoder", _decoder_inputs(
         c, point_coords=np.zeros((1, 2, 3), np.float32)), ["masks"])),
    ("server-wrong-dtype", InvalidRequestError, "point_labels",
     lambda c: c.http.infer("sam2_decoder", _decoder_inputs(
         c, point_labels=np.zeros((1, 2), np.int32)), ["masks"])),
    ("server-missing-input", InvalidRequestError, "has_mask_input",
     lambda c: c.grpc.infer("sam2_decoder", _decoder_inputs(c, has_mask_input=None), ["masks"])),
    ("server-unknown-input", InvalidRequestError, "bogus",
     lambda c: c.http.infer("sam2_decoder", _decoder_inputs(
         c, bogus=np.zeros((1, 1), np.float32)), ["masks"])),
    ("server-unknown-output", InvalidRequestError, "bogus_output",
     lambda c: c.http.infer("sam2_decoder", _decoder_inputs(c), ["bogus_output"])),
    ("server-encoder-wrong-size", InvalidRequestError, "image",
     lambda c: c.grpc.infer("sam2_encoder", {"image": np.zeros((1, 3, 64, 64), np.float32)},
                            ["image_embed"])),
    # -- the speculative client: same checks, before anything is sent -------------------------
    ("spec-image-corrupt-bytes", InputValidationError, "image",
     lambda c: c.spec.set_image(b"\xff\xd8\xff not a jpeg")),
    ("spec-points-nan", InputValidationError, "point_coords",
     lambda c: _spec_run(c, lambda s: s.predict_async([[np.nan, 1]], [1], session_id="a"))),
    ("spec-box-inverted", InputValidationError, "box",
     lambda c: _spec_run(c, lambda s: s.predict_async(box=[9, 9, 1, 1], session_id="b"))),
    ("spec-track-labels-mismatch", InputValidationError, "point_labels",
     lambda c: _spec_run(c, _track([[1, 2], [3, 4]], [1]))),
    ("spec-embedding-wrong-shape", InputValidationError, "embedding",
     lambda c: c.spec.set_image_embedding(
         {k: np.zeros((1, 3)) for k in c.features}, (H, W))),
]  # fmt: skip


_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="bad-input")


def _track(coords: Any, labels: Any) -> Callable[[SpeculativeSAM2Client], Any]:
    async def run(spec: SpeculativeSAM2Client) -> None:
        spec.track("t", coords, labels)

    return run


def _make_ctx(server: Any, tmp: Path) -> Ctx:
    image = np.random.default_rng(0).integers(0, 255, (H, W, 3), dtype=np.uint8)
    client = SAM2TritonClient(server.http_url, timeout_s=CASE_TIMEOUT_S)
    prompter = SAM2TritonClient(server.http_url, timeout_s=CASE_TIMEOUT_S)
    prompter.set_image(image)
    spec = SpeculativeSAM2Client(server.grpc_url, timeout_s=CASE_TIMEOUT_S)
    spec.set_image(image)
    http = Transport(resolve_endpoint(server.http_url, "http"), retry=NO_RETRY)
    grpc = Transport(resolve_endpoint(server.grpc_url, "grpc"), retry=NO_RETRY)
    family = client.family
    tensor = model_frame.preprocess(image, family.preprocessing)
    features = http.infer(family.encoder_model, {"image": tensor}, family.embedding_names)
    return Ctx(server, client, prompter, spec, http, grpc, dict(features), tmp)


def _on_pool(fn: Callable[..., Any], *args: Any, timeout_s: float = CASE_TIMEOUT_S) -> Any:
    """Run on the one worker thread that made the clients: tritonclient's HTTP client
    (gevent) must be used from the thread that created it."""
    return _POOL.submit(fn, *args).result(timeout=timeout_s)


@pytest.fixture(scope="module")
def ctx(sam2_tiny_server, tmp_path_factory) -> Any:
    tmp = tmp_path_factory.mktemp("bad")
    context = _on_pool(_make_ctx, sam2_tiny_server, tmp, timeout_s=300)
    yield context
    for c in (context.client, context.prompter, context.spec, context.http, context.grpc):
        _on_pool(c.close)


def _ready(server: Any) -> bool:
    with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=5) as r:
        return r.status == 200


def test_the_matrix_is_large_enough():
    assert len(CASES) >= 30
    assert len({case[0] for case in CASES}) == len(CASES)


@pytest.mark.parametrize(
    "expected, field, action", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_gives_a_typed_error_and_the_server_stays_ready(ctx, expected, field, action):
    t0 = time.monotonic()
    # Each case runs under its own timeout (not pytest-timeout's, which would also count
    # the session fixtures' export): a hang fails here instead of blocking the suite.
    with pytest.raises(expected) as info:
        _on_pool(action, ctx)
    elapsed = time.monotonic() - t0
    error = info.value
    assert isinstance(error, TritonSamError)
    assert elapsed < CASE_TIMEOUT_S, f"took {elapsed:.1f} s"
    if isinstance(error, InputValidationError):
        assert error.field == field, str(error)
    assert field in str(error), f"the message does not name {field!r}: {error}"
    assert _ready(ctx.server)


def test_server_errors_carry_the_servers_message(ctx):
    inputs = _decoder_inputs(ctx, point_coords=np.zeros((1, 2, 3), np.float32))
    with pytest.raises(InvalidRequestError) as info:
        _on_pool(ctx.http.infer, "sam2_decoder", inputs, ["masks"])
    # Triton's own words, after what we were doing
    assert "infer on sam2_decoder" in str(info.value)
    assert "unexpected shape" in str(info.value)


def test_a_good_request_still_works_after_the_matrix(ctx):
    assert _ready(ctx.server)
    masks, iou = _on_pool(lambda: ctx.prompter.predict(**GOOD_CLICK))
    assert masks.shape == (1, 1, H, W) and np.isfinite(iou).all()
    masks, _ = _on_pool(lambda: ctx.spec.predict_sync(**GOOD_CLICK))
    assert masks.shape == (1, 1, H, W)


@pytest.mark.parametrize(
    "image",
    [
        pytest.param(np.full((1, 1, 3), 200, np.uint8), id="1x1"),
        pytest.param(Image.new("L", (W, H), 90), id="grayscale"),
        pytest.param(Image.new("RGBA", (W, H), (1, 2, 3, 0)), id="rgba"),
        pytest.param(Image.new("I;16", (W, H), 40000), id="16-bit"),
        pytest.param(Image.new("P", (W, H), 3), id="palette"),
    ],
)
def test_unusual_but_valid_images_are_converted_and_segmented(ctx, image):
    def segment() -> tuple[np.ndarray, tuple[int, int]]:
        ctx.client.set_image(image)
        h, w = ctx.client.original_size
        masks, _ = ctx.client.predict(point_coords=[[w / 2, h / 2]], point_labels=[1])
        return masks, (h, w)

    masks, (h, w) = _on_pool(segment)
    assert masks.shape == (1, 1, h, w)
