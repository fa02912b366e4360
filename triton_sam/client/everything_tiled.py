"""Segment everything on a large image: one job per tile, the pieces joined across tiles.

The server's everything model runs the official generator on one block of a large image the
``<family>_large`` model holds (``handle`` + ``block``: the pixels never travel through the
client, :mod:`triton_sam.serving.protocol.everything`). This module runs one such job per
tile, each on the tile grown by its halo, with the server's progress and cancellation per
job, and joins the pieces of objects that cross tile edges into one instance
(:func:`triton_sam.serving.everything.stitch.stitch`). The result is written as an OME-Zarr
label image (napari and Fiji open it) block by block, and as COCO RLE records in full-image
pixels, so no full-size mask is ever allocated.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.client import everything as job
from triton_sam.client.endpoint import Endpoint
from triton_sam.errors import RequestCancelledError
from triton_sam.serving import masks
from triton_sam.serving.everything.stitch import DEFAULT_MIN_OVERLAP, Piece, Stitched, paint, stitch
from triton_sam.serving.protocol import everything as protocol
from triton_sam.serving.tiles import Block, TileGrid

TileProgress = Callable[[int, int], Any]  # (tiles done, tiles in all)
DEFAULT_LABEL_CHUNK = (1024, 1024)


@dataclass(frozen=True)
class TiledEverything:
    """Every instance of a large image.

    Attributes:
        image_size: (rows, cols) of the image.
        instances: one per object, by decreasing score (:class:`~.stitch.Stitched`: offset,
            mask crop, score, the pieces it joined).
        tiles: jobs run (one per tile).
    """

    image_size: tuple[int, int]
    instances: list[Stitched]
    tiles: int

    def __len__(self) -> int:
        return len(self.instances)

    def records(self) -> list[dict[str, Any]]:
        """COCO records in full-image pixels: ``segmentation`` {size, counts} (compressed
        RLE over the whole image, computed from each crop), ``bbox`` [x, y, w, h], ``area``,
        ``predicted_iou`` (the pieces' scores weighted by area), ``pieces`` (tiles joined)."""
        out = []
        for inst in self.instances:
            counts = masks.placed_rle_counts(inst.mask, inst.offset, self.image_size)
            rows, cols = inst.mask.shape
            out.append(
                {
                    "segmentation": {
                        "size": list(self.image_size),
                        "counts": masks.compress_counts(counts).decode("ascii"),
                    },
                    "bbox": [inst.offset[1], inst.offset[0], cols, rows],
                    "area": inst.area,
                    "predicted_iou": inst.score,
                    "pieces": len(inst.pieces),
                }
            )
        return out

    def write_coco(self, path: str | Path) -> Path:
        """The records as one JSON file (``{"image_size": ..., "instances": [...]}``)."""
        path = Path(path)
        answer = {"image_size": list(self.image_size), "instances": self.records()}
        path.write_text(json.dumps(answer, separators=(",", ":")))
        return path

    def write_ome_zarr(self, path: str | Path, chunk: tuple[int, int] = DEFAULT_LABEL_CHUNK):
        """The label image as an OME-Zarr (NGFF 0.4: zarr format 2, which napari's and Fiji's
        readers open): one uint32 level ``0`` chunked ``chunk``, written one chunk at a time
        from :meth:`label_blocks`, with the ``multiscales`` and ``image-label`` metadata.
        Returns the zarr group."""
        import zarr

        group = zarr.open_group(str(path), mode="w", zarr_format=2)
        labels = group.create_array(
            "0", shape=self.image_size, chunks=chunk, dtype="uint32", fill_value=0
        )
        for block, part in self.label_blocks(chunk):
            labels[block.slices()] = part  # one chunk per write: the blocks are the chunks
        axes = [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}]
        scale = [{"type": "scale", "scale": [1.0, 1.0]}]
        group.attrs.update(
            {
                "multiscales": [
                    {
                        "version": "0.4",
                        "name": "segment everything",
                        "axes": axes,
                        "datasets": [{"path": "0", "coordinateTransformations": scale}],
                    }
                ],
                "image-label": {"version": "0.4"},
            }
        )
        return group

    def label_blocks(self, chunk: tuple[int, int] = DEFAULT_LABEL_CHUNK) -> Iterator[tuple]:
        """``(block, uint32 labels)`` for every block of ``chunk`` pixels of the image, each
        painted from only the instances that touch it (larger first, so smaller ones stay on
        top); instance ``k`` is label ``k + 1``."""
        grid = TileGrid(self.image_size, chunk)
        touching: dict[int, list[int]] = {}
        for k, inst in enumerate(self.instances):
            end = (inst.offset[0] + inst.mask.shape[0], inst.offset[1] + inst.mask.shape[1])
            for tile in grid.tiles_touching(Block(inst.offset, end)):
                touching.setdefault(tile, []).append(k)
        for tile in range(len(grid)):
            block = grid.core(tile)
            chosen = touching.get(tile, [])
            yield block, paint(self.instances, block, only=chosen)


def segment_everything_tiled(
    endpoint: Endpoint,
    model: str,
    handle: str,
    grid: TileGrid,
    *,
    z: int | None = None,
    params_json: str = "{}",
    progress: TileProgress | None = None,
    cancel: threading.Event | None = None,
    min_overlap: float = DEFAULT_MIN_OVERLAP,
    **options: Any,
) -> TiledEverything:
    """One everything job per tile of ``grid`` on the large image ``handle``, joined.

    Args:
        endpoint: the server's gRPC endpoint (the everything model streams over gRPC).
        model: the everything model (``<family>_everything``).
        handle: the large image's handle (its tile and halo are ``grid``'s).
        z: the slice of a volume.
        params_json: the generator's parameters (``client.everything.check_params``).
        progress: ``progress(tiles done, tiles)`` after each tile.
        cancel: set it (from any thread) to stop after the tile in work; its job is
            cancelled on the server too when set while its stream runs.
        min_overlap: the join threshold (:mod:`triton_sam.serving.everything.stitch`).
        **options: ``client.everything.StreamOptions`` (headers, tls, timeout_s) for each job.

    Raises:
        RequestCancelledError: ``cancel`` was set (nothing is returned: a partial scan would
            be missing objects).
        Whatever :func:`triton_sam.client.everything.generate` raises for one job.
    """
    pieces: list[Piece] = []
    for done, tile in enumerate(range(len(grid))):
        if cancel is not None and cancel.is_set():
            raise RequestCancelledError("segment everything: cancelled between tiles")
        outer = grid.outer(tile)
        inputs = tile_inputs(handle, outer, z, params_json)
        result = job.generate(endpoint, model, inputs, progress=_stop_on(cancel), **options)
        pieces += pieces_of(tile, outer, result.instances)
        if progress is not None:
            progress(done + 1, len(grid))
    return TiledEverything(grid.shape, stitch(grid, pieces, min_overlap=min_overlap), len(grid))


def segment_large(
    image,
    *,
    z: int | None = None,
    progress: TileProgress | None = None,
    cancel: threading.Event | None = None,
    grpc_url: str | None = None,
    job_timeout_s: float | None = None,
    min_overlap: float = DEFAULT_MIN_OVERLAP,
    **params: Any,
) -> TiledEverything:
    """Every instance of a :class:`~triton_sam.client.large_image.LargeImage` (slice ``z``
    of a volume): one job per tile of its grid on the family's everything model, joined.

    Args:
        image: the large image (its handle, grid and connection).
        z: the slice of a volume.
        progress: ``progress(tiles done, tiles)`` after each tile.
        cancel: set it to stop (the job in work is cancelled on the server).
        grpc_url: the server's gRPC address (jobs stream over gRPC; default as
            ``SAM2TritonClient.generate_masks``).
        job_timeout_s: give up on one tile's job after this long.
        min_overlap: the join threshold.
        **params: the official generator's parameters, the same for every tile.
    """
    model = image.model
    prefix = model.model.removesuffix("_large")
    params_json = job.check_params(model.family, params)
    endpoint = job.grpc_endpoint(model.transport.endpoint, grpc_url)
    grid = TileGrid(image.image_size, image.tile, image.halo)
    return segment_everything_tiled(
        endpoint,
        protocol.model_name(f"{prefix}_session"),
        image.handle,
        grid,
        z=image.check_z(z),
        params_json=params_json,
        progress=progress,
        cancel=cancel,
        min_overlap=min_overlap,
        timeout_s=job_timeout_s,
        tls=model.transport.tls,
    )


def tile_inputs(handle: str, outer: Block, z: int | None, params_json: str) -> dict:
    """One tile's job: the handle, its outer block, the slice, the parameters."""
    inputs = {
        protocol.PARAMS: np.array([params_json.encode("utf-8")], dtype=np.object_),
        protocol.HANDLE: np.array([handle.encode("utf-8")], dtype=np.object_),
        protocol.BLOCK: np.array([*outer.begin, *outer.end], np.int32),
    }
    if z is not None:
        inputs[protocol.Z] = np.array([z], np.int32)
    return inputs


def pieces_of(tile: int, outer: Block, records: list[Mapping[str, Any]]) -> list[Piece]:
    """The job's COCO records (in the block's pixels) as pieces placed in the image."""
    found = []
    for record in records:
        size = tuple(int(v) for v in record["segmentation"]["size"])
        mask = masks.decode_rle(record["segmentation"]["counts"], size)
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        if not len(rows):
            continue
        y, x = int(rows[0]), int(cols[0])
        crop = mask[y : rows[-1] + 1, x : cols[-1] + 1]
        offset = (outer.begin[0] + y, outer.begin[1] + x)
        found.append(Piece(tile, offset, crop, float(record["predicted_iou"])))
    return found


def _stop_on(cancel: threading.Event | None):
    """A progress callback that raises when ``cancel`` is set: ``generate`` then cancels the
    job on the server (its stream is stopped with ``cancel_requests``)."""
    if cancel is None:
        return None

    def check(done: int, total: int) -> None:
        if cancel.is_set():
            raise RequestCancelledError("segment everything: cancelled during a tile")

    return check
