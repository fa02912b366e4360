"""Bounds on what one request may ask of the image models, and their checks (numpy only).

The single definition of the limits: the ``<family>_session`` model enforces them on the
server (the writer ships this file beside its ``model.py``), and the clients check the same
numbers before sending, so a user of our client sees the error without a round trip while a
raw HTTP/gRPC client that skips the checks is refused by the server all the same.

Why these numbers:

- ``MAX_POINTS`` = 64 prompt points per request, box corners included. SAM's decoder attends
  over every prompt token: 4,096 points took 1.35 s and 20,000 points grew the decoder past
  23 GB until the OOM killer ended it (before this bound). Interactive tools send a handful
  of clicks; 64 leaves room for scripted prompts while keeping a request's memory that of a
  few clicks.
- ``MAX_BOXES`` = 1: one prompt set per request gives one set of masks (the official
  predictors' single-image API takes one box); several boxes are several requests. Boxes
  are counted wherever they travel: ``input_boxes``, or corner pairs (labels 2 and 3) in a
  point list, which the decoder would otherwise read as several boxes of one prompt.
- one prompt set per request (:func:`check_batch`): a batch dimension above 1 is refused,
  never merged into one prompt or cut to its first item.
- ``MAX_IMAGE_PIXELS`` = 4096 x 4096: SAM works at ~1024 px, and the server holds the decoded
  image and its resized float copy (12 bytes a pixel while preprocessing).
- ``MAX_IMAGE_BYTES`` = 64 MiB of encoded image: a 4096 x 4096 RGB PNG is at most ~48 MiB.
- ``COORD_LIMIT``: coordinates (in the model's input frame, 1024 or 1008 px) beyond +-10,000
  px are garbage, not a click outside the image; NaN and infinity are refused everywhere.
- ``MAX_KEY_CHARS``: ids and logits keys are short strings, not payloads.
- ``GRAPH_MAX_POINTS`` = 256 per batch item and ``GRAPH_MAX_BATCH_POINTS`` = 1024 per batch:
  the hard ceilings the exported decoder graphs enforce themselves
  (``export.onnx_utils.bound_points``), for requests sent straight to ``<family>_decoder``,
  past the session model. Triton 2.51 checks dtype, rank, fixed dims and the batch size
  (``max_batch_size``), but cannot bound a variable dim, and on the onnxruntime backend an
  out-of-memory in the decoder ends the whole server. A decoder run's attention holds every
  point of every item at once: on SAM2.1-tiny (onnxruntime CPU) a run costs about 0.33 MiB per
  point on top of ~32 MiB per item (1 x 1024 points: 359 MiB; 4 x 1024: 1.4 GiB; 16 x 64:
  681 MiB; 4 x 256: 411 MiB). 256 points per item is 4x what the session model and the
  clients send (``MAX_POINTS``, room for a scripted prompt); 1024 per batch is a full default
  batch (16) of such 64-point requests, so the batches Triton's dynamic batcher forms from our
  clients' requests are never refused: ``RepositoryOptions`` keeps ``decoder_max_batch_size``
  x ``MAX_POINTS`` within it. A session model's ``max_points`` may not exceed
  ``GRAPH_MAX_POINTS``.

Errors are :class:`RequestError`, a ``ValueError`` whose message starts with the field name:
``<field>: got <what>, expected <what>``.
"""

from __future__ import annotations

import numpy as np

MAX_POINTS = 64
MAX_BOXES = 1
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_IMAGE_BYTES = 64 * 2**20
COORD_LIMIT = 10_000.0
MAX_KEY_CHARS = 128
GRAPH_MAX_POINTS = 256
GRAPH_MAX_BATCH_POINTS = 1024
# Point labels of the decoders: -1 padding, 0 background, 1 foreground, 2/3 box corners.
POINT_LABELS = (-1, 0, 1, 2, 3)

# Prompt tensors by layout (names as in the family specs): [..., N, 2] points, [..., N]
# labels, [..., nb, 4] boxes; anything else a float tensor that must be finite.
POINT_TENSORS = ("point_coords", "input_points")
LABEL_TENSORS = ("point_labels", "input_labels")
BOX_TENSORS = ("input_boxes",)


class RequestError(ValueError):
    """A request outside the bounds; ``field`` names the input, the message starts with it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def check_prompts(
    prompts: dict[str, np.ndarray], *, max_points: int = MAX_POINTS, max_boxes: int = MAX_BOXES
) -> None:
    """Check the prompt tensors of one request (batch dim of 1 included).

    Args:
        prompts: input name -> array as received, e.g. ``point_coords`` float32 [1, N, 2],
            ``point_labels`` float32 [1, N], ``mask_input`` float32 [1, 1, 256, 256],
            ``has_mask_input`` float32 [1, 1]; or ``input_points`` [1, 1, N, 2],
            ``input_labels`` int64 [1, 1, N], ``input_boxes`` [1, nb, 4].
        max_points: most points (box corners included); max_boxes: most boxes.

    Raises:
        RequestError: naming the first tensor out of bounds.
    """
    points = None
    for name, array in prompts.items():
        array = np.asarray(array)
        if array.ndim == 0 or array.shape[0] != 1:
            raise RequestError(
                name, f"got shape {list(array.shape)}, expected a batch of 1 (one prompt set)"
            )
        if name in POINT_TENSORS:
            points = _check_points(name, array, max_points)
        elif name in BOX_TENSORS:
            _check_boxes(name, array, max_boxes)
        elif name not in LABEL_TENSORS:
            _check_finite(name, array)
            if name == "has_mask_input" and not np.isin(array, (0, 1)).all():
                raise RequestError(name, f"got {array.reshape(-1)[:4].tolist()}, expected 0 or 1")
    for name in LABEL_TENSORS:
        if name in prompts:
            _check_labels(name, np.asarray(prompts[name]), points)
            _check_corner_boxes(name, np.asarray(prompts[name]), max_boxes)


def check_batch(field: str, shape: tuple[int, ...] | list[int]) -> None:
    """Refuse an input whose batch dimension (the first) is not 1: a request is one image and
    one prompt set, and a second set would be merged into the first or dropped."""
    if len(shape) == 0 or int(shape[0]) != 1:
        count = int(shape[0]) if len(shape) else 0
        raise RequestError(
            field,
            f"got {count} prompt sets (shape {list(shape)}), expected 1 per request; send "
            "one request per prompt set",
        )


def check_pixel_coords(field: str, pixels: np.ndarray, frame: np.ndarray) -> None:
    """Refuse prompts in original pixels whose coordinates in the model's input frame
    (``frame``, the same points converted) are beyond :data:`COORD_LIMIT`; the message names
    the pixel field the request sent."""
    if np.abs(frame).max(initial=0.0) > COORD_LIMIT:
        raise RequestError(
            field,
            f"got a value of magnitude {float(np.abs(pixels).max()):.3g} pixels, which is "
            f"{float(np.abs(frame).max()):.3g} in the model's input frame, expected at most "
            f"{COORD_LIMIT:g} there (pixels of the original image)",
        )


def check_image_size(height: int, width: int, *, max_pixels: int, field: str = "image") -> None:
    """Refuse an image of ``height`` x ``width`` above ``max_pixels`` (0 = no limit)."""
    if height < 1 or width < 1:
        raise RequestError(field, f"got {width}x{height} (W x H), expected W, H >= 1")
    if max_pixels and height * width > max_pixels:
        raise RequestError(
            field,
            f"got {width}x{height} (W x H) = {height * width} pixels, expected at most "
            f"{max_pixels}; downscale it first (SAM works at ~1024 px)",
        )


def check_key(field: str, value: str) -> str:
    """A short id or key (at most ``MAX_KEY_CHARS`` characters); returns it."""
    if len(value) > MAX_KEY_CHARS:
        raise RequestError(field, f"got {len(value)} characters, expected at most {MAX_KEY_CHARS}")
    return value


def _check_points(name: str, array: np.ndarray, max_points: int) -> int:
    if array.ndim < 3 or array.shape[-1] != 2 or any(d != 1 for d in array.shape[:-2]):
        raise RequestError(name, f"got shape {list(array.shape)}, expected [1, (1,) N, 2]")
    n = int(array.shape[-2])
    if n > max_points:
        raise RequestError(
            name,
            f"got {n} points, expected at most {max_points} (box corners and padding point "
            "included); the "
            "decoder's memory grows with every point: send fewer, or raise max_points",
        )
    _check_finite(name, array)
    return n


def _check_boxes(name: str, array: np.ndarray, max_boxes: int) -> None:
    if array.ndim != 3 or array.shape[-1] != 4:
        raise RequestError(name, f"got shape {list(array.shape)}, expected [1, nb, 4]")
    if array.shape[1] > max_boxes:
        raise RequestError(
            name, f"got {array.shape[1]} boxes, expected at most {max_boxes} per request"
        )
    _check_finite(name, array)


def _check_labels(name: str, array: np.ndarray, points: int | None) -> None:
    count = int(array.shape[-1]) if array.ndim else 0
    if points is None or count != points or any(d != 1 for d in array.shape[:-1]):
        raise RequestError(
            name, f"got shape {list(array.shape)}, expected one label per point ({points})"
        )
    if not np.isin(array, POINT_LABELS).all():
        values = sorted({float(v) for v in np.unique(array)[:8]})
        raise RequestError(name, f"got values {values}, expected some of {list(POINT_LABELS)}")


def _check_corner_boxes(name: str, labels: np.ndarray, max_boxes: int) -> None:
    """Boxes given as corner points (labels 2 = top-left, 3 = bottom-right) in a point list."""
    boxes = max(int(np.count_nonzero(labels == 2)), int(np.count_nonzero(labels == 3)))
    if boxes > max_boxes:
        raise RequestError(
            name,
            f"got {boxes} boxes (corner labels 2 and 3), expected at most {max_boxes} per "
            "request; send one request per box",
        )


def _check_finite(name: str, array: np.ndarray) -> None:
    if array.dtype.kind != "f":
        return
    if not np.isfinite(array).all():
        raise RequestError(name, "got NaN or infinity, expected finite values")
    if np.abs(array).max(initial=0.0) > COORD_LIMIT and name != "mask_input":
        raise RequestError(
            name,
            f"got a value of magnitude {float(np.abs(array).max()):.3g}, expected at "
            f"most {COORD_LIMIT:g} (pixels of the model's input frame)",
        )
