"""Segment everything in-process: onnxruntime on the everything-decoder graph, our batching.

The same driver the served ``<family>_everything`` model runs
(:class:`triton_sam.serving.everything.Generator`), with callbacks that run here instead of
over BLS: ``embed`` computes a crop's features (the exported encoder in onnxruntime, or any
callable, e.g. the official predictor's for a test that checks the decoder graph alone),
``decode`` runs the graph in an onnxruntime session. Used by the parity tests and the bench.

Example::

    runner = LocalEverything.from_onnx("sam2", encoder_onnx, decoder_onnx, preprocessing)
    records = runner.generate(rgb, parse_params("sam2", '{"points_per_side": 16}'))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.serving import everything as ev

Features = Mapping[str, np.ndarray]
CropEmbed = Callable[[np.ndarray], Features]  # HxWx3 uint8 crop -> feature name -> [1, ...]


def ort_session(path: Path, *, threads: int = 0) -> Any:
    """An onnxruntime CPU session on ``path`` (``threads`` 0: onnxruntime's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class LocalEverything:
    """Runs :class:`~triton_sam.serving.everything.Generator` with in-process callbacks.

    Args:
        family: ``"sam1"`` or ``"sam2"``.
        decoder: an onnxruntime session on the family's everything-decoder graph.
        embed: crop pixels (HxWx3 uint8) -> the features the graph takes, by name, batch 1.
    """

    def __init__(self, family: str, decoder: Any, embed: CropEmbed) -> None:
        ev.defaults(family)
        self.family = family
        self.decoder = decoder
        self.embed = embed
        self._outputs = list(ev.GRAPH_OUTPUTS)

    @classmethod
    def from_onnx(
        cls, family: str, encoder: Path, decoder: Path, preprocessing: Any, *, threads: int = 0
    ) -> LocalEverything:
        """Encoder and everything-decoder ``.onnx`` files; ``preprocessing`` the spec's."""
        from triton_sam.serving import intake

        enc = ort_session(encoder, threads=threads)
        names = [o.name for o in enc.get_outputs()]
        input_name = enc.get_inputs()[0].name

        def embed(crop: np.ndarray) -> Features:
            x = intake.preprocess(crop, preprocessing)
            return dict(zip(names, enc.run(names, {input_name: x}), strict=True))

        return cls(family, ort_session(decoder, threads=threads), embed)

    def generate(
        self,
        image: np.ndarray,
        params: ev.EverythingParams,
        *,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> list[dict]:
        """COCO records of HxWx3 uint8 ``image`` (the official generators' ``coco_rle`` form)."""
        return self.generator(image, params, progress, cancelled).run(image.shape[:2])

    def instances(self, image: np.ndarray, params: ev.EverythingParams) -> ev.Instances:
        """The instances as columns (run lengths instead of compressed strings)."""
        return self.generator(image, params).instances(image.shape[:2])

    def generator(self, image, params, progress=None, cancelled=None) -> ev.Generator:
        def embed(box: tuple[int, int, int, int]) -> Features:
            x0, y0, x1, y1 = box
            return self.embed(np.ascontiguousarray(image[y0:y1, x0:x1]))

        def decode(features: Features, feeds: dict) -> dict:
            outputs = self.decoder.run(self._outputs, {**features, **feeds})
            return dict(zip(self._outputs, outputs, strict=True))

        return ev.Generator(
            params,
            family=self.family,
            embed=embed,
            decode=decode,
            progress=progress,
            cancelled=cancelled,
        )


def predictor_embed(predictor: Any, family: str) -> CropEmbed:
    """Features from an official predictor (``SamPredictor`` / ``SAM2ImagePredictor``): the
    decoder graph checked alone, on the very features the official generator uses."""

    def embed(crop: np.ndarray) -> Features:
        predictor.set_image(crop)
        if family == "sam1":
            return {"image_embeddings": predictor.features.detach().numpy()}
        feats = predictor._features
        return {
            "image_embed": feats["image_embed"].detach().numpy(),
            "high_res_feats_0": feats["high_res_feats"][0].detach().numpy(),
            "high_res_feats_1": feats["high_res_feats"][1].detach().numpy(),
        }

    return embed
