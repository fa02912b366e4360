"""SAM2TritonClient: encode an image once, then turn prompts into masks, synchronously."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from triton_sam import transforms
from triton_sam.client import prompts
from triton_sam.client.prediction import Prediction, make_prediction
from triton_sam.client.transport import Transport, resolve_endpoint
from triton_sam.errors import ImageNotSetError, ServerUnavailableError
from triton_sam.models.registry import get_family
from triton_sam.models.spec import FamilySpec


class SAM2TritonClient:
    """Synchronous client for a SAM encoder/decoder pair served by Triton.

    The image is encoded once by :meth:`set_image`; each :meth:`predict` runs only the
    decoder. Pre- and post-processing reproduce the official predictor of the family.

    Args:
        url: ``host:port`` or ``https://host:port``; defaults to ``$TRITON_URL``, else
            ``localhost:8000`` (HTTP) / ``localhost:8001`` (gRPC).
        model_type: model family: ``"sam2"`` or ``"sam1"`` (``"sam3"`` when it is added).
        protocol: ``"http"`` or ``"grpc"``.
        encoder_model / decoder_model: Triton model names; default to the family's
            (``sam2_encoder`` / ``sam2_decoder``, ``sam1_encoder`` / ``sam1_decoder``).
        timeout_s: per-request timeout in seconds.

    Raises:
        UnsupportedModelError: unknown ``model_type``.
        ServerUnavailableError: server not reachable, or a model not ready.

    Example:
        >>> client = SAM2TritonClient("localhost:8000", model_type="sam2")
        >>> client.set_image("image.jpg")
        >>> masks, iou = client.predict(point_coords=[[512, 512]], point_labels=[1])
        >>> binary = masks[0, 0] > 0
    """

    def __init__(
        self,
        url: str | None = None,
        model_type: str = "sam2",
        protocol: str = "http",
        *,
        encoder_model: str | None = None,
        decoder_model: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.family: FamilySpec = get_family(model_type)
        self.model_type = model_type
        self.encoder_model = encoder_model or self.family.encoder_model
        self.decoder_model = decoder_model or self.family.decoder_model
        self._transport = Transport(resolve_endpoint(url, protocol), timeout_s=timeout_s)
        self._features: dict[str, np.ndarray] | None = None
        self._orig_hw: tuple[int, int] | None = None
        self.last_request_bytes = 0
        self.last_timings_ms: dict[str, float] = {}
        try:
            self._check_ready()
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------
    def _check_ready(self) -> None:
        address = self._transport.endpoint.address
        if not self._transport.is_server_ready():
            raise ServerUnavailableError(
                f"url: no ready Triton server at {address} "
                f"({self._transport.endpoint.protocol}); start one with `triton-sam serve` "
                "or `docker compose up -d`, or set TRITON_URL"
            )
        for model in (self.encoder_model, self.decoder_model):
            if not self._transport.is_model_ready(model):
                raise ServerUnavailableError(
                    f"model: {model!r} is not ready on {address}; export it with "
                    f"`triton-sam setup` and check the server log"
                )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._transport.close()

    def __enter__(self) -> SAM2TritonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- encoding --------------------------------------------------------------------
    def set_image(self, image: Any) -> None:
        """Encode an image on the server and keep its embeddings for later predictions.

        Args:
            image: a path, a PIL image, or an HxWx3 uint8 RGB array.

        Raises:
            InputValidationError: the image cannot be read or has the wrong shape/dtype.
            ServerError: the encoder failed.
        """
        self.reset_image()
        rgb = transforms.load_image(image)
        t0 = time.perf_counter()
        tensor = transforms.preprocess(rgb, self.family.preprocessing)
        t1 = time.perf_counter()
        name = self.family.encoder_inputs[0].name
        self._features = self._transport.infer(
            self.encoder_model, {name: tensor}, self.family.embedding_names
        )
        t2 = time.perf_counter()
        self._orig_hw = (int(rgb.shape[0]), int(rgb.shape[1]))
        self.last_request_bytes = tensor.nbytes
        self.last_timings_ms = {"preprocess": (t1 - t0) * 1e3, "encode": (t2 - t1) * 1e3}

    def reset_image(self) -> None:
        """Forget the current image and its embeddings."""
        self._features = None
        self._orig_hw = None

    @property
    def is_image_set(self) -> bool:
        """True once :meth:`set_image` has succeeded."""
        return self._features is not None

    @property
    def original_size(self) -> tuple[int, int]:
        """(H, W) of the current image."""
        self._require_image()
        assert self._orig_hw is not None
        return self._orig_hw

    def get_image_embedding(self) -> dict[str, np.ndarray]:
        """The current image's encoder outputs by name (e.g. ``image_embed`` [1,256,64,64])."""
        self._require_image()
        assert self._features is not None
        return dict(self._features)

    def _require_image(self) -> None:
        if self._features is None:
            raise ImageNotSetError("an image must be set with set_image(...) before predict")

    # -- decoding --------------------------------------------------------------------
    def predict(
        self,
        point_coords: Any = None,
        point_labels: Any = None,
        box: Any = None,
        mask_input: Any = None,
        multimask_output: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Predict masks for prompts on the current image.

        Args:
            point_coords: Nx2 clicks as (X, Y) pixels of the original image.
            point_labels: N labels, 1 = foreground, 0 = background.
            box: [x0, y0, x1, y1] in pixels of the original image.
            mask_input: 256x256 low-res logits from a previous prediction
                (``predict_full(...).low_res_logits[0, i]``) to refine.
            multimask_output: three candidate masks instead of one.

        Returns:
            ``(masks, iou_predictions)``: float32 logits [1, M, H, W] at the original size
            (threshold at 0) and float32 scores [1, M]; M = 3 with multimask output, else 1.

        Raises:
            ImageNotSetError: no image set.
            InputValidationError: a prompt has the wrong shape, values or range.
            ServerError: the decoder failed.
        """
        result = self.predict_full(
            point_coords=point_coords,
            point_labels=point_labels,
            box=box,
            mask_input=mask_input,
            multimask_output=multimask_output,
        )
        return result.masks, result.iou_predictions

    def predict_full(
        self,
        point_coords: Any = None,
        point_labels: Any = None,
        box: Any = None,
        mask_input: Any = None,
        multimask_output: bool = False,
    ) -> Prediction:
        """Like :meth:`predict`, returning a :class:`Prediction` that also holds the
        low-resolution logits to pass back as ``mask_input``."""
        self._require_image()
        assert self._features is not None and self._orig_hw is not None
        pre = self.family.preprocessing
        mask_name, score_name = prompts.output_names(multimask_output)
        inputs = {
            **self._features,
            **prompts.build_decoder_prompts(
                point_coords=point_coords,
                point_labels=point_labels,
                box=box,
                mask_input=mask_input,
                orig_hw=self._orig_hw,
                family=self.family,
            ),
        }
        t0 = time.perf_counter()
        out = self._transport.infer(self.decoder_model, inputs, (mask_name, score_name))
        t1 = time.perf_counter()
        prediction = make_prediction(out[mask_name], out[score_name], self._orig_hw, pre)
        t2 = time.perf_counter()
        self.last_request_bytes = sum(a.nbytes for a in inputs.values())
        self.last_timings_ms = {"decode": (t1 - t0) * 1e3, "postprocess": (t2 - t1) * 1e3}
        return prediction
