"""Task images fetched from Label Studio, inside bounds (blocking; run it in a thread).

A task names its image by URL (``/data/upload/3/abc.png``, ``/tasks/7/resolve/?fileuri=...``,
or an absolute URL). The backend fetches it with Label Studio's API key, so the URL decides
where a credential goes and what the backend's network position is used for. The policy:

- only ``http`` and ``https``; a relative URL is resolved against the configured Label Studio
  URL;
- an absolute URL only to the configured Label Studio origin (scheme, host, port) or an origin
  the operator allowed; so ``file://``, another port on localhost and cloud metadata addresses
  (``169.254.169.254``) are refused, and so is a redirect to one (redirects are followed by
  hand, each hop checked, at most :data:`MAX_REDIRECTS`);
- the API key (``Authorization: Token ...``) goes to the Label Studio origin only, never to an
  allowed other origin (a presigned storage URL carries its own credential);
- the body is bounded while it streams: a ``Content-Length`` over the bound is refused before
  reading, and reading stops at the bound whatever the header said; then the pixel bound is
  checked from the image header, before any pixel is decoded;
- connect and read timeouts, and a deadline on the whole fetch.

Errors name the task field the URL came from and never hold the key (nor a URL's query, where
presigned credentials live).
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import numpy as np
from PIL import Image, ImageOps

from triton_sam.errors import ImageFetchError, ImageTooLargeError, ImageUrlRefusedError

MAX_REDIRECTS = 3
_DEFAULT_PORTS = {"http": 80, "https": 443}
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class FetchPolicy:
    """Where images may come from and how much of them.

    Attributes:
        base_url: Label Studio's URL (relative task URLs resolve against it; its origin gets
            the API key).
        api_key: Label Studio's API key (``Authorization: Token <key>``), or None.
        allowed_origins: other origins (``https://bucket.example.org``) images may come from,
            fetched without the key.
        max_bytes: largest image file.
        max_pixels: largest H * W.
        connect_timeout_s / read_timeout_s: per connection and per read.
        deadline_s: the whole fetch, redirects included.
    """

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    allowed_origins: tuple[str, ...] = ()
    max_bytes: int = 64 * 2**20
    max_pixels: int = 4096 * 4096
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    deadline_s: float = 60.0

    def __post_init__(self) -> None:
        origin(self.base_url, "label_studio_url")  # fails early on a bad configuration
        for allowed in self.allowed_origins:
            origin(allowed, "allowed_origins")


def origin(url: str, field: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL, the default port filled in.

    Raises:
        ImageUrlRefusedError: another scheme, no host, or a malformed port.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ImageUrlRefusedError(field, f"scheme {scheme or '(none)'!r}, expected http or https")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        raise ImageUrlRefusedError(field, "malformed port") from None
    if not parts.hostname:
        raise ImageUrlRefusedError(field, "no host")
    return scheme, parts.hostname.lower(), port


def _shown(url: str) -> str:
    """A URL for messages: no query, no user info (where credentials travel)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


class Fetcher:
    """Fetch task images under a :class:`FetchPolicy` (one ``requests`` session)."""

    def __init__(self, policy: FetchPolicy) -> None:
        import requests

        self.policy = policy
        self._home = origin(policy.base_url, "label_studio_url")
        self._allowed = {origin(o, "allowed_origins") for o in policy.allowed_origins}
        self._session = requests.Session()
        self._session.trust_env = False  # no proxies or .netrc credentials from the environment

    def close(self) -> None:
        """Close the connections."""
        self._session.close()

    def resolve(self, url: object, field: str) -> str:
        """The absolute URL of a task's image URL, checked against the policy.

        Raises:
            ImageUrlRefusedError: naming ``field``: not text, not http(s), another origin.
        """
        if not isinstance(url, str) or not url:
            raise ImageUrlRefusedError(field, f"expected an image URL, got {type(url).__name__}")
        absolute = urljoin(self.policy.base_url.rstrip("/") + "/", url)
        where = origin(absolute, field)
        if where != self._home and where not in self._allowed:
            raise ImageUrlRefusedError(
                field,
                f"{_shown(absolute)} is outside Label Studio's origin and the allowed origins; "
                "add it with --label-studio-allow-origin if it is trusted",
            )
        return absolute

    def fetch_bytes(self, url: object, field: str) -> bytes:
        """The bytes at a task's image URL, within the policy's bounds.

        Raises:
            ImageUrlRefusedError: the URL or a redirect leaves the policy.
            ImageTooLargeError: over ``max_bytes`` (header or bytes received).
            ImageFetchError: an HTTP error status, a timeout, a connection failure.
        """
        import requests

        deadline = time.monotonic() + self.policy.deadline_s
        current = self.resolve(url, field)
        for _ in range(MAX_REDIRECTS + 1):
            headers = {}
            if origin(current, field) == self._home and self.policy.api_key:
                headers["Authorization"] = f"Token {self.policy.api_key}"
            try:
                with self._session.get(
                    current,
                    headers=headers,
                    stream=True,
                    allow_redirects=False,
                    timeout=(self.policy.connect_timeout_s, self.policy.read_timeout_s),
                ) as response:
                    if response.is_redirect:
                        target = urljoin(current, response.headers.get("location", ""))
                        current = self.resolve(target, field)
                        continue
                    if response.status_code != 200:
                        raise ImageFetchError(
                            field, f"{_shown(current)} answered HTTP {response.status_code}"
                        )
                    return self._bounded(response, current, field, deadline)
            except requests.Timeout:
                raise ImageFetchError(field, f"{_shown(current)} timed out") from None
            except requests.RequestException as e:
                raise ImageFetchError(
                    field, f"{_shown(current)} could not be fetched ({type(e).__name__})"
                ) from None
        raise ImageUrlRefusedError(field, f"more than {MAX_REDIRECTS} redirects")

    def _bounded(self, response, url: str, field: str, deadline: float) -> bytes:
        limit = self.policy.max_bytes
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise ImageTooLargeError(field, f"{_shown(url)} is {length} bytes, at most {limit}")
        received = bytearray()
        for chunk in _chunks(response.iter_content(_CHUNK)):
            received += chunk
            if len(received) > limit:
                raise ImageTooLargeError(field, f"{_shown(url)} sent more than {limit} bytes")
            if time.monotonic() > deadline:
                raise ImageFetchError(field, f"{_shown(url)}: not fetched within the deadline")
        return bytes(received)

    def fetch_image(self, url: object, field: str) -> tuple[bytes, tuple[int, int]]:
        """The file at a task's URL and its (width, height) as shown (EXIF orientation
        applied), read from its header: the pixels are decoded once, by whoever needs them
        (the client, which sends the file, not the pixels, to the server).

        Raises:
            ImageTooLargeError: over the byte or pixel bound.
            ImageFetchError / ImageUrlRefusedError: as :meth:`fetch_bytes`; or not an image.
        """
        data = self.fetch_bytes(url, field)
        return data, image_size(data, self.policy.max_pixels, field)

    def fetch_rgb(self, url: object, field: str) -> np.ndarray:
        """The image at a task's URL as HxWx3 uint8 RGB (EXIF orientation applied, as the
        browser shows it to the annotator).

        Raises:
            ImageTooLargeError: over the byte or pixel bound.
            ImageFetchError / ImageUrlRefusedError: as :meth:`fetch_bytes`; or not an image.
        """
        return decode_rgb(self.fetch_bytes(url, field), self.policy.max_pixels, field)


def _chunks(chunks: Iterable[bytes]) -> Iterable[bytes]:
    yield from (c for c in chunks if c)


# EXIF orientations that turn the image a quarter: the shown width is the stored height.
_QUARTER_TURNS = (5, 6, 7, 8)
_ORIENTATION_TAG = 0x0112


def image_size(data: bytes, max_pixels: int, field: str) -> tuple[int, int]:
    """(width, height) of an image file as shown (EXIF orientation applied), from its header.

    Raises:
        ImageTooLargeError: more than ``max_pixels`` pixels.
        ImageFetchError: not an image PIL reads.
    """
    with _opened(data, field) as image:
        width, height = image.size
        if image.getexif().get(_ORIENTATION_TAG) in _QUARTER_TURNS:
            width, height = height, width
    _check_pixels(width, height, max_pixels, field)
    return width, height


def decode_rgb(data: bytes, max_pixels: int, field: str) -> np.ndarray:
    """Decode image bytes, checking the pixel bound from the header before decoding.

    Raises:
        ImageTooLargeError: more than ``max_pixels`` pixels.
        ImageFetchError: not an image PIL reads.
    """
    with _opened(data, field) as image:
        _check_pixels(*image.size, max_pixels, field)
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


@contextmanager
def _opened(data: bytes, field: str) -> Iterator[Image.Image]:
    """The image in ``data``; what PIL cannot read is an :class:`ImageFetchError` naming
    ``field`` (our own refusals raised inside pass through as they are)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            yield image
    except ImageFetchError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
        raise ImageFetchError(field, f"not an image ({type(e).__name__})") from None


def _check_pixels(width: int, height: int, max_pixels: int, field: str) -> None:
    if width * height > max_pixels:
        raise ImageTooLargeError(field, f"{width}x{height} pixels, at most {max_pixels} (H * W)")
