"""What the ``sam3_concept_video`` service reads from a command's tensors: phrases, exemplar
boxes on a frame of the session, scalars. Refusals name the field (``TrackingError`` with the
protocol's codes, or ``RequestError`` for exemplar boxes, checked as the ``sam3_concept``
model checks them).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..concept_exemplars import checked_boxes, normalised_cxcywh
from ..protocol import concept_video as p
from ..protocol.tracker import TrackingError
from ..tracking.state import Session
from .prompts import Exemplar

Tensors = Mapping[str, np.ndarray]
# A prompt's identity: its phrase alone, or (phrase, frame, boxes, labels) with an exemplar.
PromptKey = str | tuple[str, int, bytes, bytes]


def read_exemplar(session: Session, inputs: Tensors) -> Exemplar | None:
    """An ``add_prompt``'s exemplar boxes, checked against the frame of ``session`` they are
    drawn on (``frame_index``, default 0, uploaded), normalised as ``Sam3Processor`` does;
    None without boxes.

    Raises:
        TrackingError: ``frame_index`` out of range (``FrameOutOfRange``) or not uploaded
            (``FrameMissing``), or sent without boxes.
        RequestError: a bad box or label (as the ``sam3_concept`` model refuses them).
    """
    boxes, labels = inputs.get(p.EXEMPLAR_BOXES), inputs.get(p.EXEMPLAR_LABELS)
    if boxes is None and labels is None:
        if p.FRAME_INDEX in inputs:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                f"frame_index: sent without {p.EXEMPLAR_BOXES}; it names the frame the "
                "boxes are drawn on",
                p.FRAME_INDEX,
            )
        return None
    frame = read_int(inputs, p.FRAME_INDEX, 0)
    if not 0 <= frame < session.num_frames:
        raise TrackingError(
            p.ERR_FRAME_OUT_OF_RANGE,
            f"frame_index: got {frame}, the video has {session.num_frames} frames",
            p.FRAME_INDEX,
        )
    if frame not in session.frames:
        raise TrackingError(
            p.ERR_FRAME_MISSING,
            f"frame_index: frame {frame} not uploaded; send it with add_frame before "
            "drawing boxes on it",
            p.FRAME_INDEX,
        )
    checked = checked_boxes(boxes, labels, session.video_hw, p.MAX_BOXES)
    assert checked is not None  # boxes or labels were sent: checked_boxes refuses labels alone
    found, box_labels = checked
    return Exemplar(frame, normalised_cxcywh(found, session.video_hw), box_labels)


def exemplar_key(phrase: str, exemplar: Exemplar) -> PromptKey:
    """The same phrase with the same boxes on the same frame is the same prompt."""
    boxes = np.ascontiguousarray(exemplar.boxes, np.float32).tobytes()
    labels = np.ascontiguousarray(exemplar.labels, np.int64).tobytes()
    return (phrase, exemplar.frame_idx, boxes, labels)


def read_phrases(inputs: Tensors) -> list[str]:
    if p.TEXT not in inputs:
        raise TrackingError(
            p.ERR_INVALID_INPUT,
            "text: required by add_prompt unless exemplar_boxes are sent",
            p.TEXT,
        )
    values = np.asarray(inputs[p.TEXT]).reshape(-1)
    if not 1 <= values.size <= p.MAX_PROMPTS:
        raise TrackingError(
            p.ERR_INVALID_INPUT,
            f"text: got {values.size} phrases, expected 1 to {p.MAX_PROMPTS}",
            p.TEXT,
        )
    phrases = []
    for i, value in enumerate(values):
        blob = value if isinstance(value, bytes) else str(value).encode()
        name = f"{p.TEXT}[{i}]"
        if not 0 < len(blob) <= p.MAX_PHRASE_BYTES:
            raise TrackingError(
                p.ERR_INVALID_INPUT,
                f"{name}: got {len(blob)} bytes, expected 1 to {p.MAX_PHRASE_BYTES}",
                name,
            )
        try:
            phrases.append(blob.decode("utf-8").strip())
        except UnicodeDecodeError as e:
            raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: not UTF-8 text", name) from e
        if not phrases[-1]:
            raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: blank phrase", name)
    return phrases


def optional_bytes(inputs: Tensors, name: str) -> bytes | None:
    if name not in inputs:
        return None
    values = np.asarray(inputs[name]).reshape(-1)
    if values.size != 1:
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: expected one item", name)
    value = values[0]
    return value if isinstance(value, bytes) else str(value).encode()


def read_text(inputs: Tensors, name: str) -> str:
    value = optional_bytes(inputs, name)
    if value is None:
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: required", name)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: not UTF-8 text", name) from e


def read_int(inputs: Tensors, name: str, default: int) -> int:
    if name not in inputs:
        return default
    values = np.asarray(inputs[name]).reshape(-1)
    if values.size != 1 or not np.issubdtype(values.dtype, np.integer):
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: expected one integer", name)
    return int(values[0])


def read_flag(inputs: Tensors, name: str) -> bool:
    if name not in inputs:
        return False
    values = np.asarray(inputs[name]).reshape(-1)
    if values.size != 1:
        raise TrackingError(p.ERR_INVALID_INPUT, f"{name}: expected one boolean", name)
    return bool(values[0])
