"""Label Studio's brush RLE: a mask as the ``rle`` list of a ``brushlabels`` result (pure).

The format (what Label Studio's frontend and ``label_studio_sdk.converter.brush.decode_rle``
read) is a bit stream, most significant bit first, over the image's RGBA bytes in row-major
order (``H * W * 4`` values):

- header: 32 bits the number of values, 5 bits ``word_size - 1`` (8-bit words: 7), then four
  4-bit ``rle_size - 1`` (run-length field widths; 3, 4, 8, 16 bits here);
- then runs until the count is reached: 1 bit ``repeat``, 2 bits choosing a width from the
  four, that many bits ``length - 1``, then one word repeated ``length`` times (``repeat`` = 1)
  or ``length`` words (``repeat`` = 0);
- zero bits up to a whole byte; the bytes as a list of ints 0-255.

A mask pixel is four equal values (0 or 255), so every run is at least 4 long and the encoder
writes repeats only. Encoding is vectorised: one pass over the run boundaries, no Python loop
per run.
"""

from __future__ import annotations

import numpy as np

WORD_BITS = 8
RUN_WIDTHS = (3, 4, 8, 16)
_LONGEST = 2 ** RUN_WIDTHS[-1]  # one run field holds at most this many values


def encode_mask(mask: np.ndarray) -> list[int]:
    """A 2-D mask as Label Studio's brush RLE.

    Args:
        mask: [H, W], bool or numbers (non-zero = in the mask).

    Returns:
        The RLE bytes as ints 0-255 (the result's ``value.rle``); every channel of a mask
        pixel is 255, of a background pixel 0.
    """
    if mask.ndim != 2:
        raise ValueError(f"mask: shape {mask.shape}, expected [H, W]")
    values = np.where(np.asarray(mask).reshape(-1) != 0, 255, 0).astype(np.uint8)
    count = values.size * 4
    header = [(count, 32), (WORD_BITS - 1, 5), *((w - 1, 4) for w in RUN_WIDTHS)]
    lengths, run_values = _runs(values)
    lengths = lengths * 4  # four channels per pixel
    fields, widths = _run_fields(lengths, run_values)
    head_fields = np.array([v for v, _ in header], dtype=np.int64)
    head_widths = np.array([w for _, w in header], dtype=np.int64)
    bits = _bits(np.concatenate([head_fields, fields]), np.concatenate([head_widths, widths]))
    return np.packbits(bits).tolist()  # packbits pads the last byte with zeros


def decode_mask(rle: list[int], height: int, width: int) -> np.ndarray:
    """The mask of a brush RLE (any valid stream, not only :func:`encode_mask`'s).

    Returns:
        bool [height, width]: the alpha channel is non-zero.

    Raises:
        ValueError: the stream's value count is not ``height * width * 4``, or it ends early.
    """
    bits = np.unpackbits(np.asarray(rle, dtype=np.uint8))
    reader = _Reader(bits)
    count = reader.read(32)
    if count != height * width * 4:
        raise ValueError(f"rle: {count} values, expected {height} * {width} * 4")
    word = reader.read(5) + 1
    widths = [reader.read(4) + 1 for _ in range(4)]
    out = np.zeros(count, dtype=np.uint8)
    i = 0
    while i < count:
        repeat = reader.read(1)
        end = min(count, i + 1 + reader.read(widths[reader.read(2)]))
        if repeat:
            out[i:end] = reader.read(word)
        else:
            for j in range(i, end):
                out[j] = reader.read(word)
        i = end
    return out.reshape(height, width, 4)[:, :, 3] != 0


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, values) of the runs of equal values of a 1-D array."""
    if values.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.diff(values.astype(np.int16))) + 1
    edges = np.concatenate([[0], starts, [values.size]])
    return np.diff(edges).astype(np.int64), values[edges[:-1]].astype(np.int64)


def _run_fields(lengths: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (field, width) pairs of the runs, each run in pieces of at most 2**16 values."""
    pieces = -(-lengths // _LONGEST)  # ceil: a long run becomes several full pieces + rest
    piece_values = np.repeat(values, pieces)
    piece_lengths = np.full(piece_values.size, _LONGEST, dtype=np.int64)
    last = np.cumsum(pieces) - 1
    piece_lengths[last] = lengths - (pieces - 1) * _LONGEST
    # the narrowest width that holds length - 1
    limits = np.array([2**w for w in RUN_WIDTHS])
    choice = np.searchsorted(limits, piece_lengths, side="left")
    n = piece_values.size
    fields = np.stack([np.ones(n, np.int64), choice, piece_lengths - 1, piece_values], axis=1)
    widths = np.stack(
        [np.ones(n, np.int64), np.full(n, 2), np.asarray(RUN_WIDTHS)[choice], np.full(n, 8)],
        axis=1,
    )
    return fields.reshape(-1), widths.reshape(-1)


def _bits(fields: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Each field's ``width`` low bits, most significant first, concatenated (uint8 0/1)."""
    owner = np.repeat(np.arange(fields.size), widths)
    offset = np.arange(owner.size) - np.repeat(np.cumsum(widths) - widths, widths)
    shift = widths[owner] - 1 - offset
    return ((fields[owner] >> shift) & 1).astype(np.uint8)


class _Reader:
    def __init__(self, bits: np.ndarray) -> None:
        self.bits, self.at = bits, 0

    def read(self, n: int) -> int:
        if self.at + n > self.bits.size:
            raise ValueError("rle: the stream ends before its values do")
        chunk = self.bits[self.at : self.at + n]
        self.at += n
        return int(chunk.dot(1 << np.arange(n - 1, -1, -1, dtype=np.int64))) if n else 0
