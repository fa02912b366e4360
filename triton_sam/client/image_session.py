"""The image-session core: one family's models on one server, and the image prompts go to.

:class:`ImageSession` knows the family, the encoder, decoder and session models (once,
resolved against the server by :meth:`ImageSession.connect`) and builds every conversation
the image clients have with the server as a flow of :mod:`triton_sam.client.flow`. It does
no I/O itself: the sync client (:class:`~triton_sam.client.sync.SAM2TritonClient`) runs its
flows with :func:`flow.run`, the async one (:class:`~triton_sam.client.connection.Connection`,
under :class:`~triton_sam.client.speculative.SpeculativeSAM2Client`) and the gateway with
:func:`flow.arun`.

Following an image down: ``set_image`` -> :meth:`ImageSession.load` builds the flow
(:func:`flow.load_image`) -> the runner -> its first step reads the file once
(:func:`~triton_sam.client.image_io.read_image`, in a thread for the async runner) into the
request it needs (:class:`~triton_sam.client.embedding_path.CachedImage` when the server keeps
features, else the pixels) -> probe, embed on a miss (or the stateless encoder) -> the
transport; the encoded image comes back as a value, which the client keeps.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from triton_sam.client import flow, startup
from triton_sam.client.decode_request import DecodeRequest, EncodedImage, decode_request
from triton_sam.client.embedding_path import CachedImage
from triton_sam.client.endpoint import Endpoint
from triton_sam.client.prediction import Prediction
from triton_sam.models.registry import get_family
from triton_sam.models.spec import FamilySpec

_MODELS = (
    ("family", "The family spec (after connecting: the decoder layout the server has)."),
    ("model_type", "The model_type given."),
    ("encoder_model", "Encoder model name."),
    ("decoder_model", "Decoder model name."),
    ("session_model", "Session model name."),
    ("uses_server_embeddings", "Whether clicks go through the session model (once connected)."),
)


def model_properties(core: str) -> tuple[property, ...]:
    """Read-only properties for a client holding an :class:`ImageSession` at the dotted
    attribute path ``core``: ``family``, ``model_type``, ``encoder_model``,
    ``decoder_model``, ``session_model``, ``uses_server_embeddings``, in that order."""
    return tuple(property(operator.attrgetter(f"{core}.{name}"), doc=doc) for name, doc in _MODELS)


class ImageSession:
    """One family's models on one server, and the current image.

    Args:
        model_type: the family (``"sam2"``, ``"sam1"``, ``"sam3"``...).
        encoder_model / decoder_model / session_model: Triton model names; None = the
            family's.

    Attributes:
        family: the family spec (after :meth:`connect`: the decoder layout the server has).
        encoder_model / decoder_model / session_model: the Triton models.
        uses_server_embeddings: clicks go through the session model (known once connected).
        image: the current image (:meth:`set_image`), or None.

    Raises:
        UnsupportedModelError: unknown ``model_type``.
    """

    def __init__(
        self,
        model_type: str,
        *,
        encoder_model: str | None = None,
        decoder_model: str | None = None,
        session_model: str | None = None,
    ) -> None:
        self.model_type = model_type
        self.family: FamilySpec = get_family(model_type)
        self.encoder_model = encoder_model or getattr(self.family, "encoder_model", "")
        self.decoder_model = decoder_model or getattr(self.family, "decoder_model", "")
        self.session_model = session_model or getattr(self.family, "session_model", "")
        self.uses_server_embeddings = False
        self.image: EncodedImage | None = None

    # -- flows -----------------------------------------------------------------------------
    def connect(
        self, endpoint: Endpoint, use_server_embeddings: bool | None
    ) -> flow.Flow[startup.ServedModels]:
        """Check the server and resolve the models (:func:`startup.connect`), then adopt them."""
        served = yield from startup.connect(
            endpoint,
            self.family,
            self.encoder_model,
            self.decoder_model,
            self.session_model,
            use_server_embeddings,
        )
        self.family, self.session_model = served.family, served.session_model
        self.uses_server_embeddings = served.uses_server_embeddings
        self.encoder_model = served.encoder_model or self.encoder_model
        return served

    def load(self, image: Any) -> flow.Flow[EncodedImage]:
        """A new image as the user gave it (a path, bytes, PIL image or HxWx3 uint8 array),
        read once, then kept by the server or encoded (:func:`flow.load_image`); the caller
        makes the result its current :attr:`image`.

        Raises:
            InputValidationError: the image cannot be read or has the wrong shape/dtype.
            ServerError: the encoder or the session model failed.
        """
        models = (self.family, self.encoder_model, self.session_model)
        return flow.load_image(image, *models, self.uses_server_embeddings)

    def new_image(self, source: np.ndarray | CachedImage) -> flow.Flow[EncodedImage]:
        """An image encoded for prompts, without making it the current one (see
        :func:`flow.set_image`; ``source`` from :meth:`source`)."""
        return flow.set_image(source, self.family, self.encoder_model, self.session_model)

    def encode(self, rgb: np.ndarray) -> flow.Flow[EncodedImage]:
        """``rgb`` (HxWx3 uint8) through the stateless encoder: its features here."""
        return flow.encode(rgb, self.family, self.encoder_model)

    def predict(self, request: DecodeRequest) -> flow.Flow[Prediction]:
        """One prompt (see :func:`flow.predict`)."""
        return flow.predict(request, self.family, self.decoder_model, self.session_model)

    # -- requests (no I/O) -----------------------------------------------------------------
    def source(self, rgb: np.ndarray, encoded: bytes | None = None) -> np.ndarray | CachedImage:
        """What :meth:`new_image` sends for ``rgb`` (HxWx3 uint8, decoded from the file bytes
        ``encoded`` if given): a :class:`CachedImage` with its content id when the server
        keeps features (hashing costs milliseconds), else ``rgb`` for the encoder."""
        if not self.uses_server_embeddings:
            return rgb
        return CachedImage.of(rgb, self.family, self.encoder_model, self.session_model, encoded)

    def request(self, image: EncodedImage, *prompt: Any) -> DecodeRequest:
        """Validate a prompt on ``image`` and build its request, raising before anything is
        sent: ``prompt`` is ``(point_coords, point_labels, box, mask_input, multimask)``
        (see :func:`~triton_sam.client.decode_request.decode_request`)."""
        return decode_request(image, self.family, *prompt)
