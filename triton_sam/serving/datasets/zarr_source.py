"""zarr v2 and v3 arrays and groups, and OME-Zarr multiscale images.

- An array opens as it is; its axes are inferred from its shape
  (:func:`~.source.infer_axes`).
- A group needs ``key``, the path of an array inside it (``"raw"``, ``"volumes/raw/s0"``);
  without one it is refused with the arrays it holds.
- A group whose attributes hold OME-Zarr ``multiscales`` (NGFF 0.4: ``attributes
  ["multiscales"]``, zarr v2; 0.5: ``attributes["ome"]["multiscales"]``, zarr v3) is one
  image: its first multiscale's ``datasets`` are the pyramid, level 0 the full resolution,
  and its ``axes`` (names, or objects with a ``name`` and a ``type``) name the dimensions.
  ``key`` is a level index (``"0"``: the full resolution, the default; ``"2"``: level 2 as
  the source's full resolution). A group holding one OME-Zarr image under a key
  (bioformats2raw's layout, key ``"0"``) opens that image.

A node is what its metadata file says: ``zarr.json`` (v3: ``node_type``, ``attributes``),
``.zarray`` (a v2 array) or ``.zgroup``/``.zattrs`` (a v2 group, attributes in ``.zattrs``).
The arrays are read through tensorstore (:mod:`.chunked`, which says why), the metadata
parsed here; a key or an OME-Zarr dataset path never leaves the dataset's folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bounds import RequestError
from .chunked import inside, open_chunked
from .source import Source, infer_axes, level_index

MAX_LISTED = 20  # array names a refusal lists
MAX_WALKED = 1000  # folders a listing visits


@dataclass(frozen=True)
class _Node:
    """One zarr node: ``kind`` ``"array"`` or ``"group"``, ``format`` ``"zarr2"`` or
    ``"zarr3"``, and its user attributes."""

    path: Path
    kind: str
    format: str
    attributes: dict


def open_zarr(path: Path, key: str | None, field: str) -> Source:
    """Opens a zarr array, an array inside a group, or an OME-Zarr image.

    Raises:
        RequestError: a group without ``key``, a ``key`` that names nothing, OME-Zarr
            metadata that names unknown axes, or what :class:`~.source.Source` refuses.
    """
    node = _node(path, field)
    if node is None:
        raise RequestError(field, "not a readable zarr array or group (no metadata)")
    if _multiscales(node) is not None:
        return _open_ome(node, key, field)
    if node.kind == "array":
        if key is not None:
            raise RequestError("request.key", f"got {key!r}, expected none: {field} is an array")
        return _open_array(node, field)
    if key is None:
        raise RequestError(
            "request.key",
            f"{field} is a zarr group: name one of its arrays as the key ({_arrays(path)})",
        )
    child_path = path.joinpath(*key.split("/"))
    child = _node(child_path, field) if inside(child_path, path) else None
    if child is None:
        raise RequestError(
            "request.key", f"got {key!r}, no such array in the group ({_arrays(path)})"
        )
    if _multiscales(child) is not None:
        return _open_ome(child, None, field)
    if child.kind != "array":
        raise RequestError(
            "request.key", f"got {key!r}, a group; expected an array ({_arrays(path)})"
        )
    return _open_array(child, field)


def _open_array(node: _Node, field: str) -> Source:
    array = open_chunked(node.path, node.format, field)
    return Source([array], infer_axes(array.shape, field), field=field)


def _node(path: Path, field: str) -> _Node | None:
    """The zarr node at ``path`` (v3 metadata first), None when it has no zarr metadata.

    Raises:
        RequestError: metadata that is not a JSON object, or an unknown ``node_type``.
    """
    if (path / "zarr.json").is_file():
        metadata = _json(path / "zarr.json", field)
        kind = metadata.get("node_type")
        if kind not in ("array", "group"):
            raise RequestError(field, f"not a readable zarr array or group (node_type {kind!r})")
        return _Node(path, kind, "zarr3", _attributes(metadata.get("attributes", {}), field))
    kind = "array" if (path / ".zarray").is_file() else "group"
    if kind == "group" and not any((path / n).is_file() for n in (".zgroup", ".zattrs")):
        return None
    attributes = _json(path / ".zattrs", field) if (path / ".zattrs").is_file() else {}
    return _Node(path, kind, "zarr2", attributes)


def _json(path: Path, field: str) -> dict:
    try:
        return _attributes(json.loads(path.read_text()), field)
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError included
        raise RequestError(field, f"not a readable zarr array or group ({e})") from None


def _attributes(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise RequestError(field, "not a readable zarr array or group (metadata not an object)")
    return value


def _arrays(group: Path) -> str:
    names = sorted(str(p.relative_to(group)) for p in _walk(group))
    shown = ", ".join(repr(n) for n in names[:MAX_LISTED])
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return f"its arrays and images: {shown}{more}" if names else "it holds no array"


def _walk(group: Path) -> list[Path]:
    """Arrays and OME-Zarr images under a group, at any depth, breadth first; never into an
    array's chunk folders; stops after ``MAX_WALKED`` folders (a refusal lists a few)."""
    found, queue, walked = [], [group], 0
    while queue and walked < MAX_WALKED:
        folder = queue.pop(0)
        walked += 1
        for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()):
            try:
                node = _node(child, "")
            except RequestError:  # unreadable metadata: not listed
                continue
            if node is not None and (node.kind == "array" or _multiscales(node) is not None):
                found.append(child)
            if node is not None and node.kind == "group":
                queue.append(child)
    return found


def _multiscales(node: _Node) -> list | None:
    """The OME-Zarr ``multiscales`` list of a group (NGFF 0.4 or 0.5), else None."""
    attrs = node.attributes if node.kind == "group" else {}
    ome = attrs.get("ome")
    found = attrs.get("multiscales", ome.get("multiscales") if isinstance(ome, dict) else None)
    return found if isinstance(found, list) and found else None


def _open_ome(group: _Node, key: str | None, field: str) -> Source:
    multiscale = _multiscales(group)[0]
    if not isinstance(multiscale, dict):
        raise RequestError(field, "its OME-Zarr multiscales list no dataset paths")
    datasets = multiscale.get("datasets") or []
    paths = [d.get("path") for d in datasets if isinstance(d, dict)]
    if not paths or not all(isinstance(p, str) for p in paths):
        raise RequestError(field, "its OME-Zarr multiscales list no dataset paths")
    first = level_index(key, len(paths))
    arrays = []
    for name in paths[first:]:
        level = group.path.joinpath(*name.split("/"))
        node = _node(level, field) if name and inside(level, group.path) else None
        if node is None or node.kind != "array":
            raise RequestError(field, f"its OME-Zarr level {name!r} is missing")
        arrays.append(open_chunked(level, node.format, field))
    axes = _ome_axes(multiscale.get("axes"), len(arrays[0].shape), field)
    return Source(arrays, axes, field=field)


def _ome_axes(axes: Any, ndim: int, field: str) -> str:
    """The ``tczyx`` letters of OME-Zarr axes: by ``type`` (time, channel), else by name."""
    if not isinstance(axes, list) or len(axes) != ndim:
        raise RequestError(
            field, f"its OME-Zarr axes are {axes!r}, expected one entry per dimension ({ndim})"
        )
    letters = []
    for axis in axes:
        name = axis if isinstance(axis, str) else (axis or {}).get("name")
        kind = None if isinstance(axis, str) else axis.get("type")
        letter = {"time": "t", "channel": "c"}.get(kind, str(name).lower())
        if letter not in "tczyx" or len(letter) != 1:
            raise RequestError(
                field, f"its OME-Zarr axis {axis!r} is none of t, c, z, y, x (by name or type)"
            )
        letters.append(letter)
    return "".join(letters)
