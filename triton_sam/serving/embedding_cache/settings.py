"""The session model's settings: one dataclass for the renderer and the model.

:class:`SessionOptions` holds the bounds an operator chooses (``triton_sam.repository``
re-exports it as ``session_config.SessionOptions``); :class:`SessionSettings` adds what the
renderer derives from the family spec. The renderer writes ``to_parameters(settings)`` into
``config.pbtxt`` and the model reads ``from_parameters(SessionSettings, ...)`` back
(:mod:`..protocol.parameters`): each field is the config parameter of the same name
(``protocol.embedding_cache.PARAM_KEYS``, plus the CPU twin's own keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .. import bounds
from ..protocol import embedding_cache as protocol
from ..protocol.parameters import NOT_RENDERED, ParameterError


@dataclass(frozen=True)
class SessionOptions:
    """Bounds of the server-side feature cache.

    Attributes:
        max_images: images whose features are kept (LRU beyond). SAM2 keeps 16 MiB per image
            (fp32, with the high-resolution features), SAM1 4 MiB, the SAM3 tracker ~21 MiB.
        max_bytes: bound on features + kept logits in bytes (0 = only ``max_images``).
        logits_per_image: low-res logits kept per image for refinement without resending
            them (the most recent predictions that asked to keep them).
        max_points / max_boxes / max_image_pixels / max_image_bytes: the request bounds the
            server enforces (defaults and reasons in :mod:`triton_sam.serving.bounds`).
        cpu_features: on a CPU instance, where the cached features live: ``"process"``
            (the default: copied into the stub's memory, copied back into the shared-memory
            pool on every click) or ``"shared_memory"`` (the encoder's output tensors, kept
            in the python backend's shared-memory pool and passed to the decoder without a
            copy: -2.3 ms per SAM2 click, but the stub's resident memory under LRU churn is
            not yet shown to stay bounded). Measured in docs/cpu-performance.md.
        max_concurrent_embeds: images decoded, preprocessed and encoded at once (each holds
            its pixels, its encoder input and its features while it is in work; the encoder's
            memory grows with the batches it runs). The default fills one encoder batch on a
            GPU; the embedded (CPU) server lowers it (``writer.embedded_repository``).
        max_waiting_embeds: embeds that wait for a slot; one more is refused at once with
            the ``Overloaded`` answer (``ServerOverloadedError`` in the clients). Clicks never
            wait in this line.
        feature_store_dir: a directory where the features the cache evicts are written and
            read back instead of encoding the image again (``serving/embedding_cache/
            disk.py``; a volume replicas share works). "" (the default): none. With a store,
            a GPU instance keeps features in host memory (they must reach the disk), so each
            click copies them to the device.
        feature_store_bytes: the store's bound, shared fairly by tenants.

    Raises:
        ParameterError: a value out of its type or range, naming the field.
    """

    max_images: int = protocol.DEFAULT_MAX_IMAGES
    max_bytes: int = protocol.DEFAULT_MAX_BYTES
    logits_per_image: int = protocol.DEFAULT_LOGITS_PER_IMAGE
    max_points: int = bounds.MAX_POINTS
    max_boxes: int = bounds.MAX_BOXES
    max_image_pixels: int = bounds.MAX_IMAGE_PIXELS
    max_image_bytes: int = bounds.MAX_IMAGE_BYTES
    cpu_features: str = protocol.CPU_FEATURES[0]
    max_concurrent_embeds: int = protocol.DEFAULT_MAX_CONCURRENT_EMBEDS
    max_waiting_embeds: int = protocol.DEFAULT_MAX_WAITING_EMBEDS
    feature_store_dir: str = ""
    feature_store_bytes: int = protocol.DEFAULT_FEATURE_STORE_BYTES

    def __post_init__(self) -> None:
        _check_int("max_images", self.max_images, minimum=1)
        _check_int("feature_store_bytes", self.feature_store_bytes, minimum=1)
        if self.feature_store_dir and not self.feature_store_dir.startswith("/"):
            raise ParameterError(
                "feature_store_dir",
                f"got {self.feature_store_dir!r}, expected an absolute path (the server's "
                "working directory is not yours)",
            )
        _check_int("max_bytes", self.max_bytes, minimum=0)
        _check_int("logits_per_image", self.logits_per_image, minimum=0)
        _check_int("max_points", self.max_points, minimum=1)
        if self.max_points > bounds.GRAPH_MAX_POINTS:  # the decoder graph refuses more
            raise ParameterError(
                "max_points",
                f"got {self.max_points}, expected at most {bounds.GRAPH_MAX_POINTS} (the "
                "exported decoders' own bound, serving.bounds.GRAPH_MAX_POINTS)",
            )
        _check_int("max_boxes", self.max_boxes, minimum=0)
        _check_int("max_image_pixels", self.max_image_pixels, minimum=1)
        _check_int("max_image_bytes", self.max_image_bytes, minimum=1)
        _check_int("max_concurrent_embeds", self.max_concurrent_embeds, minimum=1)
        _check_int("max_waiting_embeds", self.max_waiting_embeds, minimum=0)
        if self.cpu_features not in protocol.CPU_FEATURES:
            raise ParameterError(
                "cpu_features",
                f"got {self.cpu_features!r}, expected one of {list(protocol.CPU_FEATURES)}",
            )


@dataclass(frozen=True)
class SessionSettings(SessionOptions):
    """Everything the session model reads from its config: the bounds, plus what the renderer
    derives from the family spec, plus the CPU twin's own keys.

    Attributes:
        encoder_model / decoder_model: the models called through BLS.
        encoder_inputs: the encoder's input names (the preprocessed float image).
        embedding_names: the encoder outputs the decoder takes (the cached features).
        embedding_bytes: one image's features, as the LRU's byte bound counts them (0: the
            size of the tensors received).
        low_res_logit_limit: kept logits are clipped to +-this (None: unclipped).
        preprocessing: JSON of the family's preprocessing (``intake.preprocessing_json``;
            "" = only preprocessed float images are accepted).
        box_before_points / pad_with_box: the family's point-list prompt layout.
        encoder_identity: CPU twin only: the encoder name image ids are computed with when
            ``encoder_model`` is another copy of it ("" = ``encoder_model``).
        decoder_slots / max_waiting_clicks: CPU twin only: clicks kept at the decoder at once
            (0 = no limit) and waiting for it (``serving/click_queue.py``).
    """

    encoder_model: str = ""
    decoder_model: str = ""
    encoder_inputs: tuple[str, ...] = ()
    embedding_names: tuple[str, ...] = ()
    embedding_bytes: int = 0
    low_res_logit_limit: float | None = None
    preprocessing: str = ""
    box_before_points: bool = False
    pad_with_box: bool = False
    encoder_identity: str = field(default="", metadata=NOT_RENDERED)
    decoder_slots: int = field(default=0, metadata=NOT_RENDERED)
    max_waiting_clicks: int = field(
        default=protocol.DEFAULT_MAX_WAITING_CLICKS, metadata=NOT_RENDERED
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("embedding_bytes", self.embedding_bytes, minimum=0)
        _check_int("decoder_slots", self.decoder_slots, minimum=0)
        _check_int("max_waiting_clicks", self.max_waiting_clicks, minimum=0)

    @classmethod
    def of(cls, options: SessionOptions, **derived: Any) -> SessionSettings:
        """The settings of ``options`` (its bounds) with the fields ``derived`` from a spec."""
        bounds_given = {f.name: getattr(options, f.name) for f in fields(SessionOptions)}
        return cls(**bounds_given, **derived)

    @property
    def identity(self) -> str:
        """The encoder name image ids are computed with."""
        return self.encoder_identity or self.encoder_model


def _check_int(name: str, value: object, *, minimum: int) -> None:
    # bool is an int subclass; `max_images=True` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ParameterError(name, f"got {value!r}, expected an integer >= {minimum}")
