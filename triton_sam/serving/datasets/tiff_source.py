"""TIFF, BigTIFF, OME-TIFF and pyramidal slides (tiled or striped), through tifffile.

The first series of the file is the image (a slide's other series are its label, macro and
thumbnail); its ``levels`` are the pyramid (SubIFDs, OME-TIFF or SVS reduced pages), level
0 the full resolution. ``key``, when given, is a level index, as for OME-Zarr.

Each level is read without decoding more than a read touches:

- compressed or tiled data through ``series.aszarr(level=...)`` opened with zarr: a read
  decodes only the tiles or strips it touches (LZW, JPEG and JPEG 2000 through imagecodecs).
  The store is the one the installed tifffile serves, a zarr 3 store from tifffile 2026 (the
  project venv, Python 3.11, zarr 3), a zarr 2 one from tifffile 2025.5.10 (its last release
  for Python 3.10, the GPU container's stub: zarr 2, requirements/lock-container.txt);
  ``zarr.open_array(store, mode="r")`` and the reads are the same calls in both zarrs;
- uncompressed contiguous data (ImageJ's and most microscopes' plain TIFF, often one strip
  the size of the image) through ``tifffile.memmap``: a read touches only its rows' pages.

Axes are tifffile's: ``Y``, ``X``; ``S`` (samples) or ``C`` (channels) the channels; ``Z``
the volume's slices, or, when there is no ``Z``, the one page axis (``I``, ``Q``, ``T``...) of a
stack that holds more than one page. tifffile and zarr are imported only when a TIFF is
opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..bounds import RequestError
from .source import Source, level_index

MAGIC = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")  # TIFF and BigTIFF, either byte order


class _Mapped:
    """An uncompressed level as a read-only memory map (no decode: ``chunks`` is None)."""

    def __init__(self, array: np.memmap) -> None:
        self._array = array
        self.shape = tuple(array.shape)
        self.dtype = array.dtype
        self.chunks = None

    def __getitem__(self, index: tuple) -> np.ndarray:
        return np.array(self._array[index])  # a copy: the map stays private to the source


def is_tiff(path: Path) -> bool:
    """Whether the file starts with a TIFF or BigTIFF header."""
    with path.open("rb") as f:
        return f.read(4) in MAGIC


def open_tiff(path: Path, key: str | None, field: str) -> Source:
    """Opens the first series of a TIFF file, its pyramid levels included.

    Raises:
        RequestError: a file tifffile cannot read, a ``key`` that is no level index, axes
            that are not one image or volume, or what :class:`~.source.Source` refuses.
    """
    import tifffile

    try:
        tif = tifffile.TiffFile(path)
        series = tif.series[0]
    except Exception as e:  # tifffile raises TiffFileError, ValueError, IndexError...
        raise RequestError(field, f"not a readable TIFF ({e})") from None
    try:
        first = level_index(key, len(series.levels))
        native = _native_axes(series.axes, series.shape, field)
        arrays = [_level(path, tif, series, level) for level in range(first, len(series.levels))]
    except BaseException:
        tif.close()
        raise
    return Source(arrays, native, field=field, close=tif.close)


def _level(path: Path, tif: Any, series: Any, level: int) -> Any:
    import tifffile
    import zarr

    if series.levels[level].dataoffset is not None:
        try:
            return _Mapped(tifffile.memmap(path, series=0, level=level, mode="r"))
        except ValueError:  # tifffile's own check disagrees (e.g. a fill order): decode
            pass
    return zarr.open_array(series.aszarr(level=level), mode="r")


def _native_axes(axes: str, shape: tuple[int, ...], field: str) -> str:
    """tifffile's axis letters as ``tczyx``: S/C are c, Z is z, and one page axis of more
    than one page is z when there is no Z; every other axis must have one page (t)."""
    size = dict(zip(axes, shape, strict=True))
    pages = [a for a in axes if a not in "YXSCZ" and size[a] > 1]
    if len(pages) > 1 or (pages and "Z" in axes) or ("S" in size and "C" in size):
        raise RequestError(
            field,
            f"got TIFF axes {axes} of shape {tuple(shape)}, expected one image or one volume "
            "(Y, X, one channel axis S or C, one z axis): save one per file",
        )
    letters = {"Y": "y", "X": "x", "S": "c", "C": "c", "Z": "z"}
    return "".join(letters.get(a, "z" if a in pages else "t") for a in axes)
