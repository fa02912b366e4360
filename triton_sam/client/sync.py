"""SAM2TritonClient: encode an image once, then turn prompts into masks, synchronously."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from triton_sam.client import concepts, flow, image_io, startup
from triton_sam.client import everything as everything_client
from triton_sam.client.closing import ClosesOnExit
from triton_sam.client.concept_exemplars import check_exemplars
from triton_sam.client.concept_session import ConceptSession
from triton_sam.client.decode_request import EncodedImage
from triton_sam.client.endpoint import TlsOptions, bearer_headers, resolve_endpoint
from triton_sam.client.everything import EverythingResult
from triton_sam.client.image_session import ImageSession, model_properties
from triton_sam.client.large_opening import OpensLargeImages
from triton_sam.client.prediction import Prediction
from triton_sam.client.retry import RetryPolicy
from triton_sam.client.transport import Transport
from triton_sam.client.wire import SentBytes
from triton_sam.errors import ImageNotSetError, InputValidationError, UnsupportedModelError
from triton_sam.models.registry import get_family, is_concept_family


class SAM2TritonClient(OpensLargeImages, ClosesOnExit):
    """Synchronous client for a SAM encoder/decoder pair served by Triton.

    The image is encoded once by :meth:`set_image`; each :meth:`predict` runs only the
    decoder. Pre- and post-processing reproduce the official predictor of the family.

    Args:
        url: ``host:port``, ``https://host:port`` or ``grpc://host:port`` (a ``grpc://`` or
            ``grpcs://`` URL speaks gRPC whatever ``protocol`` says); defaults to
            ``$TRITON_URL``, else ``localhost:8000`` (HTTP) / ``localhost:8001`` (gRPC).
        model_type: model family: ``"sam2"``, ``"sam1"`` or ``"sam3"`` (the SAM3 tracker,
            exported by triton-sam or imported from onnx-community; the client reads which
            from the server's decoder); ``"sam3_concept"`` for text prompts
            (:meth:`predict_concepts`; the image is sent once, to the ``sam3_concept`` model).
        protocol: ``"http"`` or ``"grpc"``.
        encoder_model / decoder_model: Triton model names; default to the family's
            (``sam2_encoder`` / ``sam2_decoder``, ``sam1_encoder`` / ``sam1_decoder``).
        timeout_s: per-request timeout in seconds.
        retry: backoff for idempotent calls (health, encoder, stateless decoder; never
            calls on server-side state); None uses ``DEFAULT_RETRY``, ``NO_RETRY`` disables it.
        tls: certificates for an ``https://`` server (see docs/deployment.md, "Remote use and TLS").
        token: a bearer token for a server behind the token proxy (``triton-sam proxy config
            --tokens-file``), sent with every request; never logged.
        use_server_embeddings: keep each image's features on the server (the
            ``<family>_session`` model): ``set_image`` sends the image once, a click sends
            the image id and its prompts (a few hundred bytes instead of 4-21 MiB). None
            (default) uses it when the server offers it; False forces the stateless decoder.
            A click on an image the server lost (evicted, restarted) re-embeds it and retries
            once, transparently.
        session_model: Triton name of the session model (default ``<family>_session``).

    Raises:
        UnsupportedModelError: unknown ``model_type``.
        ServerUnavailableError: server not reachable, or a model not ready.

    Threads may share a client (each gets its own connection); :meth:`set_image` changes
    the image for all of them, so use one client per image stream.

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
        retry: RetryPolicy | None = None,
        tls: TlsOptions | None = None,
        session_model: str | None = None,
        use_server_embeddings: bool | None = None,
        token: str | None = None,
    ) -> None:
        family = get_family(model_type)
        # Concept families (text prompts) are served by one model that keeps the features.
        self._concepts = is_concept_family(family)
        default_session = family.serving_model if self._concepts else family.session_model
        self._core = ImageSession(
            model_type,
            encoder_model=encoder_model,
            decoder_model=decoder_model,
            session_model=session_model or default_session,
        )
        self.uses_server_embeddings = self._concepts
        self.last_timings_ms: dict[str, float] = {}
        self._sent = SentBytes()  # the transport's byte counter, read after each call
        self._transport = Transport(
            resolve_endpoint(url, protocol),
            timeout_s=timeout_s,
            retry=retry,
            tls=tls,
            headers=bearer_headers(token),
            on_request=self._sent,
        )
        self._concept = ConceptSession(self._transport, self.session_model)
        try:
            if self._concepts:
                steps = startup.check_ready(self._transport.endpoint, (self.session_model,))
            else:
                steps = self._core.connect(self._transport.endpoint, use_server_embeddings)
            flow.run(steps, flow.sender(self._transport))
        except BaseException:
            self.close()
            raise
        self.uses_server_embeddings = self._concepts or self._core.uses_server_embeddings

    # The models, as the core resolved them against the server.
    family, model_type, encoder_model, decoder_model, session_model = model_properties("_core")[:5]

    @property
    def last_request_bytes(self) -> int:
        """Bytes of the last inference request sent (the serialised request, or its tensor
        bytes above 1 MiB: ``wire.request_bytes``); 0 before any."""
        return self._sent.last

    # -- lifecycle -------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._transport.close()

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
        if self._concepts:
            self._concept.set_image(image_io.load_image(image))
            self.last_timings_ms = self._concept.last_timings_ms
            return
        timings: dict[str, float] = {}
        steps = self._core.load(image)
        self._core.image = flow.run(steps, flow.sender(self._transport, timings))
        self.last_timings_ms = timings

    def reset_image(self) -> None:
        """Forget the current image and its embeddings."""
        self._core.image = None
        self._concept.image = None

    @property
    def _image(self) -> EncodedImage | None:
        return self._core.image

    @property
    def is_image_set(self) -> bool:
        """True once :meth:`set_image` has succeeded."""
        return self._image is not None or self._concept.image is not None

    @property
    def original_size(self) -> tuple[int, int]:
        """(H, W) of the current image."""
        self._require_image()
        image = self._image or self._concept.image
        assert image is not None
        return image.orig_hw

    def get_image_embedding(self) -> dict[str, np.ndarray]:
        """The current image's encoder outputs by name (e.g. ``image_embed`` [1,256,64,64]).

        With server-side embeddings the features live on the server: the first call runs the
        stateless encoder once to fetch them (and keeps them for later calls).
        """
        self._require_image()
        image = self._image
        assert image is not None
        if not image.features and image.cached is not None:
            assert image.cached.rgb is not None
            steps = self._core.encode(image.cached.rgb)
            image.features.update(flow.run(steps, flow.sender(self._transport)).features)
        return dict(image.features)

    def _require_image(self) -> None:
        if not self.is_image_set:
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
        if self._concepts:
            raise UnsupportedModelError(
                f"model_type: {self.model_type!r} segments concepts from text prompts; call "
                "predict_concepts(text=...) (points and boxes: model_type='sam3')"
            )
        self._require_image()
        assert self._image is not None
        prompt = (point_coords, point_labels, box, mask_input, multimask_output)
        request = self._core.request(self._image, *prompt)
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        prediction = flow.run(self._core.predict(request), flow.sender(self._transport, timings))
        total = (time.perf_counter() - t0) * 1e3
        timings["postprocess"] = max(0.0, total - sum(timings.values()))
        self.last_timings_ms = timings
        return prediction

    # -- segment everything ------------------------------------------------------------
    def generate_masks(
        self,
        image: Any = None,
        *,
        progress: Callable[[int, int], Any] | None = None,
        grpc_url: str | None = None,
        job_timeout_s: float | None = None,
        **params: Any,
    ) -> EverythingResult:
        """Every instance in an image, as the official automatic mask generator gives them
        (``output_mode="coco_rle"``), computed by the server's ``<family>_everything`` model.

        Args:
            image: a path (its bytes are sent), a PIL image or an HxWx3 uint8 array; None
                uses the image of :meth:`set_image` (its id when the server keeps it: the
                features are not computed again).
            progress: called ``(done_batches, total_batches)`` as the server works; raising
                from it (or Ctrl-C) cancels the job on the server.
            grpc_url: the server's gRPC address (the job streams over gRPC); default: this
                client's when it speaks gRPC, else port 8001 beside an HTTP port 8000.
            job_timeout_s: give up (and cancel the job) after this long; None waits.
            **params: the official generator's parameters (``points_per_side=32``,
                ``pred_iou_thresh``, ``crop_n_layers``...), checked before anything is sent.

        Returns:
            An :class:`~triton_sam.client.everything.EverythingResult`.

        Raises:
            UnsupportedModelError: a family without a segment-everything model (SAM3).
            InputValidationError: a bad parameter (named ``params.<key>``) or image.
            ImageNotSetError: no image given and none set.
            InvalidRequestError / ServerOverloadedError / ServerError: the server's answer.
        """
        model, params_json, endpoint = everything_client.job_target(
            self.family,
            self.model_type,
            self.session_model,
            params,
            self._transport.endpoint,
            grpc_url,
        )

        def run(inputs: dict[str, np.ndarray]) -> EverythingResult:
            return everything_client.generate(
                endpoint,
                model,
                inputs,
                progress=progress,
                timeout_s=job_timeout_s,
                tls=self._transport.tls,
                headers=self._transport.headers or None,
            )

        if image is None:
            self._require_image()
        cached = None if self._image is None else self._image.cached
        first, fallback = everything_client.job_requests(image, cached, params_json)
        return everything_client.with_fallback(run, first, fallback)

    # -- concept segmentation (text and exemplar prompts; model_type="sam3_concept") -------
    def predict_concepts(
        self,
        text: str | Sequence[str] | None = None,
        *,
        boxes: Any = None,
        box_labels: Any = None,
        exemplar_ids: Sequence[str] | None = None,
        threshold: float = concepts.protocol.DEFAULT_THRESHOLD,
        mask_threshold: float = concepts.protocol.DEFAULT_MASK_THRESHOLD,
        max_instances: int | None = None,
        mask_format: str = "rle",
    ) -> concepts.ConceptPrediction:
        """Every instance of each prompt in the current image, as ``Sam3Processor``'s
        ``post_process_instance_segmentation`` gives them.

        A prompt is a phrase, followed by the call's exemplars when it has any; exemplars
        without a phrase make one prompt (``Sam3Processor``'s phrase ``"visual"``).

        Args:
            text: a noun phrase ("red car") or several (one call, one decoder pass each), or
                None with exemplars alone.
            boxes: [G, 4] (x0, y0, x1, y1) in pixels of the current image, each around an
                example of the concept; encoded on this image and kept by the server under
                the prediction's ``exemplar_id``.
            box_labels: [G] 1 (example) or 0 (counter-example); default all 1.
            exemplar_ids: ``exemplar_id`` values of earlier calls (any image, this tenant):
                their exemplars applied to this image without resending theirs.
            threshold: keep instances whose score (sigmoid(logit) x presence) exceeds it.
            mask_threshold: binarise mask probabilities (after resizing) above it.
            max_instances: at most this many instances per prompt, the best scores
                (default: all that pass the threshold, up to the model's 200 queries).
            mask_format: how masks travel: ``"rle"`` (COCO RLE, decoded here), ``"png"``,
                ``"logits"`` (288x288 low-res logits, not resized) or ``"none"``.

        Returns:
            A :class:`~triton_sam.client.concepts.ConceptPrediction` (boxes in pixels of the
            original image; masks bool [K, H, W] for "rle"/"png"; ``exemplar_id`` with boxes).

        Raises:
            UnsupportedModelError: the client's family takes points and boxes, not text.
            ImageNotSetError: no image set.
            InputValidationError: bad phrases, boxes or options (named: ``boxes[1]``...),
                before anything is sent.
            InvalidRequestError: the server refused the request (e.g. a phrase of more than
                32 tokens); the message names the field.
            EmbeddingNotFoundError: an ``exemplar_ids`` entry the server does not hold (never
                answered to this tenant, evicted, or the server restarted).
        """
        if not self._concepts:
            raise UnsupportedModelError(
                f"model_type: {self.model_type!r} takes points and boxes; text prompts need "
                "model_type='sam3_concept'"
            )
        phrases = [] if text is None else concepts.check_phrases(text)
        concepts.check_options(threshold, mask_threshold, max_instances, mask_format)
        self._require_image()
        exemplars = check_exemplars(boxes, box_labels, exemplar_ids, self._concept.image.orig_hw)
        if not phrases and not exemplars:
            raise InputValidationError(
                "text", "got no phrase, boxes or exemplar_ids; expected at least one prompt"
            )
        options = {"threshold": threshold, "mask_threshold": mask_threshold}
        options["max_instances"] = max_instances
        options["exemplars"] = exemplars
        prediction = self._concept.predict(phrases, options, mask_format)
        self.last_timings_ms = self._concept.last_timings_ms
        return prediction
