"""micro-sam 1.8.14, the tiled SAM labs use today, as the reference of the large-image tests.

How it is installed and loaded (beside the venv, ``make micro-sam``) is
:mod:`triton_sam.bench.micro_sam_ref`, which the benchmark shares.

The reference runs micro-sam's own code on OUR weights: a ``segment_anything.SamPredictor``
over the random-init model the tests export (``triton_sam.export.sam1.build_model``), with
the two attributes micro-sam's embedding signature reads (``model_type``, ``model_name``).
Its defaults, read from its source and kept here as they are:

- ``util.precompute_image_embeddings(tile_shape=, halo=)``: each tile's outer block (core
  plus halo, clipped to the image; ``bioimage_cpp.utils.Blocking``) goes through ``_to_image``
  (grey -> 3 channels, per-channel min-max stretch of THAT block to uint8: our mapping
  ``tile_minmax``), then the encoder, as ``SamPredictor.set_image`` would.
- ``prompt_based_segmentation.segment_from_points``: the tile under the rounded mean of the
  points (``_points_to_tile``), points outside its outer block dropped, (row, col) turned
  into SAM's (x, y); one positive point alone asks three masks and keeps the best score
  (``use_best_multimask``); the tile's mask is pasted into a zero full-size image.
- ``segment_from_box``: the tile under the box's rounded centre, the box clipped to its
  outer block (``_box_to_tile``), one mask.

Coordinates in this module's arguments are micro-sam's: (row, col), boxes
``[row0, col0, row1, col1]``.
"""

from __future__ import annotations

import numpy as np

from triton_sam.bench.micro_sam_ref import (  # noqa: F401  (the tests' names for them)
    MICRO_SAM_ENV,
    MICRO_SAM_VERSION,
    MODEL_TYPE,
    micro_sam,
    micro_sam_dirs,
    reference_predictor,
)


def tiled_embeddings(predictor, image: np.ndarray, tile, halo, tiles) -> dict:
    """micro-sam's tiled embeddings of ``image`` for the tile ids ``tiles`` only.

    ``precompute_image_embeddings`` embeds every tile unless given a ``mask``: then only the
    tiles whose OUTER block holds a masked pixel. A pixel at the centre of each wanted core
    is masked; the tiles embedded are checked to be exactly those asked for (a halo of half a
    tile or more would bring in neighbours). ``batch_size`` is the whole grid because with a
    mask micro-sam still cuts ``ceil(n_tiles / batch_size)`` batches, and an empty batch
    fails in its encoder call: one batch of the masked tiles it is.

    Raises:
        AssertionError: other tiles than ``tiles`` would be embedded.
    """
    ms = micro_sam()
    grid = ms.Blocking([0, 0], list(image.shape[:2]), list(tile))
    mask = np.zeros(image.shape[:2], bool)
    for tile_id in tiles:
        block = grid.get_block(int(tile_id))
        mask[tuple((b + e) // 2 for b, e in zip(block.begin, block.end, strict=True))] = True
    embeddings = ms.util.precompute_image_embeddings(
        predictor,
        image,
        tile_shape=tuple(tile),
        halo=tuple(halo),
        verbose=False,
        batch_size=grid.number_of_blocks,
        mask=mask,
    )
    held = [int(t) for t in embeddings["features"].attrs["tiles_in_mask"]]
    assert held == sorted(int(t) for t in tiles), (held, tiles)
    return embeddings


def segment_from_points(predictor, embeddings, points_rc, labels) -> tuple[np.ndarray, float]:
    """micro-sam's tiled ``segment_from_points`` with its defaults: the full-image bool mask
    and the score of that mask (the best of three for a single positive point)."""
    masks, scores, _ = micro_sam().prompts.segment_from_points(
        predictor,
        np.asarray(points_rc),
        np.asarray(labels),
        image_embeddings=embeddings,
        return_all=True,
    )
    return masks[0].astype(bool), float(np.max(scores))


def segment_from_box(predictor, embeddings, box_rc) -> tuple[np.ndarray, float]:
    """micro-sam's tiled ``segment_from_box`` (``[row0, col0, row1, col1]``): the full-image
    bool mask and its score."""
    masks, scores, _ = micro_sam().prompts.segment_from_box(
        predictor, np.asarray(box_rc), image_embeddings=embeddings, return_all=True
    )
    return masks[0].astype(bool), float(scores[0])


def to_sam_rgb(block: np.ndarray) -> np.ndarray:
    """The block as micro-sam's ``_to_image`` hands it to SAM (our mapping ``tile_minmax``),
    for a grey or 3-channel block: float32, each channel minus its minimum, over its range
    plus 1e-7, times 255, truncated to uint8. Written out so a test can state it."""
    x = np.asarray(block, np.float32)
    if x.ndim == 2:
        x = np.repeat(x[..., None], 3, axis=-1)
    x = x - x.min(axis=(0, 1))[None, None]
    x = x / (x.max(axis=(0, 1))[None, None] + np.float32(1e-7))
    return (x * 255).astype(np.uint8)
