"""A click on a tile the server already holds goes straight to the session model.

A large image's click normally goes to ``<family>_large``, which picks the tile, frames the
prompt, calls ``<family>_session`` over BLS and cuts the mask to its crop. Once the server
has said which image id holds a tile (every ``predict`` answer names the block it answered
on and that block's ``image_id``), a later click on that tile needs none of the large model:
this module picks the tile by the same rule, frames the prompt and cuts the crop with the
same functions the large model runs (``serving/large/planning.py`` and ``crop.py``), and sends
the session model the id and the framed prompt. That saves a hop through a second python
model on every click (measured in docs/large-images.md), and the answer is the large
model's to the bit.

Nothing is trusted that the server did not issue: the id is the session model's own,
bound to the tenant that embedded it, and sent with the image's routing key (the replica
that holds it). The large model answers instead when the tile is not known to be held, when
the session model no longer holds it (evicted, restarted: forgotten here, and the large
model embeds it again), and in ``auto`` mode when the tile's best mask is cut at its edge
(the large model moves to a window).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from triton_sam.errors import EmbeddingNotFoundError
from triton_sam.serving.bounds import RequestError
from triton_sam.serving.large import crop, planning
from triton_sam.serving.protocol import embedding_cache as session
from triton_sam.serving.tiles import Block, TileGrid

MAX_HELD = 1024  # ids remembered per image (a few dozen bytes each)


class HeldTiles:
    """The session model's image ids of the tiles the server said it embedded, by (z, block),
    least recently used first out past :data:`MAX_HELD`."""

    def __init__(self) -> None:
        self._ids: OrderedDict[tuple, str] = OrderedDict()

    def remember(self, z: int | None, block: Block, image_id: str) -> None:
        key = (z, block)
        self._ids[key] = image_id
        self._ids.move_to_end(key)
        while len(self._ids) > MAX_HELD:
            self._ids.popitem(last=False)

    def get(self, z: int | None, block: Block) -> str | None:
        return self._ids.get((z, block))

    def forget(self, z: int | None, block: Block) -> None:
        self._ids.pop((z, block), None)


def remember_answer(held: HeldTiles, z: int | None, answer: dict[str, Any]) -> None:
    """Keep the id of the tile a large-model ``predict`` answered on (windows are not tiles:
    the next click picks a tile, so only tiles are worth remembering)."""
    image_id, block = answer.get("image_id"), answer.get("block")
    if answer.get("mode") == "tile" and isinstance(image_id, str) and block and len(block) == 4:
        held.remember(z, Block(tuple(block[:2]), tuple(block[2:])), image_id)


def click_on_held_tile(image, held: HeldTiles, prompt: planning.Prompt, z, multimask: bool,
                       mode: str) -> dict[str, Any] | None:  # fmt: skip
    """The large model's ``predict`` answer for ``prompt``, from one session-model call, or
    None when the large model must answer (see the module doc)."""
    grid = TileGrid(image.image_size, image.tile, image.halo)
    tile_id, block = planning.tile_block(grid, prompt)
    image_id = held.get(z, block)
    if image_id is None:
        return None
    try:
        framed = planning.frame(prompt, block)
    except RequestError:  # nothing of it in the tile: the large model says so, naming the field
        return None
    try:
        found = _session_masks(image.model, image_id, framed, multimask)
    except EmbeddingNotFoundError:
        held.forget(z, block)
        return None
    shape = grid.shape
    answers = crop.block_answers(found, block, shape)
    if mode == "auto" and answers and answers[0]["cut"]:
        return None
    return {
        "image_size": list(shape),
        "masks": answers,
        "tiles": [tile_id],
        "embedded": 0,
        "mode": "tile",
        "block": [*block.begin, *block.end],
        "dropped": framed.dropped,
        "image_id": image_id,
    }


def _session_masks(model, image_id: str, framed: planning.Framed, multimask: bool):
    """[(RLE counts of the block-size mask, score), ...] from ``<family>_session``: the
    same call the large model makes over BLS (``serving/large/bls.py``)."""
    out = model.transport.infer(
        model.session_model,
        planning.session_inputs(image_id, framed, multimask),
        (session.MASKS_RLE, session.MASK_SCORES),
        routing_key=model.routing_key,
    )
    counts = out[session.MASKS_RLE].reshape(-1)
    scores = out[session.MASK_SCORES].reshape(-1)
    return [(bytes(c), float(s)) for c, s in zip(counts, scores, strict=True)]
