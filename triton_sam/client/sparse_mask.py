"""A mask of a large image as its crop and offset: what ``<family>_large`` answers a click with.

A mask on a 20,000 px section is a few hundred pixels of object in 400 million of image; a
dense float32 array of it would be 1.6 GB. The large model (:mod:`triton_sam.serving.protocol.
large`) answers each mask as the pixels of its bounding box (COCO compressed RLE, column-major
as pycocotools writes it) and the box's top-left pixel in the full image, and
:class:`SparseMask` keeps it that way: :meth:`~SparseMask.crop` decodes the crop alone,
:meth:`~SparseMask.paste_into` writes it into a caller's array (numpy, zarr, a memory map)
without a full-size copy, and :meth:`~SparseMask.dense` refuses past :data:`MAX_DENSE_PIXELS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.serving import masks
from triton_sam.serving.protocol import large as protocol

# A dense bool mask of this many pixels is 64 MiB: as large as a 8192 x 8192 image, past which
# ``dense`` refuses and points to ``crop``/``paste_into``.
MAX_DENSE_PIXELS = 8192 * 8192


@dataclass(frozen=True)
class SparseMask:
    """One mask of a large image: the crop of its bounding box, placed at ``offset``.

    Coordinates are pixels of the full-resolution image: ``offset`` and ``size`` (row,
    column) as numpy indexes them, ``box`` (X, Y) as SAM's prompts.

    Attributes:
        offset: (row, col) of the crop's top-left pixel in the full image.
        size: (rows, cols) of the crop; (0, 0) for an empty mask.
        counts: COCO compressed RLE of the crop (column-major, as ``pycocotools`` writes it;
            ``{"size": list(size), "counts": counts}`` is a pycocotools RLE).
        box: (x0, y0, x1, y1) in full-image pixels, inclusive ends.
        score: SAM's predicted IoU.
        area: pixels in the mask.
        cut: True when the mask touches the edge of the block it was computed on where the
            image goes on (the object may go on past it; ``mode="window"`` or ``"auto"``
            recover objects that fit in a window).
    """

    offset: tuple[int, int]
    size: tuple[int, int]
    counts: str
    box: tuple[float, float, float, float]
    score: float
    area: int
    cut: bool

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SparseMask:
        """A mask of the large model's answer (its :data:`~triton_sam.serving.protocol.large.
        MASK_FIELDS` object).

        Raises:
            InputValidationError: (field ``masks``) a field missing or of the wrong form.
        """
        missing = [f for f in protocol.MASK_FIELDS if f not in obj]
        if missing:
            raise InputValidationError("masks", f"an answer's mask lacks {missing}")
        try:
            return cls(
                offset=(int(obj["offset"][0]), int(obj["offset"][1])),
                size=(int(obj["size"][0]), int(obj["size"][1])),
                counts=str(obj["counts"]),
                box=tuple(float(v) for v in obj["box"][:4]),  # type: ignore[arg-type]
                score=float(obj["score"]),
                area=int(obj["area"]),
                cut=bool(obj["cut"]),
            )
        except (TypeError, ValueError, IndexError) as e:
            raise InputValidationError("masks", f"a mask field has the wrong form: {e}") from e

    def to_json(self) -> dict[str, Any]:
        """The mask as the wire's JSON object (:meth:`from_json` reads it back)."""
        return {
            "offset": list(self.offset),
            "size": list(self.size),
            "counts": self.counts,
            "box": list(self.box),
            "score": self.score,
            "area": self.area,
            "cut": self.cut,
        }

    @property
    def slices(self) -> tuple[slice, slice]:
        """The crop's place in the full image, as numpy slices (rows, columns)."""
        (r, c), (h, w) = self.offset, self.size
        return slice(r, r + h), slice(c, c + w)

    def crop(self) -> np.ndarray:
        """The mask over its bounding box: bool [rows, cols] (``size``), at ``offset``."""
        if self.size[0] * self.size[1] == 0:
            return np.zeros(self.size, dtype=bool)
        return masks.decode_rle(self.counts, self.size)

    def paste_into(self, array: Any, value: Any = True) -> None:
        """Write ``value`` where the mask is, into ``array`` (the full image's rows and columns
        first: numpy, zarr, a memory map; only the crop's region is read and written).

        Args:
            array: [rows, cols, ...] indexed in full-image pixels.
            value: what a mask pixel becomes (True, or a label id); other pixels keep theirs.

        Raises:
            InputValidationError: (field ``array``) the crop does not fit in ``array``.
        """
        end = (self.offset[0] + self.size[0], self.offset[1] + self.size[1])
        shape = tuple(array.shape[:2])
        if len(shape) < 2 or end[0] > shape[0] or end[1] > shape[1]:
            raise InputValidationError(
                "array", f"shape {tuple(array.shape)} does not hold the crop ending at {end}"
            )
        if self.area == 0:
            return
        region = np.array(array[self.slices])  # a copy: zarr returns one anyway
        region[self.crop()] = value
        array[self.slices] = region

    def dense(self, image_shape: tuple[int, int]) -> np.ndarray:
        """The mask as a bool [rows, cols] array of the whole image, for images where that is
        sane (at most :data:`MAX_DENSE_PIXELS` pixels).

        Args:
            image_shape: (rows, cols) of the full image (``LargeImage.image_size``).

        Raises:
            InputValidationError: (field ``image_shape``) above the bound: use :meth:`crop`
                with :attr:`offset`, or :meth:`paste_into` an array of your own (a zarr).
        """
        rows, cols = (int(v) for v in image_shape[:2])
        if rows * cols > MAX_DENSE_PIXELS:
            raise InputValidationError(
                "image_shape",
                f"{rows}x{cols} is {rows * cols / 1e6:.0f} megapixels, above the "
                f"{MAX_DENSE_PIXELS / 1e6:.0f} a dense mask is made for; use crop() and "
                "offset, or paste_into(a zarr array of your own)",
            )
        out = np.zeros((rows, cols), dtype=bool)
        self.paste_into(out)
        return out

    def to_coco(self, image_size: tuple[int, int]) -> dict[str, Any]:
        """A COCO annotation of the mask on the full image: ``segmentation`` as the full
        image's compressed RLE (pycocotools decodes it), ``bbox`` [x, y, w, h], ``area``,
        ``score``.

        The RLE is re-encoded from the crop: its runs are column-major, so the crop's columns
        are rewritten one by one with the image's rows above and below them, in memory
        proportional to the crop, never to the image.

        Args:
            image_size: (rows, cols) of the full image.
        """
        rows, cols = (int(v) for v in image_size[:2])
        return {
            "segmentation": {"size": [rows, cols], "counts": self._full_counts(rows, cols)},
            "bbox": [float(v) for v in self._xywh()],
            "area": self.area,
            "score": self.score,
        }

    def _xywh(self) -> tuple[int, int, int, int]:
        (r, c), (h, w) = self.offset, self.size
        return c, r, w, h

    def _full_counts(self, rows: int, cols: int) -> str:
        """The runs of the full image's column-major mask, from the crop's."""
        crop = self.crop()
        (r0, c0), (h, w) = self.offset, self.size
        runs: list[int] = []
        value, length = False, r0 + c0 * rows  # columns left of the crop, rows above it
        for j in range(w):  # each crop column: background above, crop pixels, below
            column = crop[:, j]
            edges = np.flatnonzero(np.diff(column.astype(np.int8))) + 1
            for segment in np.split(column, edges):
                if bool(segment[0]) == value:
                    length += len(segment)
                else:
                    runs.append(length)
                    value, length = bool(segment[0]), len(segment)
            gap = rows - h  # below this column's crop, then above the next one's
            if gap:
                if value:
                    runs.append(length)
                    value, length = False, gap
                else:
                    length += gap
        rest = rows * cols - (r0 + c0 * rows) - w * rows  # right of the crop (-r0: none)
        if value:  # the crop ends on the image's last row: close its run
            runs.append(length)
            length = 0
        if length + rest or not runs:  # COCO ends on the last pixel's run, never a 0
            runs.append(length + rest)
        return masks.compress_counts(np.asarray(runs, np.int64)).decode()
