"""The Label Studio backend's image fetcher and its refusals, against tiny local HTTP servers.

Two servers on free localhost ports stand for Label Studio (the configured origin) and for an
outside host; each records the ``Authorization`` header it saw. Nothing reaches Triton: the
route test refuses before any mask is asked for.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import requests
from gateway_support import running_gateway
from PIL import Image

from triton_sam.errors import ImageFetchError, ImageTooLargeError, ImageUrlRefusedError
from triton_sam.gateway import create_app
from triton_sam.label_studio import (
    Fetcher,
    FetchPolicy,
    LabelStudioOptions,
    TritonOptions,
    label_studio_routes,
)
from triton_sam.label_studio.fetch import image_size

KEY = "0123456789abcdef0123456789abcdef01234567"  # the shape of a Label Studio API key
BOUND = 64 * 1024


def _png(h: int = 24, w: int = 32) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), 200, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


class _Site(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen_auth: list[str | None] = []
        self.redirect_to = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Site

    def log_message(self, *args) -> None:  # keep the test output quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.seen_auth.append(self.headers.get("Authorization"))
        if self.path == "/img.png":
            self._send(_png())
        elif self.path == "/big.png":  # says its size up front
            self.send_response(200)
            self.send_header("Content-Length", str(BOUND + 1))
            self.end_headers()
        elif self.path == "/endless.png":  # no Content-Length: the bound must hold while reading
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(64):
                    self.wfile.write(b"\0" * 8192)
            except OSError:
                pass
        elif self.path == "/huge-pixels.png":
            self._send(_png(300, 400))
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)
            self.end_headers()
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[_Site, _Site]]:
    servers = (_Site(), _Site())
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fetcher(sites) -> Iterator[Fetcher]:
    home, other = sites
    home.seen_auth.clear()
    other.seen_auth.clear()
    policy = FetchPolicy(
        home.url, api_key=KEY, max_bytes=BOUND, max_pixels=100_000, read_timeout_s=5.0
    )
    with_other = Fetcher(policy)
    yield with_other
    with_other.close()


def test_a_relative_task_url_is_fetched_from_label_studio_with_its_key(fetcher, sites):
    rgb = fetcher.fetch_rgb("/img.png", "tasks[0].data.image")
    assert rgb.shape == (24, 32, 3) and rgb.dtype == np.uint8
    assert sites[0].seen_auth == [f"Token {KEY}"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("file:///etc/passwd", "scheme 'file'"),
        ("http://169.254.169.254/latest/meta-data/", "outside Label Studio's origin"),
        ("http://127.0.0.1:1/img.png", "outside Label Studio's origin"),
        ("https://example.org/img.png", "outside Label Studio's origin"),
        ("gs://bucket/img.png", "scheme 'gs'"),
        (17, "expected an image URL"),
    ],
    ids=["file", "metadata", "other_port", "other_host", "cloud_scheme", "not_text"],
)
def test_urls_outside_the_policy_are_refused_naming_the_field(fetcher, sites, url, says):
    with pytest.raises(ImageUrlRefusedError, match=f"^tasks\\[0\\].data.image: .*{says}") as e:
        fetcher.fetch_bytes(url, "tasks[0].data.image")
    assert e.value.field == "tasks[0].data.image"
    assert sites[0].seen_auth == []  # nothing was sent anywhere


def test_another_port_on_localhost_is_another_origin(fetcher, sites):
    with pytest.raises(ImageUrlRefusedError, match="outside"):
        fetcher.fetch_bytes(f"{sites[1].url}/img.png", "image")
    assert sites[1].seen_auth == []


def test_redirects_are_followed_inside_the_origin_and_refused_outside_it(fetcher, sites):
    home, other = sites
    home.redirect_to = "/img.png"
    assert fetcher.fetch_bytes("/redirect", "image") == _png()
    for target in ("http://169.254.169.254/latest/meta-data/", f"{other.url}/img.png"):
        home.redirect_to = target
        with pytest.raises(ImageUrlRefusedError, match="^image: .*outside"):
            fetcher.fetch_bytes("/redirect", "image")
    assert other.seen_auth == []


def test_an_allowed_origin_is_fetched_without_the_key(sites):
    home, other = sites
    other.seen_auth.clear()
    fetcher = Fetcher(FetchPolicy(home.url, api_key=KEY, allowed_origins=(other.url,)))
    try:
        assert fetcher.fetch_bytes(f"{other.url}/img.png", "image") == _png()
    finally:
        fetcher.close()
    assert other.seen_auth == [None]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/big.png", f"is {BOUND + 1} bytes, at most {BOUND}"),
        ("/endless.png", f"sent more than {BOUND} bytes"),
        ("/huge-pixels.png", "400x300 pixels, at most 100000"),
    ],
    ids=["content_length", "streamed", "pixels"],
)
def test_too_large_is_refused_while_streaming_or_from_the_header(fetcher, path, says):
    with pytest.raises(ImageTooLargeError, match=f"^image: .*{says}"):
        fetcher.fetch_rgb(path, "image")


def test_the_key_is_never_logged_nor_in_an_error(fetcher, caplog):
    caplog.set_level(logging.DEBUG)  # urllib3 and requests log each request at DEBUG
    with pytest.raises(ImageFetchError) as e:
        fetcher.fetch_bytes("/missing.png?token=presigned-secret", "image")
    assert "HTTP 404" in str(e.value) and "presigned-secret" not in str(e.value)
    assert caplog.records and KEY not in caplog.text
    assert KEY not in repr(fetcher.policy)


def test_the_route_answers_a_failed_fetch_with_the_field_and_logs_no_key(sites, caplog):
    """A /predict whose image is missing in Label Studio: 502 naming the task field; the
    backend's log line has no key (Triton is never reached: nothing listens at its URL)."""
    caplog.set_level(logging.DEBUG)
    options = LabelStudioOptions(
        fetch=FetchPolicy(sites[0].url, api_key=KEY),
        triton=TritonOptions(url="127.0.0.1:1"),
    )
    routes, close = label_studio_routes(options)
    app = create_app(extra_routes=routes, on_close=[close])
    body = {
        "tasks": [{"id": 1, "data": {"image": "/missing.png"}}],
        "label_config": (
            '<View><Image name="image" value="$image"/>'
            '<BrushLabels name="tag" toName="image"><Label value="Cell"/></BrushLabels>'
            '<KeyPointLabels name="kp" toName="image"><Label value="Cell"/></KeyPointLabels>'
            "</View>"
        ),
        "params": {
            "context": {
                "result": [
                    {
                        "original_width": 32,
                        "original_height": 24,
                        "image_rotation": 0,
                        "value": {"x": 50, "y": 50, "keypointlabels": ["Cell"]},
                        "is_positive": True,
                        "type": "keypointlabels",
                    }
                ]
            }
        },
    }
    with running_gateway(app) as url:
        answer = requests.post(f"{url}/label-studio/predict", json=body, timeout=30)
    assert answer.status_code == 502, answer.text
    assert answer.json()["field"] == "tasks[0].data.image" and "HTTP 404" in answer.text
    assert "refused (502)" in caplog.text and KEY not in caplog.text and KEY not in answer.text


def test_the_size_is_read_from_the_header_as_the_browser_shows_it():
    """A photo stored 32x24 with EXIF orientation 6 (a quarter turn) is shown 24x32: that is
    the size Label Studio's percentages refer to."""
    buffer = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.zeros((24, 32, 3), np.uint8)).save(buffer, "JPEG", exif=exif)
    assert image_size(buffer.getvalue(), 10_000, "image") == (24, 32)
    assert image_size(_png(), 10_000, "image") == (32, 24)
    with pytest.raises(ImageTooLargeError, match="^image: 32x24 pixels, at most 700"):
        image_size(_png(), 700, "image")
    with pytest.raises(ImageFetchError, match="^tasks\\[0\\].data.image: not an image"):
        image_size(b"<html>login</html>", 10_000, "tasks[0].data.image")
