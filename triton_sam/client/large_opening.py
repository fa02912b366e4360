"""Opening a large image or volume on the server (the ``<family>_large`` model): a dataset
it reads under its data roots, or an array the client sends in pieces. A mixin, so that every
client with a transport and a session model opens them the same way."""

from __future__ import annotations

import contextlib
from typing import Any

from triton_sam.client import large_transfer
from triton_sam.client.large_image import LargeImage, LargeModel
from triton_sam.client.transport import Transport
from triton_sam.errors import InputValidationError
from triton_sam.models.spec import FamilySpec
from triton_sam.serving.protocol import large as protocol


class OpensLargeImages:
    """``open_dataset`` and ``open_array`` for a client that has ``_transport``,
    ``session_model`` and ``family``."""

    _transport: Transport
    session_model: str
    family: FamilySpec

    def _large_model(self) -> LargeModel:
        model = protocol.model_name(self.session_model)
        return LargeModel(
            self._transport, model, family=self.family.family, session_model=self.session_model
        )

    def open_dataset(
        self,
        dataset: str,
        key: str | None = None,
        mapping: dict[str, Any] | None = None,
        tile: int | tuple[int, int] | None = None,
        halo: int | tuple[int, int] | None = None,
    ) -> LargeImage:
        """Open an image or volume the server reads where it lives (zarr, N5, OME-Zarr, TIFF)
        under a data root its operator configured. Nothing is embedded yet.

        Args:
            dataset: ``"<root>/<path inside it>"``, e.g. ``"em/section.zarr"``.
            key: an array inside a zarr/N5 group, or an OME-Zarr level (``"0"``).
            mapping: intensities to SAM's RGB, e.g. ``{"kind": "percentile", "low": 1,
                "high": 99}`` (None: the server's default for the dtype).
            tile, halo: pixels a side, or (rows, cols) (None: the server's defaults).

        Returns:
            A :class:`~triton_sam.client.large_image.LargeImage` (close it, or use ``with``).

        Raises:
            InputValidationError: an argument (named) is malformed, before sending.
            InvalidRequestError: the server refused it (a path outside its data roots, an
                unknown format, past a bound), naming ``request.<field>``.
        """
        if not isinstance(dataset, str) or "/" not in dataset.strip("/"):
            raise InputValidationError(
                "dataset",
                f"got {dataset!r}, expected '<root>/<path inside it>', e.g. 'em/sec.zarr'",
            )
        body: dict[str, Any] = {"op": "open", "dataset": dataset}
        if key is not None:
            body["key"] = str(key)
        body.update(large_transfer.image_options(mapping, tile, halo))
        model = self._large_model()
        return LargeImage(model, model.call(body))

    def open_array(
        self,
        array: Any,
        mapping: dict[str, Any] | None = None,
        tile: int | tuple[int, int] | None = None,
        halo: int | tuple[int, int] | None = None,
        piece: int = 2048,
        progress: bool = True,
    ) -> LargeImage:
        """Send an image or volume the client holds to the server, once, ``piece`` x
        ``piece`` pixels at a time (never read whole), with a progress bar when ``progress``.

        ``array``: anything with ``.shape``, ``.dtype`` and slicing (numpy, zarr, dask,
        tifffile's zarr store), (rows, cols[, channels]) or (z, rows, cols[, channels]),
        uint8, uint16 or float32 (int8/int16/float16/float64 travel as float32). The other
        arguments, what it returns and raises are :meth:`open_dataset`'s; closing the image
        deletes its pixels on the server. On any failure, Ctrl-C included, the half-sent
        image is closed (its pixels deleted).
        """
        body = large_transfer.create_body(array)
        large_transfer.check_piece(piece)
        body.update(large_transfer.image_options(mapping, tile, halo))
        model = self._large_model()
        image = LargeImage(model, model.call(body))
        try:
            large_transfer.put_pieces(image, array, piece=piece, progress=progress)
        except BaseException:
            with contextlib.suppress(Exception):
                image.close()
            raise
        return image
