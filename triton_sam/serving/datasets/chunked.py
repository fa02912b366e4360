"""Chunked arrays on disk (zarr v2, zarr v3, N5) opened with tensorstore, as :class:`Source`
levels.

One engine for every chunked format and both Pythons the readers run under: the project
venv's 3.11 and the GPU container's stub, Python 3.10 (requirements/lock-container.txt),
where zarr-python 3 does not install and zarr-python 2 cannot read zarr v3 (OME-Zarr 0.5)
arrays. tensorstore reads all three formats, sharded zarr v3 included, chunk by chunk on
both. The groups and attributes around the arrays (OME-Zarr ``multiscales``, N5 pyramids)
are plain JSON files the format readers parse themselves.

tensorstore is imported only when a dataset is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..bounds import RequestError

# Chunk cache and decode threads per open dataset: reads are served block by block, so no
# cache beyond the chunks of the read in flight (tensorstore's default is none either).
CONTEXT = {"cache_pool": {"total_bytes_limit": 0}, "data_copy_concurrency": {"limit": 2}}
# tensorstore's driver per format; what a refusal calls the format
DRIVERS = {
    "zarr2": ("zarr", "zarr array"),
    "zarr3": ("zarr3", "zarr array"),
    "n5": ("n5", "N5 dataset"),
}


class ChunkedArray:
    """A tensorstore array as :class:`~.source.Source` reads it.

    ``reverse``: the dimensions the other way round (N5 lists x first; read back in C order).
    ``chunks`` is the unit a read decodes: a sharded zarr v3 array's inner chunk.
    """

    def __init__(self, store: Any, *, reverse: bool = False) -> None:
        self._store = store
        self._reverse = reverse
        order = reversed if reverse else tuple
        self.shape = tuple(int(n) for n in order(store.shape))
        self.dtype = np.dtype(store.dtype.numpy_dtype)
        self.chunks = tuple(int(n) for n in order(store.chunk_layout.read_chunk.shape))

    def __getitem__(self, index: tuple) -> np.ndarray:
        # read() decodes the chunks the region touches, nothing more
        if not self._reverse:
            return self._store[index].read().result()
        return np.transpose(self._store[tuple(reversed(index))].read().result())


def open_chunked(path: Path, kind: str, field: str) -> ChunkedArray:
    """Opens the array at ``path`` read-only; ``kind`` is ``"zarr2"``, ``"zarr3"`` or ``"n5"``.

    Raises:
        RequestError: metadata tensorstore cannot read (it raises ValueError for each).
    """
    import tensorstore as ts

    driver, what = DRIVERS[kind]
    spec = {"driver": driver, "kvstore": {"driver": "file", "path": str(path)}}
    try:
        store = ts.open(spec, read=True, context=ts.Context(CONTEXT)).result()
    except Exception as e:  # ValueError for every metadata problem, others for odd files
        raise RequestError(field, f"not a readable {what} ({e})") from None
    return ChunkedArray(store, reverse=kind == "n5")


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` (a key or a metadata path joined to ``root``) stays inside ``root``
    once links are resolved."""
    return path.resolve().is_relative_to(root.resolve())
