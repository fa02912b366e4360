"""Predictions: the decoder's BLS call on cached features, kept logits, finished masks, and
what an embed or probe answers about the image it holds.

Clicks have their own line (``serving/click_queue.py``): on the CPU twin at most
``decoder_slots`` are at the decoder at once and ``max_waiting_clicks`` wait, and a click
cancelled while it waited is answered unrun; elsewhere the decoder's own batcher does both.
"""

from __future__ import annotations

import numpy as np

from .. import bounds, masks, prompt_frame
from ..click_queue import ClickQueue
from ..protocol import embedding_cache as protocol
from .embedder import preferred_memory

LOGITS_KEY, MASK_INPUT, HAS_MASK_INPUT = (
    protocol.LOGITS_KEY,
    protocol.MASK_INPUT,
    protocol.HAS_MASK_INPUT,
)
MASKS_RLE, MASKS_PNG, MASKS_BITS = protocol.ENCODED_MASK_OUTPUTS
MASK_BOXES, MASK_SCORES, IMAGE_SIZE = protocol.MASK_BOXES, protocol.MASK_SCORES, protocol.IMAGE_SIZE
# Not decoder outputs: answered by the model itself.
OWN_OUTPUTS = (protocol.ENCODED, protocol.IMAGE_ID, LOGITS_KEY, *protocol.FINISHED_OUTPUTS)


class CancelledWhileWaiting(Exception):
    """The click's request was cancelled while it waited for a decoder slot."""


class Predictor:
    """Runs the predictions of one session model instance (on its event loop).

    Args:
        pb_utils: ``triton_python_backend_utils``.
        settings: the model's :class:`~.settings.SessionSettings`.
        cache / metrics: its :class:`~.store.EmbeddingCache` and :class:`~.metrics.Metrics`.
        pre: the family's preprocessing (None: pixel prompts are refused).
        prompt_inputs: the decoder inputs a request may send (not the features).
        mask_dims: ``[1, 1, S, S]`` of the decoder's ``mask_input``, or None when it has none.
    """

    def __init__(self, pb_utils, settings, cache, metrics, *, pre, prompt_inputs, mask_dims):
        self._pb = pb_utils
        self.settings, self.cache, self.metrics = settings, cache, metrics
        self.pre, self.prompt_inputs, self.mask_dims = pre, prompt_inputs, mask_dims
        self.clicks = ClickQueue(settings.decoder_slots, settings.max_waiting_clicks)

    def features(self, scoped):
        """The cached features of ``scoped`` (EmbeddingMiss when absent), counted as a hit."""
        features = self.cache.get(scoped)
        self.metrics.count("hits")
        return features

    def held_outputs(self, entry, wanted):
        """The cached features (outputs named like the encoder's) and the original
        ``image_size`` of ``entry``, those of them ``wanted`` names: what the everything
        model reads back to decode its own prompt batches (serving/everything_model.py)."""
        pb_utils = self._pb
        outputs = []
        names = [n for n in self.settings.embedding_names if n in wanted]
        if names:
            self.metrics.count("hits")
        for name in names:
            value = entry.features[name]
            if not isinstance(value, np.ndarray) and value.is_cpu():
                # the shm store: a view, so the response never owns the cached tensor
                value = value.as_numpy()
            # numpy is copied into the response; a GPU tensor is answered in device
            # memory as it is (no host round trip)
            outputs.append(pb_utils.Tensor(name, value) if isinstance(value, np.ndarray) else value)
        if IMAGE_SIZE in wanted:
            if entry.hw is None:
                raise bounds.RequestError(
                    protocol.IMAGE_ID,
                    "embedded as a preprocessed tensor, whose original size the server does "
                    f"not know; embed it as {protocol.IMAGE_BYTES} or {protocol.IMAGE_RGB}",
                )
            outputs.append(pb_utils.Tensor(IMAGE_SIZE, np.array([entry.hw], np.int32)))
        return outputs

    async def predict(self, inputs, scoped, wanted, clock, given=None):
        """Run the decoder on the cached features and the request's prompt tensors (or
        ``given``: name -> array built here); returns the output tensors asked for."""
        pb_utils = self._pb
        clock.mark("intake")
        feeds = [
            value if not isinstance(value, np.ndarray) else pb_utils.Tensor(name, value)
            for name, value in self.features(scoped).items()
        ]
        names_given = set()
        for name in self.prompt_inputs:
            if given is not None:
                tensor = pb_utils.Tensor(name, given[name]) if name in given else None
            else:
                tensor = inputs.tensor(name)
            if tensor is not None:
                feeds.append(tensor)
                names_given.add(name)
        if self.mask_dims is not None and MASK_INPUT not in names_given:
            feeds += self._mask_feeds(inputs, scoped)
        elif MASK_INPUT in names_given and HAS_MASK_INPUT not in names_given:
            feeds.append(pb_utils.Tensor(HAS_MASK_INPUT, np.ones((1, 1), np.float32)))
        names = [n for n in wanted if n not in OWN_OUTPUTS] or list(protocol.DEFAULT_OUTPUTS)
        response = await self._decode(inputs, feeds, names, clock)
        outputs = [pb_utils.get_output_tensor_by_name(response, n) for n in names]
        if LOGITS_KEY in wanted:
            outputs.append(self._keep_logits(scoped, outputs))
        clock.mark("outputs")
        return [t for t in outputs if t is not None]

    async def _decode(self, inputs, feeds, names, clock):
        """The decoder's BLS response, under a click slot (QueueFull: refused at once)."""
        decoder = self.settings.decoder_model
        waited = await self.clicks.acquire()
        self.metrics.in_flight(self.clicks)
        try:  # the slot goes back whatever happens (a lost one would stall every click)
            if waited and inputs.cancelled():  # a stale click: answered unrun
                raise CancelledWhileWaiting
            bls = self._pb.InferenceRequest(
                model_name=decoder,
                inputs=feeds,
                requested_output_names=names,
                **preferred_memory(self._pb, gpu=False),  # small; kept logits clip on CPU
            )
            clock.mark("feeds")
            response = await bls.async_exec()
        finally:
            self.clicks.release()
            self.metrics.in_flight(self.clicks)
        clock.mark("bls")
        clock.decoded = True
        if response.has_error():
            raise RuntimeError(f"{decoder}: {response.error().message()}")
        return response

    def _keep_logits(self, scoped, outputs):
        """Keep the answer's low-res logits under a key issued here; the ``logits_key``
        output tensor holding it (see protocol/embedding_cache.py)."""
        by_name = {t.name(): t for t in outputs if t is not None}
        low = next((by_name[n] for n in protocol.MASK_OUTPUTS if n in by_name), None)
        if low is None:
            raise bounds.RequestError(
                LOGITS_KEY,
                f"asked for without any of {list(protocol.MASK_OUTPUTS)}: the key names the "
                "low-res logits of the answer, ask for them too",
            )
        key = ""
        if low.is_cpu():
            logits = np.array(low.as_numpy(), dtype=np.float32)
            limit = self.settings.low_res_logit_limit
            if limit is not None:
                np.clip(logits, -limit, limit, out=logits)
            key, evicted = self.cache.keep_logits(scoped, logits)
            self.metrics.count("evictions", len(evicted))
        return self._pb.Tensor(LOGITS_KEY, np.array([[key.encode()]], dtype=np.object_))

    def _mask_feeds(self, inputs, scoped):
        """mask_input from kept logits (previous_key + previous_mask_index), else zeros."""
        key = inputs.string(protocol.PREVIOUS_KEY)
        if key is not None:  # given, even empty: only a key this server issued is found
            index_tensor = inputs.tensor(protocol.PREVIOUS_MASK_INDEX)
            index = 0 if index_tensor is None else int(index_tensor.as_numpy().reshape(-1)[0])
            logits = self.cache.get_logits(scoped, key)
            if not 0 <= index < logits.shape[1]:
                raise bounds.RequestError(
                    protocol.PREVIOUS_MASK_INDEX,
                    f"got {index}, expected 0..{logits.shape[1] - 1}",
                )
            mask = np.ascontiguousarray(logits[:, index : index + 1])
            has = 1.0
        else:
            mask = np.zeros(self.mask_dims, np.float32)
            has = 0.0
        return [
            self._pb.Tensor(MASK_INPUT, mask),
            self._pb.Tensor(HAS_MASK_INPUT, np.full((1, 1), has, np.float32)),
        ]

    async def predict_pixels(self, inputs, scoped, pixel, wanted, clock):
        """Prompts in original pixels -> the decoder -> masks at the original size, encoded."""
        clicks, box, multimask = pixel
        hw = self.cache.original_size(scoped)
        if hw is None or self.pre is None:
            raise bounds.RequestError(
                protocol.POINTS,
                "this image was embedded as a preprocessed tensor, whose original size the "
                f"server does not know; embed it as {protocol.IMAGE_BYTES} or "
                f"{protocol.IMAGE_RGB}",
            )
        given = self._point_list(clicks, box, hw)
        low_name, score_name = (
            ("multimask_masks", "multimask_iou_predictions")
            if multimask
            else ("masks", "iou_predictions")
        )
        names = [low_name, score_name]
        extra = [n for n in wanted if n in protocol.MASK_OUTPUTS and n != low_name]
        if LOGITS_KEY in wanted:
            extra.append(LOGITS_KEY)
        outputs = await self.predict(inputs, scoped, names + extra, clock, given=given)
        by_name = {t.name(): t for t in outputs}
        low = np.asarray(by_name[low_name].as_numpy(), np.float32)
        scores = np.asarray(by_name[score_name].as_numpy(), np.float32).reshape(-1)
        result = [
            t for n, t in by_name.items() if n in wanted and n not in protocol.FINISHED_OUTPUTS
        ]
        finished = self._finished_masks(low, scores, hw, wanted)
        clock.mark("finish")
        return result + [self._pb.Tensor(n, v) for n, v in finished.items()]

    def _point_list(self, clicks, box, hw):
        """The decoder's point_coords / point_labels of pixel prompts, checked in its frame."""
        if clicks is not None:
            frame = prompt_frame.to_input_frame(clicks[0], hw, self.pre)
            bounds.check_pixel_coords(protocol.POINTS, clicks[0], frame)
        if box is not None:
            frame = prompt_frame.to_input_frame(box.reshape(2, 2), hw, self.pre)
            bounds.check_pixel_coords(protocol.BOX, box, frame)
        coords, labels = prompt_frame.point_list(
            clicks,
            box,
            hw,
            self.pre,
            box_before_points=self.settings.box_before_points,
            pad_with_box=self.settings.pad_with_box,
        )
        given = {"point_coords": coords, "point_labels": labels}
        settings = self.settings
        bounds.check_prompts(given, max_points=settings.max_points, max_boxes=settings.max_boxes)
        return given

    def _finished_masks(self, low, scores, hw, wanted):
        """The original-size masks of [1, M, s, s] logits, in the encodings asked for."""
        wanted = set(wanted) or {MASKS_RLE, MASK_BOXES, MASK_SCORES, IMAGE_SIZE}
        encoders = {
            MASKS_RLE: masks.encode_rle,
            MASKS_PNG: masks.encode_png,
            MASKS_BITS: prompt_frame.pack_bits,
        }
        encoded = {n: [] for n in encoders if n in wanted}
        boxes = []
        for i in range(low.shape[1]):  # one mask at a time: H x W float32 each
            mask = prompt_frame.upsample(low[:, i : i + 1], hw, self.pre)[0, 0] > 0
            boxes.append(prompt_frame.mask_box(mask))
            for name in encoded:
                encoded[name].append(encoders[name](mask))
        out = {n: np.array([v], dtype=np.object_) for n, v in encoded.items()}
        out[MASK_BOXES] = np.stack(boxes)[None]
        out[MASK_SCORES] = scores[None]
        out[IMAGE_SIZE] = np.array([hw], np.int32)
        return {n: v for n, v in out.items() if n in wanted}
