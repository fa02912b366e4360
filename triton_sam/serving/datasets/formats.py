"""Which reader opens a path: one function, :func:`open_source`, for every format.

A directory is zarr (``zarr.json``: v3; ``.zarray``, ``.zgroup`` or ``.zattrs``: v2; an
OME-Zarr image is a zarr group) or N5 (``attributes.json``); a file is a TIFF when its first
four bytes are a TIFF or BigTIFF header. Anything else (a PNG, a text file, a folder of
files) is refused naming the field: the server reads no format it does not know.
"""

from __future__ import annotations

from pathlib import Path

from ..bounds import RequestError
from .n5_source import ATTRIBUTES, open_n5
from .source import Source
from .tiff_source import is_tiff, open_tiff
from .zarr_source import open_zarr

ZARR_MARKERS = ("zarr.json", ".zarray", ".zgroup", ".zattrs")
MAX_KEY_CHARS = 256
FORMATS = "a zarr or OME-Zarr folder, an N5 folder, or a TIFF file (BigTIFF, OME-TIFF, slides)"


def open_source(path: Path, key: str | None = None, *, field: str = "request.dataset") -> Source:
    """Opens an image or volume for region reads, whatever its format.

    Args:
        path: the dataset (a folder or file, already resolved under a data root:
            :meth:`~.roots.DataRoots.resolve`).
        key: an array inside a zarr or N5 group, or a pyramid level index of an OME-Zarr
            image or pyramidal TIFF (``"0"``: full resolution).
        field: the request field refusals name.

    Returns:
        The opened :class:`~.source.Source`; close it when done.

    Raises:
        RequestError: an unknown format, a missing path, a bad key, or anything the format's
            reader refuses (dtype, axes, chunk size).
    """
    path = Path(path)
    if key is not None:
        _check_key(key)
    try:
        return _open(path, key, field)
    except OSError as e:  # unreadable (permissions, a vanished file): no path in the message
        raise RequestError(field, f"cannot be read ({e.strerror or type(e).__name__})") from None


def _open(path: Path, key: str | None, field: str) -> Source:
    if path.is_dir():
        if any((path / name).is_file() for name in ZARR_MARKERS):
            return open_zarr(path, key, field)
        if (path / ATTRIBUTES).is_file():
            return open_n5(path, key, field)
        raise RequestError(field, f"a folder with no zarr or N5 metadata; expected {FORMATS}")
    if path.is_file():
        if is_tiff(path):
            return open_tiff(path, key, field)
        raise RequestError(field, f"a file of an unknown format; expected {FORMATS}")
    if path.exists():
        raise RequestError(field, f"neither a file nor a folder; expected {FORMATS}")
    raise RequestError(field, "no such dataset")


def _check_key(key: str) -> None:
    if not isinstance(key, str):
        raise RequestError("request.key", f"got {type(key).__name__}, expected a string")
    parts = key.split("/")
    bad = (
        len(key) > MAX_KEY_CHARS
        or "\0" in key
        or "\\" in key
        or any(part in ("", ".", "..") for part in parts)
    )
    if bad:
        raise RequestError(
            "request.key",
            f"got {key[:MAX_KEY_CHARS]!r}, expected a path inside the dataset ('raw', "
            f"'volumes/raw/s0') or a level index ('0'), at most {MAX_KEY_CHARS} characters, "
            "without '..', '.', empty parts or backslashes",
        )
