"""The SAM_service gateway on a real uvicorn server, and requests as its old clients send them.

``paintera_embed`` replays the request of Paintera's SAM loader before it moved to sam-link
(saalfeldlab/paintera, ``src/main/kotlin/org/janelia/saalfeldlab/paintera/cache/
SamEmbeddingLoaderCache.kt`` at 17ee72df223e7055cdc6d9d126fe5efa1b52a629, ``getImageEmbedding``;
defaults in ``.../paintera/config/SegmentAnythingConfig.kt``): Apache HttpClient 4 posts a
``MultipartEntityBuilder`` entity (strict mode: each part with Content-Type and
Content-Transfer-Encoding) whose image is a piped stream, so the body goes chunked; the image
part first (``image.jpg``, image/jpeg: JPG is the default encoding), then ``session_id`` and
``cancel_pending=true`` as text parts; the URL is ``"$serviceUrl/embedded_model?encoding=
compress"`` with the default service URL ending in ``/`` (so the path starts with ``//``) and
compression on by default; HttpClient asks ``Accept-Encoding: gzip,deflate`` and decodes the
gzip answer itself, then base64-decodes the text.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import requests

_CRLF = b"\r\n"


@contextmanager
def running_gateway(app) -> Iterator[str]:
    """Serve ``app`` on uvicorn in a thread, on a free port; yield its base URL."""
    import uvicorn

    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says
    # TCP, and with Nagle on every keep-alive request after the first waited ~40 ms for a
    # delayed ACK (measured: a POST answered 404 at once took 22-44 ms, 1 ms after this).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def _text_part(boundary: bytes, name: str, value: str) -> bytes:
    return b"".join(
        [
            b"--" + boundary + _CRLF,
            f'Content-Disposition: form-data; name="{name}"'.encode() + _CRLF,
            b"Content-Type: text/plain; charset=ISO-8859-1" + _CRLF,
            b"Content-Transfer-Encoding: 8bit" + _CRLF + _CRLF,
            value.encode("latin-1") + _CRLF,
        ]
    )


def paintera_body(image: bytes, session_id: str | None, boundary: bytes) -> Iterator[bytes]:
    """The multipart body in pieces (chunked on the wire, as a piped stream is sent)."""
    yield b"".join(
        [
            b"--" + boundary + _CRLF,
            b'Content-Disposition: form-data; name="image"; filename="image.jpg"' + _CRLF,
            b"Content-Type: image/jpeg" + _CRLF,
            b"Content-Transfer-Encoding: binary" + _CRLF + _CRLF,
        ]
    )
    for i in range(0, len(image), 8192):
        yield image[i : i + 8192]
    yield _CRLF
    if session_id is not None:
        yield _text_part(boundary, "session_id", session_id)
        yield _text_part(boundary, "cancel_pending", "true")
    yield b"--" + boundary + b"--" + _CRLF


def paintera_embed(
    base_url: str,
    image: bytes,
    session_id: str | None,
    *,
    compress: bool = True,
    stream: bool = False,
) -> requests.Response:
    """POST ``/embedded_model`` as Paintera's loader does (see the module docstring)."""
    boundary = secrets.token_urlsafe(24).replace("_", "a").encode()
    url = f"{base_url}/" + "/embedded_model?" + ("encoding=compress" if compress else "")
    headers = {
        "Content-Type": f"multipart/form-data; boundary={boundary.decode()}",
        "Accept-Encoding": "gzip,deflate",
        "User-Agent": "Apache-HttpClient/4.5.14 (Java/21)",
    }
    body = paintera_body(image, session_id, boundary)  # a generator: Transfer-Encoding chunked
    return requests.post(url, data=body, headers=headers, timeout=600, stream=stream)
