"""Which pixels a prompt is answered on, and the prompt in that block's frame.

- ``tile`` (micro-sam's rule, :meth:`~..tiles.TileGrid.tile_of`): the tile under the
  prompts' centre, embedded with its halo; points outside that outer block are dropped (and
  counted), a box is cut to it.
- ``window`` (:func:`~..tiles.window_around`): ``window`` pixels a side centred on the
  prompts, embedded as an image of its own.
- ``auto``: the tile, then, when its best mask is :func:`cut` (touches the block's edge
  where the image goes on), a window centred on the prompts and that mask; at most
  :data:`MAX_WINDOWS` windows, each centred on the prompts and the last mask, and none twice.

Prompts arrive as the wire has them (x, y full-image pixels); the grid works in (row, col).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bounds import RequestError
from ..protocol import embedding_cache as session
from ..tiles import Block, TileGrid, window_around

MAX_WINDOWS = 2


@dataclass(frozen=True)
class Prompt:
    """A prediction's prompts in full-image pixels: points float64 [N, 2] (x, y) with labels
    int32 [N] (or both None), box float64 [4] (x0, y0, x1, y1, or None)."""

    points: np.ndarray | None
    labels: np.ndarray | None
    box: np.ndarray | None

    def rc(self) -> np.ndarray:
        """The (row, col) points that place a tile or a window: the points, and a box's two
        corners (micro-sam centres a box's tile on the box)."""
        parts = [] if self.points is None else [self.points[:, ::-1]]
        if self.box is not None:
            parts.append(self.box.reshape(2, 2)[:, ::-1])
        return np.concatenate(parts).astype(np.float64)

    def check_inside(self, shape: tuple[int, int]) -> None:
        """Points inside the image, a box overlapping it.

        Raises:
            RequestError: (``request.points`` / ``request.box``) outside the image.
        """
        rows, cols = shape
        if self.points is not None:
            x, y = self.points[:, 0], self.points[:, 1]
            if not ((x >= 0) & (x < cols) & (y >= 0) & (y < rows)).all():
                raise RequestError(
                    "request.points", f"a point is outside the image ({cols} x {rows} pixels)"
                )
        if self.box is not None:
            x0, y0, x1, y1 = self.box
            if x1 < 0 or y1 < 0 or x0 >= cols or y0 >= rows:
                raise RequestError(
                    "request.box", f"the box is outside the image ({cols} x {rows} pixels)"
                )


@dataclass(frozen=True)
class Framed:
    """A prompt in a block's frame: what the session model is sent, and what was dropped."""

    points: np.ndarray | None  # float32 [N, 2] (x, y)
    labels: np.ndarray | None  # int32 [N]
    box: np.ndarray | None  # float32 [4]
    dropped: int  # points outside the block


def session_inputs(image_id: str, framed: Framed, multimask: bool) -> dict[str, np.ndarray]:
    """The session model's inputs for a framed prompt on the image ``image_id``, by name:
    what the large model sends over BLS and a client sends for a held tile."""
    inputs = {session.IMAGE_ID: np.array([[image_id.encode()]], dtype=np.object_)}
    if framed.points is not None:
        inputs[session.POINTS] = framed.points[None].astype(np.float32)
        inputs[session.LABELS] = framed.labels[None].astype(np.int32)
    if framed.box is not None:
        inputs[session.BOX] = framed.box[None].astype(np.float32)
    inputs[session.MULTIMASK] = np.array([[int(multimask)]], np.int32)
    return inputs


def tile_block(grid: TileGrid, prompt: Prompt) -> tuple[int, Block]:
    """micro-sam's tile for the prompt: (tile id, its outer block)."""
    tile_id, _ = grid.tile_of(prompt.rc())
    return tile_id, grid.outer(tile_id)


def window_block(
    prompt: Prompt, shape: tuple[int, int], window: tuple[int, int], mask_box=None
) -> Block:
    """A window centred on the prompts (and on ``mask_box``, [x0, y0, x1, y1] full-image
    pixels inclusive, when given)."""
    rc = prompt.rc()
    if mask_box is not None:
        x0, y0, x1, y1 = mask_box
        rc = np.concatenate([rc, [[y0, x0], [y1 + 1, x1 + 1]]])
    return window_around(rc, shape, window)


def frame(prompt: Prompt, block: Block) -> Framed:
    """The prompt translated into ``block`` (its top-left pixel at 0, 0): points outside it
    dropped, the box cut to it (dropped when nothing of it is left).

    Raises:
        RequestError: (``request.points``) nothing of the prompt lies in the block.
    """
    (r0, c0), (r1, c1) = block.begin, block.end
    points = labels = box = None
    dropped = 0
    if prompt.points is not None:
        inside = block.contains(prompt.points[:, ::-1])
        dropped = int((~inside).sum())
        if inside.any():
            points = (prompt.points[inside] - [c0, r0]).astype(np.float32)
            labels = prompt.labels[inside].astype(np.int32)
    if prompt.box is not None:
        x0, y0, x1, y1 = prompt.box
        cut = np.array([max(x0, c0), max(y0, r0), min(x1, c1 - 1), min(y1, r1 - 1)])
        if cut[0] <= cut[2] and cut[1] <= cut[3]:
            box = (cut - [c0, r0, c0, r0]).astype(np.float32)
    if points is None and box is None:
        raise RequestError(
            "request.points",
            f"no prompt lies in the block {list(block.begin)}-{list(block.end)} it chose; "
            "prompts far apart need mode 'window'",
        )
    return Framed(points, labels, box, dropped)


def cut(box: np.ndarray, block: Block, shape: tuple[int, int]) -> bool:
    """Whether a mask's ``box`` ([x0, y0, x1, y1] inclusive, in the block's frame) touches an
    edge of ``block`` beyond which the image goes on (an empty mask is never cut)."""
    x0, y0, x1, y1 = (int(v) for v in box)
    (r0, c0), (r1, c1) = block.begin, block.end
    return (
        (y0 == 0 and r0 > 0)
        or (x0 == 0 and c0 > 0)
        or (y1 == r1 - r0 - 1 and r1 < shape[0])
        or (x1 == c1 - c0 - 1 and c1 < shape[1])
    )
