"""zarr v2 and v3 arrays and groups, and OME-Zarr multiscale images, through zarr-python.

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

The metadata is read through zarr (``Group.attrs``), never parsed from files here. zarr is
imported only when a zarr dataset is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..bounds import RequestError
from .source import Source, infer_axes, level_index

MAX_LISTED = 20  # array names a refusal lists


def open_zarr(path: Path, key: str | None, field: str) -> Source:
    """Opens a zarr array, an array inside a group, or an OME-Zarr image.

    Raises:
        RequestError: a group without ``key``, a ``key`` that names nothing, OME-Zarr
            metadata that names unknown axes, or what :class:`~.source.Source` refuses.
    """
    import zarr

    try:
        node = zarr.open(store=str(path), mode="r")
    except Exception as e:  # zarr raises several types for metadata it cannot read
        raise RequestError(field, f"not a readable zarr array or group ({e})") from None
    if _multiscales(node) is not None:
        return _open_ome(node, key, field)
    if isinstance(node, zarr.Array):
        if key is not None:
            raise RequestError("request.key", f"got {key!r}, expected none: {field} is an array")
        return Source([node], infer_axes(node.shape, field), field=field)
    if key is None:
        raise RequestError(
            "request.key",
            f"{field} is a zarr group: name one of its arrays as the key ({_arrays(node)})",
        )
    try:
        child = node[key]
    except (KeyError, ValueError):
        raise RequestError(
            "request.key", f"got {key!r}, no such array in the group ({_arrays(node)})"
        ) from None
    if _multiscales(child) is not None:
        return _open_ome(child, None, field)
    if not isinstance(child, zarr.Array):
        raise RequestError(
            "request.key", f"got {key!r}, a group; expected an array ({_arrays(node)})"
        )
    return Source([child], infer_axes(child.shape, field), field=field)


def _arrays(group: Any) -> str:
    import zarr

    names = sorted(name for name, node in group.members(max_depth=None) if _is_image(node, zarr))
    shown = ", ".join(repr(n) for n in names[:MAX_LISTED])
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return f"its arrays and images: {shown}{more}" if names else "it holds no array"


def _is_image(node: Any, zarr: Any) -> bool:
    return isinstance(node, zarr.Array) or _multiscales(node) is not None


def _multiscales(node: Any) -> list | None:
    """The OME-Zarr ``multiscales`` list of a group (NGFF 0.4 or 0.5), else None."""
    attrs = node.attrs.asdict() if hasattr(node, "members") else {}
    found = attrs.get("multiscales", attrs.get("ome", {}).get("multiscales"))
    return found if isinstance(found, list) and found else None


def _open_ome(group: Any, key: str | None, field: str) -> Source:
    multiscale = _multiscales(group)[0]
    datasets = multiscale.get("datasets") or []
    paths = [d.get("path") for d in datasets if isinstance(d, dict)]
    if not paths or not all(isinstance(p, str) for p in paths):
        raise RequestError(field, "its OME-Zarr multiscales list no dataset paths")
    first = level_index(key, len(paths))
    try:
        arrays = [group[p] for p in paths[first:]]
    except KeyError as e:
        raise RequestError(field, f"its OME-Zarr level {e} is missing") from None
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
