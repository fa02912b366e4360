"""The large model's JSON request, read and checked: every refusal names ``request.<field>``.

Only the checks of the request's own shape live here (types, counts, bounds that need no
image); checks against an image (a point outside it, a piece past its shape) are made where
the image is known (:mod:`.service`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from .. import bounds
from ..bounds import RequestError
from ..protocol import large as protocol

FIELD = protocol.REQUEST
HANDLE_CHARS = 32  # 128 bits as hex, as issued (secrets.token_hex(16))
# Fields each op may carry (anything else is refused: a typo must not be silently ignored).
FIELDS = {
    "open": {"dataset", "key", "mapping", "tile", "halo"},
    "create": {"shape", "dtype", "axes", "mapping", "tile", "halo"},
    "put": {"handle", "offset"},
    "predict": {"handle", "z", "points", "labels", "box", "multimask_output", "mode"},
    "embed": {"handle", "z", "tiles"},
    "status": {"handle", "z"},
    "read": {"handle", "z", "block", "step", "level"},
    "close": {"handle"},
}
MAX_SIDE = 2**31 - 1  # a shape's side: anything larger is not an image
BOX_CORNERS = 2  # a box travels to the decoder as two corner points


def field(name: str) -> str:
    """The wire name of a JSON field (``request.points``)."""
    return f"{FIELD}.{name}"


def parse(blob: bytes, max_bytes: int) -> dict[str, Any]:
    """The request object of ``blob`` (UTF-8 JSON), its op known and its fields the op's.

    Raises:
        RequestError: (``request`` or ``request.<field>``) too long, not UTF-8 JSON, not an
            object, an op given twice or unknown, or a field the op does not take.
    """
    if len(blob) > max_bytes:
        raise RequestError(FIELD, f"got {len(blob)} bytes, expected at most {max_bytes}")
    try:
        request = json.loads(blob.decode("utf-8"), object_pairs_hook=_unique)
    except _Twice as e:
        raise RequestError(field(e.key), "given more than once") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise RequestError(FIELD, f"not UTF-8 JSON ({e})") from None
    if not isinstance(request, dict):
        raise RequestError(FIELD, "expected a JSON object")
    op = request.get("op")
    if op not in protocol.OPS:
        raise RequestError(field("op"), f"got {_show(op)}, expected one of {list(protocol.OPS)}")
    extra = sorted(set(request) - FIELDS[op] - {"op"})
    if extra:
        raise RequestError(
            field(extra[0]), f"not a field of {op!r} (it takes {sorted(FIELDS[op])})"
        )
    return request


class _Twice(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (at any depth: ``mapping`` too)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Twice(key)
        out[key] = value
    return out


def handle(request: dict) -> str:
    """The ``handle`` of a request, as text of the issued form (a miss is decided later)."""
    value = request.get("handle")
    if not isinstance(value, str) or len(value) != HANDLE_CHARS:
        raise RequestError(field("handle"), f"expected the {HANDLE_CHARS}-character handle")
    return value


def integer(request: dict, name: str, *, minimum: int = 0, maximum: int = MAX_SIDE) -> int:
    """A required integer field within [minimum, maximum]."""
    value = request.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise RequestError(
            field(name), f"got {_show(value)}, expected an integer in [{minimum}, {maximum}]"
        )
    return value


def optional_z(request: dict, depth: int | None) -> int | None:
    """``z`` of a volume (required there, in [0, depth)); refused for a 2D image."""
    if depth is None:
        if request.get("z") is not None:
            raise RequestError(field("z"), "given for a 2D image, which has no z")
        return None
    if "z" not in request:
        raise RequestError(field("z"), f"missing: the image is a volume of {depth} slices")
    return integer(request, "z", maximum=depth - 1)


def ints(request: dict, name: str, lengths: tuple[int, ...], *, minimum: int = 0) -> tuple:
    """A list of integers (each >= ``minimum``) of one of ``lengths``."""
    value = request.get(name)
    if (
        not isinstance(value, list)
        or len(value) not in lengths
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not all(minimum <= v <= MAX_SIDE for v in value)
    ):
        sizes = " or ".join(str(n) for n in lengths)
        raise RequestError(
            field(name), f"got {_show(value)}, expected {sizes} integers >= {minimum}"
        )
    return tuple(value)


def block_sides(request: dict, name: str, default: int, *, minimum: int) -> tuple[int, int]:
    """``tile`` / ``halo`` ([rows, cols]), the default when absent."""
    if request.get(name) is None:
        return (default, default)
    return ints(request, name, (2,), minimum=minimum)  # type: ignore[return-value]


def check_block(tile: tuple[int, int], halo: tuple[int, int], max_block: int) -> None:
    """A tile plus twice its halo at most ``max_block`` a side (what one embed reads)."""
    for axis in range(2):
        side = tile[axis] + 2 * halo[axis]
        if side > max_block:
            raise RequestError(
                field("tile"),
                f"tile {list(tile)} with halo {list(halo)} is {side} pixels a side, "
                f"expected at most max_block = {max_block}",
            )


def prompts(request: dict) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """(points float64 [N, 2] (x, y), labels int32 [N], box float64 [4]) of a predict, each
    None when absent; finite, at most ``bounds.MAX_POINTS`` points, labels 0/1."""
    points, labels, box = (request.get(n) for n in ("points", "labels", "box"))
    if (points is None) != (labels is None):
        raise RequestError(field("labels"), "points and labels must be given together")
    if points is None and box is None:
        raise RequestError(field("points"), "no prompt: send points with labels, a box, or both")
    if points is not None:
        points = _numbers(points, "points", (-1, 2))
        most = bounds.MAX_POINTS - (BOX_CORNERS if box is not None else 0)  # as the session
        if not 1 <= len(points) <= most:
            raise RequestError(
                field("points"),
                f"got {len(points)} points, expected 1..{most} (a box counts as two)",
            )
        if (
            not isinstance(labels, list)
            or len(labels) != len(points)
            or any(label not in (0, 1) or isinstance(label, bool) for label in labels)
        ):
            raise RequestError(field("labels"), "expected one 0/1 label per point")
        labels = np.asarray(labels, np.int32)
    if box is not None:
        box = _numbers(box, "box", (4,))
        if box[2] < box[0] or box[3] < box[1]:
            raise RequestError(field("box"), f"got {box.tolist()}, expected x0 <= x1, y0 <= y1")
    return points, labels, box


def flag(request: dict, name: str) -> bool:
    value = request.get(name, False)
    if not isinstance(value, bool):
        raise RequestError(field(name), f"got {_show(value)}, expected true or false")
    return value


def choice(request: dict, name: str, options: tuple[str, ...], default: str) -> str:
    value = request.get(name, default)
    if value not in options:
        raise RequestError(field(name), f"got {_show(value)}, expected one of {list(options)}")
    return value


def tile_ids(request: dict, count: int, most: int) -> list[int]:
    """``tiles`` of an embed: 1..``most`` distinct ids of a grid of ``count`` tiles."""
    value = request.get("tiles")
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= most
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not all(0 <= v < count for v in value)
        or len(set(value)) != len(value)
    ):
        raise RequestError(
            field("tiles"),
            f"got {_show(value)}, expected 1..{most} distinct tile ids in [0, {count})",
        )
    return list(value)


def _numbers(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    ok = (
        array is not None
        and array.ndim == len(shape)
        and all(s in (-1, n) for s, n in zip(shape, array.shape, strict=True))
        and bool(np.isfinite(array).all())
        and not any(isinstance(v, bool) for v in _flat(value))
    )
    if not ok:
        wanted = "[[x, y], ...]" if shape == (-1, 2) else f"{shape[0]} finite numbers"
        raise RequestError(field(name), f"got {_show(value)}, expected {wanted} in pixels")
    return array.reshape(-1, *shape[1:]) if shape[0] == -1 else array


def _flat(value: Any):
    if isinstance(value, list):
        for v in value:
            yield from _flat(v)
    else:
        yield value


def _show(value: Any) -> str:
    text = json.dumps(value) if _jsonable(value) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return not (isinstance(value, float) and not math.isfinite(value))
