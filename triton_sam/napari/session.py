"""What the widget asks of the server, without Qt: each method blocks, and the widget runs it
on a worker thread, never on the UI thread.

Only the public API of :mod:`triton_sam` is used (the import-linter contract in
pyproject.toml holds this package to it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triton_sam import (
    EverythingResult,
    LargeImage,
    SAM2TritonClient,
    SAM2VideoTritonClient,
    ServedModel,
    resolve_pixel_mapping,
    served_models,
    to_sam_rgb,
)
from triton_sam.napari.prompts import Prompt

# Above this many pixels an image goes through the server's tiled path (the <family>_large
# model) when it offers one: SAM sees 1024 px a side, so a larger image embedded whole loses
# the detail a click needs, and its every pixel would cross the wire to be resized away.
LARGE_IMAGE_PIXELS = 4096 * 4096


class Cancelled(Exception):
    """The user cancelled a long job (raised from its progress callback)."""


@dataclass(frozen=True)
class Offer:
    """What a server offers, as the widget's tools need it.

    Attributes:
        families: model types with a session model (points and boxes), e.g. ``["sam2"]``.
        everything: families with a segment-everything model.
        large: families with a tiled large-image model.
        concepts: the server has a concept model (text prompts).
        trackers: families with a video tracker (z propagation), e.g. ``{"sam2", "sam3"}``.
    """

    families: list[str] = field(default_factory=list)
    everything: set[str] = field(default_factory=set)
    large: set[str] = field(default_factory=set)
    concepts: bool = False
    trackers: set[str] = field(default_factory=set)

    @property
    def tracker(self) -> bool:
        """The server has a video tracker (z propagation)."""
        return bool(self.trackers)

    def tracker_for(self, family: str | None) -> str:
        """The tracker model z propagation uses: the one of the family the clicks use when the
        server has it (the same model sees the same slice), else SAM2.1's, else any."""
        chosen = family if family in self.trackers else None
        chosen = chosen or ("sam2" if "sam2" in self.trackers else min(self.trackers))
        return f"{chosen}_tracker"

    @classmethod
    def of(cls, models: list[ServedModel]) -> Offer:
        """The offer of a server's :func:`~triton_sam.served_models` answer."""
        by_kind: dict[str, list[str]] = {}
        for m in models:
            by_kind.setdefault(m.kind, []).append(m.family)
        return cls(
            families=sorted(by_kind.get("session", [])),
            everything=set(by_kind.get("everything", [])),
            large=set(by_kind.get("large", [])),
            concepts="concept" in by_kind,
            trackers=set(by_kind.get("tracker", [])),
        )


@dataclass
class Embedded:
    """The image the server has features of: its layer, slice, mapping and size."""

    layer_name: str
    z: int | None
    size: tuple[int, int]  # (rows, cols)
    mapping: dict[str, Any]
    large: LargeImage | None = None


@dataclass
class Tracking:
    """A tracker session over one layer's stack."""

    layer_name: str
    state: Any
    prompted: set[int] = field(default_factory=set)  # object ids given prompts


def slice_rgb(data: Any, rgb: bool, z: int | None, mapping: dict[str, Any]) -> np.ndarray:
    """One slice of a layer's data as SAM's uint8 RGB (channels last when ``rgb``)."""
    plane = np.asarray(data[z] if z is not None else data)
    return to_sam_rgb(plane, mapping)


class Session:
    """The clients of one server, and the image they work on.

    Args:
        url: the server's ``host:port`` (or a URL with scheme).
        protocol: ``"http"`` or ``"grpc"``.
        timeout_s: per-request timeout.
        token: a bearer token for a server behind the token proxy (None: none sent).
    """

    def __init__(
        self,
        url: str,
        protocol: str = "grpc",
        *,
        timeout_s: float = 30.0,
        token: str | None = None,
    ) -> None:
        self.url, self.protocol, self.timeout_s = url, protocol, timeout_s
        self._token = token  # a secret: only handed to the clients, never shown
        self.offer = Offer()
        self.client: SAM2TritonClient | None = None
        self.concept_client: SAM2TritonClient | None = None
        self.video: SAM2VideoTritonClient | None = None
        self.embedded: Embedded | None = None
        self.tracking: Tracking | None = None
        self.large_image_pixels = LARGE_IMAGE_PIXELS

    # -- connecting ----------------------------------------------------------------------
    def connect(self, family: str | None = None) -> Offer:
        """List what the server offers and open a client for ``family`` (default: the first
        family offered, SAM2.1 preferred).

        Raises:
            ServerUnavailableError: no ready server at the URL.
            UnsupportedModelError: the server offers no model for points and boxes.
        """
        from triton_sam import UnsupportedModelError

        offer = Offer.of(
            served_models(self.url, self.protocol, timeout_s=self.timeout_s, token=self._token)
        )
        if not (offer.families or offer.tracker or offer.concepts):
            raise UnsupportedModelError(
                f"url: the server at {self.url} offers no SAM model (points and boxes, "
                "tracking or concepts); export one with `triton-sam setup`"
            )
        self.close()
        self.offer = offer
        if offer.families:  # a tracker or concept server alone still has its tool
            family = family or ("sam2" if "sam2" in offer.families else offer.families[0])
            self.client = SAM2TritonClient(
                self.url, family, self.protocol, timeout_s=self.timeout_s, token=self._token
            )
        return offer

    def _require_client(self) -> SAM2TritonClient:
        from triton_sam import ServerUnavailableError

        if self.client is None:
            raise ServerUnavailableError("url: not connected; press Connect first")
        return self.client

    def close(self) -> None:
        """Close every client (idempotent). Best effort: the server may be gone (closing the
        widget must not fail on it), and it frees idle images and sessions on its own."""
        large = self.embedded.large if self.embedded is not None else None
        for close in (
            large.close if large is not None else None,
            self.close_tracking,
            *(c.close for c in (self.client, self.concept_client, self.video) if c is not None),
        ):
            if close is not None:
                with contextlib.suppress(Exception):
                    close()
        self.client = self.concept_client = self.video = None
        self.embedded = self.tracking = None

    # -- embedding -----------------------------------------------------------------------
    def embed(self, name: str, data: Any, *, rgb: bool, z: int | None) -> Embedded:
        """Embed slice ``z`` of a layer's data (the whole 2-D image when None); above
        :attr:`large_image_pixels` through the server's tiled path when it has one.

        The mapping of intensities is the server's (:func:`~triton_sam.to_sam_rgb`),
        resolved over the whole stack (its middle slice) so every slice reads alike.
        """
        client = self._require_client()
        volume = z is not None
        mapping = resolve_pixel_mapping(data, volume=volume)
        plane = np.asarray(data[z] if volume else data)
        size = (int(plane.shape[0]), int(plane.shape[1]))
        if self.embedded is not None and self.embedded.large is not None:
            with contextlib.suppress(Exception):  # the old image: freed by the server anyway
                self.embedded.large.close()
        self.embedded = None
        if size[0] * size[1] > self.large_image_pixels and client.family.family in self.offer.large:
            large = client.open_array(to_sam_rgb(plane, mapping), progress=False)
            self.embedded = Embedded(name, z, size, mapping, large)
        else:
            client.set_image(to_sam_rgb(plane, mapping))
            self.embedded = Embedded(name, z, size, mapping)
        return self.embedded

    # -- clicking --------------------------------------------------------------------------
    def segment(self, prompt: Prompt) -> np.ndarray:
        """The mask of one object's prompts on the embedded image, bool [rows, cols]."""
        client = self._require_client()
        if self.embedded is None:
            from triton_sam import ImageNotSetError

            raise ImageNotSetError("image: embed an image layer first (Embed)")
        if self.embedded.large is not None:
            masks = self.embedded.large.predict(
                prompt.point_coords, prompt.point_labels, prompt.box
            )
            # The labels layer holds the whole image anyway; the mask travelled as a crop.
            mask = np.zeros(self.embedded.size, bool)
            if masks:
                masks[0].paste_into(mask)
            return mask
        logits, _ = client.predict(prompt.point_coords, prompt.point_labels, prompt.box)
        return logits[0, 0] > 0

    # -- segment everything --------------------------------------------------------------
    def everything(
        self,
        progress: Callable[[int, int], None],
        cancel: threading.Event,
        grpc_url: str | None = None,
        **params: Any,
    ) -> EverythingResult:
        """Every instance of the embedded image (the server's everything model).

        Raises:
            Cancelled: ``cancel`` was set (the job is cancelled on the server too).
        """
        client = self._require_client()

        def report(done: int, total: int) -> None:
            if cancel.is_set():
                raise Cancelled("segment everything was cancelled")
            progress(done, total)

        return client.generate_masks(progress=report, grpc_url=grpc_url, **params)

    # -- tracking through z ----------------------------------------------------------------
    def propagate(
        self, name: str, data: Any, z: int, object_id: int, prompt: Prompt
    ) -> dict[int, dict[int, np.ndarray]]:
        """Prompts for ``object_id`` on slice ``z``, then tracking through the stack both
        ways from there; a second call on the same layer adds its prompts (a correction) to
        the same tracker session.

        Returns:
            {slice: {object id: bool mask [rows, cols]}} for every slice of the stack.
        """
        if self.video is None:
            family = self.client.family.family if self.client is not None else None
            self.video = SAM2VideoTritonClient(
                self.url,
                protocol=self.protocol,
                token=self._token,
                model=self.offer.tracker_for(family),
            )
        if self.tracking is None or self.tracking.layer_name != name:
            self.close_tracking()
            mapping = resolve_pixel_mapping(data, volume=True)
            stack = np.stack([slice_rgb(data, False, i, mapping) for i in range(len(data))])
            self.tracking = Tracking(name, self.video.init_state(stack))
        state = self.tracking.state
        self.video.add_new_points_or_box(
            state,
            z,
            object_id,
            points=prompt.point_coords,
            labels=prompt.point_labels,
            box=prompt.box,
        )
        self.tracking.prompted.add(object_id)
        frames: dict[int, dict[int, np.ndarray]] = {}
        for reverse in (False, True):
            for f, ids, logits in self.video.propagate_in_video(state, z, reverse=reverse):
                frames[f] = {i: logits[k, 0] > 0 for k, i in enumerate(ids)}
        return frames

    def close_tracking(self) -> None:
        """Close the tracker session (its state on the server is freed)."""
        if self.tracking is not None and self.video is not None:
            self.video.close_state(self.tracking.state)
        self.tracking = None

    # -- concepts (text prompts) -----------------------------------------------------------
    def concepts(self, text: str, rgb_plane: np.ndarray) -> np.ndarray:
        """Every instance of a phrase in ``rgb_plane``: bool [K, rows, cols]."""
        if self.concept_client is None:
            self.concept_client = SAM2TritonClient(
                self.url, "sam3_concept", self.protocol, timeout_s=self.timeout_s, token=self._token
            )
        self.concept_client.set_image(rgb_plane)
        found = self.concept_client.predict_concepts(text)
        return np.asarray(found.masks, bool)
