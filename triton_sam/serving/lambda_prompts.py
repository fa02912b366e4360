"""The Lambda seed's JSON contract, checked and answered (standard library and numpy only).

Used by the ``sam2`` model (``serving/lambda_model.py``, shipped beside it) and by the tests.
The contract and the forms accepted are in :mod:`.protocol.lambda_json`. Every check raises
:class:`~.bounds.RequestError` naming the field as the client wrote it: ``image_b64``,
``prompt_json``, ``prompt_json.points[2].x``, ``prompt_json.boxes[1]``...
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .bounds import RequestError
from .protocol import lambda_json as protocol

PROMPT = protocol.PROMPT_JSON
_WHITESPACE = b" \t\r\n"


@dataclass
class Prompt:
    """A checked prompt: pixels of the original image.

    Attributes:
        points: float64 [N, 2] (X, Y); labels: int32 [N], 0 or 1.
        boxes: float32 [M, 4] (x1, y1, x2, y2), each its own mask.
        given: the parsed JSON object, echoed in ``result_json.inputs.prompt`` as the seed does.
    """

    points: np.ndarray
    labels: np.ndarray
    boxes: np.ndarray
    given: dict[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """No points and no boxes (the seed script's default prompt)."""
        return not len(self.points) and not len(self.boxes)

    def requests(self) -> list[tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]]:
        """(points [N, 2], labels [N], box [4]) of each session request, None where absent:
        one per box (points only beside a single box), else one with the points (an empty
        prompt is answered otherwise: :attr:`empty`)."""
        if len(self.boxes):
            clicks = (self.points, self.labels) if len(self.points) else (None, None)
            return [(*clicks, box) for box in self.boxes]
        return [(self.points, self.labels, None)]


def decode_image_b64(value: bytes, *, max_bytes: int) -> bytes:
    """The image file ``image_b64`` carries: standard base64 (``+/``, ``=`` padding), line
    breaks and spaces ignored (``base64`` without ``-w0`` wraps lines), nothing else.

    Raises:
        RequestError: (``image_b64``) longer than ``max_bytes`` would encode to, not base64,
            or empty.
    """
    limit = 4 * math.ceil(max_bytes / 3)
    if len(value) > limit + limit // 32 + 16:  # room for a line break every 64 characters
        raise RequestError(
            protocol.IMAGE_B64,
            f"got {len(value)} characters, expected the base64 of at most {max_bytes} bytes",
        )
    compact = value.translate(None, _WHITESPACE)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as e:
        raise RequestError(
            protocol.IMAGE_B64, f"not standard base64 ({e}); expected a base64-encoded image file"
        ) from None
    if not data:
        raise RequestError(protocol.IMAGE_B64, "empty; expected a base64-encoded image file")
    if len(data) > max_bytes:
        raise RequestError(
            protocol.IMAGE_B64, f"got {len(data)} bytes, expected at most {max_bytes}"
        )
    return data


def parse_prompt(
    value: bytes,
    *,
    max_points: int,
    max_boxes: int = protocol.DEFAULT_MAX_BOXES,
    max_bytes: int = protocol.DEFAULT_MAX_PROMPT_BYTES,
) -> Prompt:
    """Check ``prompt_json`` (UTF-8 JSON text) and return its prompt.

    Args:
        max_points: the session model's bound (box corners and padding included): at most
            ``max_points`` - 2 points are taken, with or without a box.
        max_boxes: most boxes (each one decoder run).
        max_bytes: most bytes of JSON text.

    Raises:
        RequestError: naming the field (see :mod:`.protocol.lambda_json`).
    """
    if len(value) > max_bytes:
        raise RequestError(PROMPT, f"got {len(value)} bytes, expected at most {max_bytes}")
    try:
        given = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RequestError(
            PROMPT, f'not JSON ({e}); expected an object such as {{"points": [], "boxes": []}}'
        ) from None
    if not isinstance(given, dict):
        raise RequestError(
            PROMPT, f"got a JSON {type(given).__name__}, expected an object with points / boxes"
        )
    unknown = sorted(set(given) - set(protocol.PROMPT_KEYS))
    if unknown:
        raise RequestError(
            f"{PROMPT}.{unknown[0]}", f"unknown key, expected only {list(protocol.PROMPT_KEYS)}"
        )
    points, labels = _points(given.get("points"), max_points - protocol.BOX_CORNERS)
    boxes = _boxes(given.get("boxes"), max_boxes)
    if len(boxes) > 1 and len(points):
        raise RequestError(
            f"{PROMPT}.points",
            f"given with {len(boxes)} boxes; points go with one box (one mask), several "
            "boxes give one mask each and take no points",
        )
    return Prompt(points, labels, boxes, given)


def _points(items: Any, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    where = f"{PROMPT}.points"
    if items is None:
        items = []
    if not isinstance(items, list):
        raise RequestError(where, f"got a JSON {type(items).__name__}, expected a list")
    if len(items) > max_points:
        raise RequestError(
            where,
            f"got {len(items)} points, expected at most {max_points} (the decoder's memory "
            "grows with every point)",
        )
    coords, labels = [], []
    for i, item in enumerate(items):
        here = f"{where}[{i}]"
        if isinstance(item, dict):
            extra = sorted(set(item) - {"x", "y", "label"})
            if extra:
                raise RequestError(f"{here}.{extra[0]}", "unknown key, expected x, y, label")
            for key in ("x", "y"):
                if key not in item:
                    raise RequestError(f"{here}.{key}", "missing, expected a number (pixels)")
            x, y = _number(item["x"], f"{here}.x"), _number(item["y"], f"{here}.y")
            label = item.get("label", 1)
            label_at = f"{here}.label"
        elif isinstance(item, list) and len(item) in (2, 3):
            x, y = _number(item[0], f"{here}[0]"), _number(item[1], f"{here}[1]")
            label = item[2] if len(item) == 3 else 1
            label_at = f"{here}[2]"
        else:
            raise RequestError(
                here, 'expected {"x": X, "y": Y, "label": 0|1}, [X, Y] or [X, Y, label]'
            )
        if isinstance(label, bool) or label not in (0, 1):
            raise RequestError(
                label_at, f"got {label!r}, expected 0 (background) or 1 (foreground)"
            )
        coords.append((x, y))
        labels.append(int(label))
    return (
        np.array(coords, np.float64).reshape(-1, 2),
        np.array(labels, np.int32).reshape(-1),
    )


def _boxes(items: Any, max_boxes: int) -> np.ndarray:
    where = f"{PROMPT}.boxes"
    if items is None:
        items = []
    if not isinstance(items, list):
        raise RequestError(where, f"got a JSON {type(items).__name__}, expected a list")
    if len(items) == 4 and all(_is_number(v) for v in items):  # the seed's one flat box
        return _box(items, where)[None]
    if len(items) > max_boxes:
        raise RequestError(
            where,
            f"got {len(items)} boxes, expected at most {max_boxes} (each is one decoder run)",
        )
    boxes = [_box(item, f"{where}[{i}]") for i, item in enumerate(items)]
    return np.array(boxes, np.float32).reshape(-1, 4)


def _box(item: Any, where: str) -> np.ndarray:
    if isinstance(item, dict):
        keys = ("x1", "y1", "x2", "y2")
        extra = sorted(set(item) - set(keys))
        missing = [k for k in keys if k not in item]
        if extra or missing:
            name = (extra or missing)[0]
            raise RequestError(f"{where}.{name}", "expected exactly x1, y1, x2, y2")
        values = [_number(item[k], f"{where}.{k}") for k in keys]
    elif isinstance(item, list) and len(item) == 4:
        values = [_number(v, f"{where}[{k}]") for k, v in enumerate(item)]
    else:
        raise RequestError(where, "expected [x1, y1, x2, y2] pixels")
    x1, y1, x2, y2 = values
    if not (x1 < x2 and y1 < y2):
        raise RequestError(
            where, f"got {values}, expected x1 < x2 and y1 < y2 (top-left, bottom-right)"
        )
    return np.array(values, np.float32)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any, where: str) -> float:
    # json.loads takes NaN and Infinity literals: refused here, not passed on as a click.
    if not _is_number(value) or not math.isfinite(value):
        raise RequestError(where, f"got {value!r}, expected a finite number (pixels)")
    return float(value)


def encode_png_gray8(mask: np.ndarray) -> bytes:
    """A bool [H, W] mask as an 8-bit grayscale PNG, 255 = mask, 0 = background: the seed's
    encoding (``Image.fromarray(mask.astype(uint8) * 255)``), which its readers threshold."""
    mask = np.asarray(mask, dtype=bool)
    h, w = mask.shape
    rows = mask.astype(np.uint8) * np.uint8(255)
    scanlines = np.concatenate([np.zeros((h, 1), np.uint8), rows], axis=1)  # filter 0
    header = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)  # 8 bits, grayscale

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            chunk(b"IHDR", header),
            chunk(b"IDAT", zlib.compress(scanlines.tobytes(), 6)),
            chunk(b"IEND", b""),
        ]
    )


def result_json(
    model: str,
    image_b64_chars: int,
    prompt: Prompt,
    masks: list[np.ndarray],
    scores: list[float],
    image_size: tuple[int, int],
) -> str:
    """The ``result_json`` text: the seed's fields (``model``, ``ok``, ``message``,
    ``inputs``, ``scores``, ``mask``) plus ``masks`` (one per box, in order; ``mask`` is the
    first) and ``image_size`` ([H, W])."""
    encoded = [base64.b64encode(encode_png_gray8(m)).decode("ascii") for m in masks]
    result = {
        "model": model,
        "ok": True,
        "message": protocol.MESSAGE,
        "inputs": {"image_b64_len": image_b64_chars, "prompt": prompt.given},
        "scores": scores[0],  # the seed's: the score of its one mask, a number
        "mask": {"format": protocol.MASK_FORMAT, "data": encoded[0]},
        "masks": [
            {"format": protocol.MASK_FORMAT, "data": data, "score": score}
            for data, score in zip(encoded, scores, strict=True)
        ],
        "image_size": [int(image_size[0]), int(image_size[1])],
    }
    return json.dumps(result)


# Session-model inputs -> the field of this contract a client sees in an error.
_SESSION_FIELDS = {
    "image_bytes": protocol.IMAGE_B64,
    "points": f"{PROMPT}.points",
    "labels": f"{PROMPT}.points",
    "box": f"{PROMPT}.boxes",
}


def client_message(message: str, box_index: int | None = None) -> str:
    """A session model's error text (``<field>: ...``, its protocol header removed) with the
    field renamed to the one the client sent (``image_bytes`` -> ``image_b64``...)."""
    name, sep, rest = message.partition(": ")
    if not sep or name not in _SESSION_FIELDS:
        return message
    renamed = _SESSION_FIELDS[name]
    if name == "box" and box_index is not None:
        renamed = f"{renamed}[{box_index}]"
    return f"{renamed}: {rest}"
