"""Hardening without a server: the queue policy in the configs, the image size limit, TLS
options and the translation of Triton's refusals into typed errors."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from triton_sam.client import image_io
from triton_sam.client.transport import TlsOptions, translate_error
from triton_sam.errors import (
    InputValidationError,
    InvalidRequestError,
    ModelNotReadyError,
    ServerOverloadedError,
    ServerUnavailableError,
)
from triton_sam.models import get_family
from triton_sam.repository.config import (
    RepositoryOptions,
    build_config,
    parse_config,
    render_config,
)

SAM2 = get_family("sam2")


# -- queue policy ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "graph, size, timeout_us", [("encoder", 16, 60_000_000), ("decoder", 64, 10_000_000)]
)
def test_every_model_rejects_overload_by_default(graph, size, timeout_us):
    config = build_config(SAM2, graph, RepositoryOptions())
    policy = config.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == size
    assert policy.default_timeout_microseconds == timeout_us
    assert policy.timeout_action == policy.REJECT
    assert policy.allow_timeout_override


def test_queue_policy_is_configurable_and_survives_a_round_trip():
    options = RepositoryOptions(decoder_max_queue_size=3, decoder_queue_timeout_us=250_000)
    text = render_config(SAM2, "decoder", options)
    assert "max_queue_size: 3" in text and "default_timeout_microseconds: 250000" in text
    policy = parse_config(text).dynamic_batching.default_queue_policy
    assert (policy.max_queue_size, policy.default_timeout_microseconds) == (3, 250_000)


def test_zero_means_unbounded():
    options = RepositoryOptions(encoder_max_queue_size=0, encoder_queue_timeout_us=0)
    config = build_config(SAM2, "encoder", options)
    assert not config.dynamic_batching.HasField("default_queue_policy")


@pytest.mark.parametrize("field", ["decoder_max_queue_size", "encoder_queue_timeout_us"])
def test_negative_queue_settings_are_refused(field):
    with pytest.raises(InputValidationError) as info:
        RepositoryOptions(**{field: -1})
    assert info.value.field == field


# -- image size limit -----------------------------------------------------------------------
def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_header(width: int, height: int) -> bytes:
    """A PNG claiming ``width`` x ``height`` with almost no pixel data behind it."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00" * 16))
    )


def test_huge_array_is_refused_without_being_copied():
    huge = np.broadcast_to(np.uint8(0), (20000, 20000, 3))  # no memory behind it
    with pytest.raises(InputValidationError, match="400.0 megapixels") as info:
        image_io.load_image(huge)
    assert info.value.field == "image"
    assert "TRITON_SAM_MAX_IMAGE_PIXELS" in str(info.value) and "downscale" in str(info.value)


def test_huge_file_is_refused_from_its_header():
    with pytest.raises(InputValidationError, match="10000x10000"):
        image_io.load_image(_png_header(10000, 10000))


def test_decompression_bomb_is_refused_with_advice():
    with pytest.raises(InputValidationError, match="decompression-bomb"):
        image_io.load_image(_png_header(60000, 60000))


def test_the_limit_can_be_raised_or_lowered(monkeypatch):
    image = np.zeros((100, 100, 3), np.uint8)
    with pytest.raises(InputValidationError):
        image_io.load_image(image, max_pixels=9_999)
    assert image_io.load_image(image, max_pixels=10_000).shape == (100, 100, 3)
    monkeypatch.setenv(image_io.MAX_PIXELS_ENV, "5000")
    with pytest.raises(InputValidationError):
        image_io.load_image(image)
    monkeypatch.setenv(image_io.MAX_PIXELS_ENV, "0")
    assert image_io.load_image(np.broadcast_to(np.uint8(0), (9000, 9000, 3))).shape[0] == 9000
    monkeypatch.setenv(image_io.MAX_PIXELS_ENV, "lots")
    with pytest.raises(InputValidationError) as info:
        image_io.load_image(image)
    assert info.value.field == image_io.MAX_PIXELS_ENV


def test_encoded_bytes_are_decoded():
    buffer = io.BytesIO()
    Image.new("RGB", (5, 4), (10, 20, 30)).save(buffer, format="PNG")
    rgb = image_io.load_image(buffer.getvalue())
    assert rgb.shape == (4, 5, 3) and tuple(rgb[0, 0]) == (10, 20, 30)


@pytest.mark.parametrize("data", [b"", b"\x00" * 10, b"\x89PNG\r\n\x1a\ntruncated"])
def test_corrupt_bytes_are_refused(data):
    with pytest.raises(InputValidationError, match="the given bytes") as info:
        image_io.load_image(data)
    assert info.value.field == "image"


# -- TLS ------------------------------------------------------------------------------------
def test_tls_options_map_to_tritonclient_arguments():
    tls = TlsOptions(root_certificates="ca.pem", private_key="k.pem", certificate_chain="c.pem")
    assert tls.grpc_options() == {
        "root_certificates": "ca.pem",
        "private_key": "k.pem",
        "certificate_chain": "c.pem",
    }
    assert tls.http_options() == {
        "ssl_options": {"ca_certs": "ca.pem", "certfile": "c.pem", "keyfile": "k.pem"},
        "insecure": False,
    }
    assert TlsOptions().http_options() == {"ssl_options": None, "insecure": False}


def test_insecure_tls_context_skips_verification():
    import ssl

    context = TlsOptions(insecure=True).ssl_context()
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname


# -- Triton's refusals, typed ----------------------------------------------------------------
@pytest.mark.parametrize(
    "message, status, expected",
    [
        ("Request for unknown model: 'sam2_decoder' is not found", "400", ModelNotReadyError),
        (
            "Request for unknown model: 'sam2_decoder' has no available versions",
            "StatusCode.UNAVAILABLE",
            ModelNotReadyError,
        ),
        ("Exceeds maximum queue size", "StatusCode.UNAVAILABLE", ServerOverloadedError),
        ("Request timeout expired", "503", ServerOverloadedError),
        # the session model's own queue of clicks (serving/click_queue.py), both transports
        (
            "triton_sam.Overloaded: exceeds maximum queue size: 64 clicks wait for the decoder",
            "StatusCode.UNAVAILABLE",
            ServerOverloadedError,
        ),
        (
            "triton_sam.Overloaded: exceeds maximum queue size: 64 clicks wait for the decoder",
            "503",
            ServerOverloadedError,
        ),
        ("unexpected datatype TYPE_INT32 for inference input 'p'", "400", InvalidRequestError),
        ("failed to connect to all addresses", "StatusCode.UNAVAILABLE", ServerUnavailableError),
    ],
)
def test_triton_refusals_become_typed_errors(message, status, expected):
    from tritonclient.utils import InferenceServerException

    error = translate_error(InferenceServerException(message, status=status), what="infer on m")
    assert type(error) is expected
    assert message in str(error)
    if expected is ModelNotReadyError:
        assert error.model == "sam2_decoder" and "'sam2_decoder'" in str(error)
