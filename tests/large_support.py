"""The large model's stand-in for the client tests: a transport that speaks the contract
(``triton_sam/serving/protocol/large.py``) from memory and records every request."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam import HandleNotFoundError, SAM2TritonClient
from triton_sam.client.image_session import ImageSession
from triton_sam.serving import masks
from triton_sam.serving.protocol import large as protocol

HANDLE = "0123456789abcdef0123456789abcdef"


@dataclass
class Call:
    model: str
    body: dict[str, Any]
    pixels: np.ndarray | None
    routing_key: str | None


class FakeLargeServer:
    """A stand-in transport: the ``<family>_large`` model's contract, in memory.

    Args:
        shape: the dataset ``open`` answers, or what ``create`` was asked.
        tile, halo: (rows, cols) it answers.
        held: tile ids it holds already.
    """

    def __init__(self, shape=(10, 7), tile=(4, 4), halo=(1, 1), held=()):
        self.shape, self.tile, self.halo = tuple(shape), tuple(tile), tuple(halo)
        self.held = set(held)
        self.calls: list[Call] = []
        self.fail: list[Exception] = []  # raised by the next calls, in order
        self.on_embed = None  # called after each embed (a test sets cancel there)
        self.closed = False
        self.canvas = self.writes = None
        self.masks = [wire_mask()]

    # -- the transport's surface ---------------------------------------------------------
    def infer(self, model, inputs, outputs, *, idempotent=False, routing_key=None):
        assert tuple(outputs) in (("answer",), ("answer", "rgb"))
        request = inputs["request"]
        assert request.dtype == np.object_ and request.shape == (1,)
        body = json.loads(request[0].decode("utf-8"))
        given = [inputs[n] for n in protocol.PIXEL_INPUTS.values() if n in inputs]
        assert len(given) <= 1
        pixels = given[0] if given else None
        if pixels is not None:  # in the input of its dtype, [rows, cols, channels]
            assert protocol.PIXEL_INPUTS[pixels.dtype.name] in inputs and pixels.ndim == 3
        self.calls.append(Call(model, body, None if pixels is None else pixels.copy(), routing_key))
        if self.fail:
            raise self.fail.pop(0)
        if body["op"] not in ("open", "create") and (body["handle"] != HANDLE or self.closed):
            raise HandleNotFoundError("triton_sam.HandleNotFound: request.handle: unknown")
        answer = getattr(self, "op_" + body["op"])(body, pixels)
        answer, extra = answer if isinstance(answer, tuple) else (answer, {})
        return {"answer": np.array([json.dumps(answer).encode()], dtype=np.object_), **extra}

    def reconnect(self):
        pass

    def close(self):  # the client's close() closes its transport
        pass

    # -- the ops -------------------------------------------------------------------------
    def image(self, dtype="uint8", complete=True):
        volume = len(self.shape) == 4 or (len(self.shape) == 3 and self.shape[-1] not in (1, 3))
        rows, cols = self.shape[1:3] if volume else self.shape[:2]
        channels = len(self.shape) == (4 if volume else 3)
        return {
            "handle": HANDLE,
            "shape": list(self.shape),
            "dtype": dtype,
            "axes": ("zyx" if volume else "yx") + ("c" if channels else ""),
            "tile": list(self.tile),
            "halo": list(self.halo),
            "grid": [math.ceil(rows / self.tile[0]), math.ceil(cols / self.tile[1])],
            "window": [16, 16],
            "mapping": {"kind": "none"},
            "complete": complete,
        }

    def op_open(self, body, pixels):
        return self.image()

    def op_create(self, body, pixels):
        self.shape = tuple(body["shape"])
        self.canvas = np.zeros(self.shape, body["dtype"])
        self.writes = np.zeros(self.shape, int)
        return self.image(body["dtype"], complete=False)

    def op_put(self, body, pixels):
        assert pixels.dtype == self.canvas.dtype and pixels.flags.c_contiguous
        begin = body["offset"][-2:]
        where = tuple(slice(o, o + n) for o, n in zip(begin, pixels.shape[:2], strict=True))
        where = (body["offset"][0], *where) if len(body["offset"]) == 3 else where
        self.canvas[where] = pixels.reshape(self.canvas[where].shape)  # grey: [h, w, 1]
        self.writes[where] += 1
        return {"received": int((self.writes > 0).sum()), "complete": bool(self.writes.all())}

    def op_predict(self, body, pixels):
        return {
            "image_size": list(self.shape[:2]),
            "masks": self.masks,
            "tiles": [3],
            "embedded": 1,
            "mode": "window",
        }

    def op_embed(self, body, pixels):
        ids = body["tiles"]
        answer = {"embedded": [t for t in ids if t not in self.held]}
        answer["held"] = [t for t in ids if t in self.held]
        self.held.update(ids)
        if self.on_embed is not None:
            self.on_embed()
        return answer

    def op_status(self, body, pixels):
        return {**self.image(), "held": sorted(self.held)}

    def op_read(self, body, pixels):
        """The block's pixels: row + col (mod 256) of the full image, every ``step``-th."""
        r0, c0, r1, c1 = body["block"]
        step = body.get("step", 1)
        rows, cols = np.mgrid[r0:r1:step, c0:c1:step]
        grey = ((rows + cols + body.get("z", 0)) % 256).astype(np.uint8)
        rgb = np.repeat(grey[..., None], 3, axis=2)
        return {"size": list(rgb.shape[:2])}, {"rgb": rgb}

    def op_close(self, body, pixels):
        self.closed = True
        return {}

    def ops(self):
        return [c.body["op"] for c in self.calls]


def wire_mask():
    crop = np.array([[1, 0], [1, 1]], bool)
    return {
        "offset": [5, 2],
        "size": [2, 2],
        "counts": masks.encode_rle(crop).decode(),
        "box": [2, 5, 3, 6],
        "score": 0.75,
        "area": 3,
        "cut": False,
    }


def client_over(server: FakeLargeServer, model_type: str = "sam2") -> SAM2TritonClient:
    """A client over the stand-in (no server behind it: nothing else is called)."""
    client = SAM2TritonClient.__new__(SAM2TritonClient)
    client._core = ImageSession(model_type)
    client._transport = server
    return client
