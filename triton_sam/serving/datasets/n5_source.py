"""N5 datasets (Paintera, BigDataViewer, webKnossos, z5py), through tensorstore's n5 driver.

tensorstore reads N5 chunk by chunk (:mod:`.chunked`). N5 lists its dimensions the
other way round (``"dimensions": [x, y, z]`` in ``attributes.json``, the first one varying
fastest in a block, as the Java library writes them); tensorstore exposes them in that
order, so a dataset is reversed here into (z, y, x) before its axes are read
(:func:`~.source.infer_axes` on the reversed shape, or the dataset's ``axes`` attribute
when it has one, e.g. ``["x", "y", "z"]``). A group holding ``s0``, ``s1``, ... (a scale
pyramid as Paintera, BigDataViewer and z5py write it) is one image whose levels those are;
any other group (``attributes.json`` without ``dimensions``) needs ``key``, the path of a
dataset or pyramid inside it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..bounds import RequestError
from .chunked import inside, open_chunked
from .source import Source, infer_axes

ATTRIBUTES = "attributes.json"
MAX_LISTED = 20
MAX_WALKED = 1000  # folders a listing visits
MAX_LEVELS = 32  # s0..s31: a 2^31 downsampling is past any image


def open_n5(path: Path, key: str | None, field: str) -> Source:
    """Opens an N5 dataset, a scale pyramid, or the dataset or pyramid ``key`` in a group.

    Raises:
        RequestError: a group (not a pyramid) without ``key``, a ``key`` that names no
            dataset, or a dataset tensorstore cannot read.
    """
    attributes = _attributes(path, field)
    if "dimensions" in attributes:
        if key is not None:
            raise RequestError("request.key", f"got {key!r}, expected none: {field} is a dataset")
        return _open_levels([path], attributes, field)
    if key is not None:
        dataset = path.joinpath(*key.split("/"))
        if not inside(dataset, path) or not (dataset / ATTRIBUTES).is_file():
            raise RequestError(
                "request.key", f"got {key!r}, no such dataset in the group ({_datasets(path)})"
            )
        return open_n5(dataset, None, field)
    scales = _scales(path)
    if scales:
        return _open_levels(scales, _attributes(scales[0], field), field)
    raise RequestError(
        "request.key",
        f"{field} is an N5 group: name one of its datasets as the key ({_datasets(path)})",
    )


def _scales(group: Path) -> list[Path]:
    """A scale pyramid's datasets ``s0``, ``s1``, ... (Paintera's, BigDataViewer's and
    z5py's layout), consecutive from ``s0``; empty when the group has no ``s0``."""
    levels: list[Path] = []
    while len(levels) < MAX_LEVELS and (group / f"s{len(levels)}" / ATTRIBUTES).is_file():
        levels.append(group / f"s{len(levels)}")
    return levels


def _open_levels(paths: list[Path], attributes: dict, field: str) -> Source:
    """The datasets ``paths`` (full resolution first) as one source, axes from the first."""
    arrays = [open_chunked(p, "n5", field) for p in paths]
    axes = attributes.get("axes")
    if isinstance(axes, list) and all(isinstance(a, str) for a in axes):
        native = "".join(a.lower()[:1] for a in reversed(axes))
    else:
        native = infer_axes(arrays[0].shape, field)
    return Source(arrays, native, field=field)


def _attributes(path: Path, field: str) -> dict:
    try:
        attributes = json.loads((path / ATTRIBUTES).read_text())
    except (OSError, ValueError) as e:
        raise RequestError(field, f"not a readable N5 container ({e})") from None
    if not isinstance(attributes, dict):
        raise RequestError(field, f"not an N5 container: {ATTRIBUTES} is not an object")
    return attributes


def _datasets(group: Path) -> str:
    names = [str(p.relative_to(group)) for p in _walk(group)]
    shown = ", ".join(repr(n) for n in names[:MAX_LISTED])
    more = " and more" if len(names) > MAX_LISTED else ""
    return f"its datasets: {shown}{more}" if names else "it holds no dataset"


def _walk(group: Path) -> list[Path]:
    """Datasets under a group, breadth first, never into a dataset's block folders; stops
    after ``MAX_LISTED + 1`` datasets or ``MAX_WALKED`` folders (a refusal lists a few)."""
    found, queue, walked = [], [group], 0
    while queue and len(found) <= MAX_LISTED and walked < MAX_WALKED:
        folder = queue.pop(0)
        walked += 1
        for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()):
            try:
                attributes = json.loads((child / ATTRIBUTES).read_text())
            except (OSError, ValueError):
                attributes = None
            if isinstance(attributes, dict) and "dimensions" in attributes:
                found.append(child)
            else:  # a group (its attributes.json is optional in N5)
                queue.append(child)
    return sorted(found)
