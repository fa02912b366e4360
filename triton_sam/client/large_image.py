"""A large image held by the server's ``<family>_large`` model, from the client's side.

The contract is :mod:`triton_sam.serving.protocol.large`: one BYTES JSON ``request`` in, one
JSON ``answer`` out, over the client's own :class:`~triton_sam.client.transport.Transport`
(its tenant headers, TLS and error translation). :class:`LargeModel` is that call;
:class:`LargeImage` is one handle the server issued (``open`` a dataset under its data roots,
or ``create`` + ``put`` an array the client holds: :mod:`triton_sam.client.large_transfer`).

Each handle's requests carry one random routing key (not the handle: a bearer capability must
not reach a proxy's logs), so behind a proxy they all reach the replica that holds the image.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.client import large_clicks, large_transfer, large_views
from triton_sam.client.closing import ClosesOnExit
from triton_sam.client.prompts import validate_box, validate_points
from triton_sam.client.retry import Backoff, RetryPolicy
from triton_sam.client.sparse_mask import SparseMask
from triton_sam.client.transport import Transport
from triton_sam.errors import (
    HandleNotFoundError,
    InputValidationError,
    ServerError,
    ServerOverloadedError,
    ServerUnavailableError,
)
from triton_sam.serving.large import planning
from triton_sam.serving.protocol import large as protocol

# Opens and embeds go through the server's admission: while another user's precompute runs,
# the answer is Overloaded, and waiting a little is the right reply (a precompute of hundreds
# of tiles should not die of one busy second). Two minutes, then the error is the user's.
LARGE_RETRY = RetryPolicy(max_attempts=10, initial_backoff_s=0.25, max_backoff_s=8.0,
                          deadline_s=120.0)  # fmt: skip
# Ops that change nothing when run twice; ``open``/``create`` issue a handle each time, so
# they are retried only after Overloaded (the server refused them before doing anything).
_IDEMPOTENT_OPS = frozenset({"put", "predict", "embed", "status", "read", "close"})


class LargeModel:
    """The ``<family>_large`` model over a transport: a JSON request in, a JSON answer out.

    Args:
        transport: the client's transport (anything with ``infer`` and ``reconnect``).
        model: the Triton model name (:func:`triton_sam.serving.protocol.large.model_name`).
        routing_key: this image's replica-affinity key (random by default).
        retry: how Overloaded (and, for idempotent ops, unreachable) answers are retried.
        family: ``"sam1"`` / ``"sam2"`` (the everything parameters a tiled job checks).
        session_model: the session model beside it (clicks on held tiles go there directly:
            :mod:`~triton_sam.client.large_clicks`); default ``<family>_session``.
    """

    def __init__(
        self,
        transport: Transport,
        model: str,
        *,
        routing_key: str | None = None,
        retry: RetryPolicy = LARGE_RETRY,
        family: str = "sam2",
        session_model: str | None = None,
    ) -> None:
        self.transport, self.model, self.retry = transport, model, retry
        self.family = family
        self.session_model = session_model or f"{model.removesuffix('_large')}_session"
        self.routing_key = routing_key or secrets.token_hex(8)
        self.sleep: Callable[[float], Any] = time.sleep  # a test's recorder replaces it

    def call(self, body: dict[str, Any], pixels: np.ndarray | None = None) -> dict[str, Any]:
        """Send one request (its ``op`` and fields) and return the answer's JSON object.

        Raises:
            HandleNotFoundError, InvalidRequestError (naming ``request.<field>``),
            ServerOverloadedError (after the retries), ServerError: the server's answer.
        """
        return self.call_for(body, pixels)[0]

    def call_for(
        self, body: dict[str, Any], pixels: np.ndarray | None = None, outputs: tuple = ()
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """:meth:`call`, asking for the tensor ``outputs`` too (a ``read``'s ``rgb``):
        ``(answer, {name: array})``."""
        backoff = Backoff(self.retry)
        idempotent = body.get("op") in _IDEMPOTENT_OPS
        while True:
            try:
                return self._once(body, pixels, outputs)
            except ServerUnavailableError as e:
                retryable = idempotent or isinstance(e, ServerOverloadedError)
                wait = backoff.after(e) if retryable else None
                if wait is None:
                    raise
            self.sleep(wait)
            if backoff.reconnect:
                with contextlib.suppress(Exception):  # the next attempt says what is wrong
                    self.transport.reconnect()

    def _once(self, body, pixels, outputs):
        text = json.dumps(body, separators=(",", ":")).encode("utf-8")
        inputs = {protocol.REQUEST: np.array([text], dtype=np.object_)}
        if pixels is not None:  # a Triton input has one datatype: one input per dtype
            inputs[protocol.PIXEL_INPUTS[pixels.dtype.name]] = pixels
        out = self.transport.infer(
            self.model, inputs, (protocol.ANSWER, *outputs), routing_key=self.routing_key
        )
        raw = out[protocol.ANSWER].reshape(-1)[0]
        try:
            answer = json.loads(bytes(raw) if not isinstance(raw, str) else raw)
        except (TypeError, ValueError) as e:
            raise ServerError(f"{self.model}: its answer is not JSON ({e})") from e
        if not isinstance(answer, dict):
            raise ServerError(f"{self.model}: its answer is not a JSON object")
        return answer, {name: out[name] for name in outputs}


@dataclass(frozen=True)
class PredictAnswer:
    """What a :meth:`LargeImage.predict` answered besides its masks.

    Attributes:
        image_size: (rows, cols) of the image (a volume's slice).
        tiles: ids of the tiles (``mode == "tile"``) or windows the masks came from.
        embedded: encoder runs the click caused (0 once its tile is held).
        mode: the rule that answered, ``"tile"`` or ``"window"``.
    """

    image_size: tuple[int, int]
    tiles: tuple[int, ...]
    embedded: int
    mode: str


class LargeImage(ClosesOnExit):
    """A large image the server holds under a handle: click it, precompute it, close it.

    Made by :meth:`SAM2TritonClient.open_dataset <triton_sam.SAM2TritonClient.open_dataset>`
    or :meth:`~triton_sam.SAM2TritonClient.open_array`; a context manager whose exit sends
    ``close`` (an uploaded image's pixels are deleted on the server). Coordinates are pixels
    of the full-resolution image: prompts (X, Y) as SAM's, regions and offsets (row, col).

    Attributes:
        handle: the server-issued capability (keep it secret: it is the image).
        shape, dtype, axes: the image as the server opened it (``axes`` "yx", "yxc", "zyx"
            or "zyxc": z first for volumes, channels last).
        tile, halo, window: (rows, cols) of a tile's core, its context, a window.
        grid: (tile rows, tile cols) of each slice.
        mapping: intensities to SAM's RGB, as the server resolved it (percentiles as min/max).
        last_answer: what the last :meth:`predict` answered besides masks, or None.
    """

    def __init__(self, model: LargeModel, answer: dict[str, Any]) -> None:
        self._model = model
        self._closed = False
        self.last_answer: PredictAnswer | None = None
        self.held = large_clicks.HeldTiles()  # the server's ids of tiles it said it holds
        self._update(answer)

    def _update(self, answer: dict[str, Any]) -> None:
        missing = [f for f in protocol.IMAGE_FIELDS if f not in answer]
        if missing:
            raise ServerError(f"{self._model.model}: its image answer lacks {missing}")
        self.handle = str(answer["handle"])
        self.shape = tuple(int(v) for v in answer["shape"])
        self.dtype = str(answer["dtype"])
        self.axes = str(answer["axes"])
        self.tile = tuple(int(v) for v in answer["tile"])
        self.halo = tuple(int(v) for v in answer["halo"])
        self.grid = tuple(int(v) for v in answer["grid"])
        self.window = tuple(int(v) for v in answer["window"])
        self.mapping = dict(answer["mapping"] or {})
        self.complete = bool(answer["complete"])

    def __repr__(self) -> str:
        return f"LargeImage(shape={self.shape}, axes={self.axes!r}, tile={self.tile})"

    @property
    def image_size(self) -> tuple[int, int]:
        """(rows, cols) of the image, or of each slice of a volume."""
        start = 1 if self.axes.startswith("z") else 0
        return (self.shape[start], self.shape[start + 1])

    @property
    def depth(self) -> int | None:
        """Slices of a volume; None for a 2-D image."""
        return self.shape[0] if self.axes.startswith("z") else None

    @property
    def model(self) -> LargeModel:
        """The model this handle lives in (its transport and routing key)."""
        return self._model

    def request(self, op: str, pixels: np.ndarray | None = None, **fields: Any) -> dict:
        """One ``op`` on this handle (None fields left out), answered as JSON.

        Raises:
            HandleNotFoundError: the handle is closed here, or the server lost it.
        """
        if self._closed:
            raise HandleNotFoundError(f"{op}: this image was closed; open it again")
        body = {"op": op, "handle": self.handle}
        body.update({k: v for k, v in fields.items() if v is not None})
        return self._model.call(body, pixels)

    def check_z(self, z: int | None) -> int | None:
        """``z`` checked against the image: a slice index for a volume, None otherwise.

        Raises:
            InputValidationError: (field ``z``) missing for a volume, given for a 2-D image,
                or outside the volume.
        """
        depth = self.depth
        if depth is None:
            if z is not None:
                raise InputValidationError("z", f"got {z!r} for a 2-D image, expected None")
            return None
        if z is None or not isinstance(z, (int, np.integer)) or not 0 <= z < depth:
            raise InputValidationError(
                "z", f"got {z!r}, expected a slice index 0..{depth - 1} of this volume"
            )
        return int(z)

    def predict(
        self,
        point_coords: Any = None,
        point_labels: Any = None,
        box: Any = None,
        multimask_output: bool = False,
        mode: str = "auto",
        z: int | None = None,
    ) -> list[SparseMask]:
        """Masks for prompts in full-image pixels, as SamPredictor's ``predict`` takes them.

        The first click on a tile embeds it (and its halo) on the server; later clicks on it
        run the decoder alone. What the server answered besides the masks (the tiles used,
        encoder runs, the mode) is kept as :attr:`last_answer`.

        Args:
            point_coords: Nx2 clicks as (X, Y) pixels of the full image.
            point_labels: N labels, 1 = foreground, 0 = background.
            box: [x0, y0, x1, y1] in full-image pixels.
            multimask_output: three candidates, best first, instead of one.
            mode: ``"auto"`` (a tile; a window centred on the prompts when the tile's mask is
                cut at its edge), ``"tile"`` (micro-sam's rule) or ``"window"``.
            z: the slice of a volume (required for volumes, None for 2-D images).

        Returns:
            The masks as :class:`~triton_sam.client.sparse_mask.SparseMask` (crop + offset).

        Raises:
            InputValidationError: a prompt, ``mode`` or ``z`` (named) is wrong, before sending.
            HandleNotFoundError: the server no longer holds the image: open it again.
            InvalidRequestError: the server refused a field (named ``request.<field>``).
        """
        rows, cols = self.image_size
        points = validate_points(point_coords, point_labels, (rows, cols))
        box_xyxy = validate_box(box, (rows, cols))
        if points is None and box_xyxy is None:
            raise InputValidationError("point_coords", "give points (with labels) or a box")
        if mode not in protocol.MODES:
            raise InputValidationError("mode", f"got {mode!r}, expected one of {protocol.MODES}")
        fields: dict[str, Any] = {"z": self.check_z(z), "mode": mode}
        fields["multimask_output"] = bool(multimask_output)
        if points is not None:
            fields["points"] = points[0].tolist()
            fields["labels"] = [int(v) for v in points[1]]
        if box_xyxy is not None:
            fields["box"] = box_xyxy.tolist()
        answer = self._held_tile_answer(fields)
        if answer is None:
            answer = self.request("predict", **fields)
            large_clicks.remember_answer(self.held, fields["z"], answer)
        size = answer.get("image_size") or self.image_size
        self.last_answer = PredictAnswer(
            image_size=(int(size[0]), int(size[1])),
            tiles=tuple(int(t) for t in answer.get("tiles", ())),
            embedded=int(answer.get("embedded", 0)),
            mode=str(answer.get("mode", "")),
        )
        return [SparseMask.from_json(m) for m in answer.get("masks", ())]

    def _held_tile_answer(self, fields: dict[str, Any]) -> dict[str, Any] | None:
        """The answer of a click on a tile the server holds, from the session model alone
        (None: the large model answers); fields as the ``predict`` request has them."""
        if fields["mode"] == "window" or self._closed:
            return None
        points, box = fields.get("points"), fields.get("box")
        prompt = planning.Prompt(
            None if points is None else np.asarray(points, np.float64),
            None if points is None else np.asarray(fields["labels"], np.int32),
            None if box is None else np.asarray(box, np.float64),
        )
        return large_clicks.click_on_held_tile(
            self, self.held, prompt, fields["z"], fields["multimask_output"], fields["mode"]
        )

    def held_tiles(self, z: int | None = None) -> set[int]:
        """Ids of the tiles (of slice ``z``) whose features the server holds now."""
        answer = self.request("status", z=self.check_z(z))
        self._update(answer)
        return {int(t) for t in answer.get("held", ())}

    def precompute(
        self,
        region: tuple[int, int, int, int] | None = None,
        z: int | None = None,
        progress: bool = True,
        *,
        batch: int = protocol.DEFAULT_MAX_TILES_PER_REQUEST,
        cancel: threading.Event | None = None,
    ) -> large_transfer.PrecomputeResult:
        """Embed every tile touching ``region`` now, so later clicks there cost a decoder run.

        Resumes: asks the server which tiles it holds first and sends only the others, in
        batches of ``batch`` tiles (at most the server's ``max_tiles_per_request``).
        Stops between batches when ``cancel`` is set. On Ctrl-C the KeyboardInterrupt goes
        on up; either way the tiles of every finished batch stay held (within the session
        cache's bounds), a batch in flight may finish on the server, and calling
        ``precompute`` again resumes.

        Args:
            region: (row0, col0, row1, col1) full-image pixels, ends exclusive; None: all.
            z: the slice of a volume (required for volumes).
            progress: show a tqdm progress bar (tiles).
            batch: tiles per ``embed`` request.
            cancel: set it (from another thread) to stop before the next batch.

        Returns:
            A :class:`~triton_sam.client.large_transfer.PrecomputeResult`.
        """
        return large_transfer.precompute(
            self, region, self.check_z(z), progress=progress, batch=batch, cancel=cancel
        )

    def read(self, block, z=None, *, step: int = 1, level: int = 0) -> np.ndarray:
        """The pixels of ``block`` (row0, col0, row1, col1; full-image pixels) as SAM sees
        them (the mapping applied), uint8 [h, w, 3]: every ``step``-th pixel, or from a
        pyramid ``level`` of the source (:func:`~triton_sam.client.large_views.read`)."""
        return large_views.read(self, block, self.check_z(z), step=step, level=level)

    def segment_everything(self, **options: Any):
        """Every instance of the image (of slice ``z``), one everything job per tile, objects
        across tiles joined: :func:`~triton_sam.client.everything_tiled.segment_large`."""
        from triton_sam.client.everything_tiled import segment_large

        return segment_large(self, **options)

    def close(self) -> None:
        """Forget the image on the server (idempotent; a handle the server already lost is
        not an error here)."""
        if self._closed:
            return
        with contextlib.suppress(HandleNotFoundError):
            self.request("close")
        self._closed = True
