"""The ways a user can segment an image, each behind one small interface the benchmark times.

A *path* is what a user would pick: the official predictor in their process, onnxruntime in
their process on our ONNX files, or our client against a server (session model or stateless
decoder, HTTP or gRPC). Each path answers four operations, as a user calls them:

- ``encode``: an RGB image (HxWx3 uint8) in, features ready for clicks out (preprocessing
  included; on the session path the features stay on the server);
- ``click``: one foreground point, (X, Y) pixels of the original image -> mask logits at the
  original size (postprocessing included);
- ``box``: one box [x0, y0, x1, y1] -> mask logits at the original size;
- ``refine``: the click again with the previous mask's low-res logits as ``mask_input``
  (chained: each refinement feeds the next). The session client sends it as a reference to
  the logits the server kept, not 256 KiB of mask.

One :class:`Path` object serves one caller (thread): it keeps that caller's current image
and its last low-res mask. :meth:`Path.request_bytes` says what the last call sent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path as FilePath
from typing import Any, Protocol

import numpy as np

from triton_sam.client import model_frame, prompts
from triton_sam.client.prediction import make_prediction
from triton_sam.models.spec import FamilySpec, ModelSpec

OPERATIONS = ("encode", "click", "box", "refine")


def click_of(hw: tuple[int, int]) -> list[list[float]]:
    """The benchmark's click: a third across, half down, (X, Y) pixels of an (H, W) image."""
    return [[hw[1] / 3, hw[0] / 2]]


def box_of(hw: tuple[int, int]) -> list[float]:
    """The benchmark's box, [x0, y0, x1, y1] pixels of an (H, W) image."""
    return [hw[1] * 0.2, hw[0] * 0.25, hw[1] * 0.6, hw[0] * 0.75]


class Path(Protocol):
    """One caller's view of a serving path (see the module docstring)."""

    def encode(self, rgb: np.ndarray) -> None: ...
    def click(self) -> np.ndarray: ...
    def box(self) -> np.ndarray: ...
    def refine(self) -> np.ndarray: ...
    def request_bytes(self) -> int: ...
    def close(self) -> None: ...


class ClientPath:
    """``SAM2TritonClient`` against a server: the session model (``session=True``, the
    client's default when the server offers it) or the stateless decoder."""

    def __init__(self, url: str, protocol: str, family: str, *, session: bool) -> None:
        from triton_sam.client import SAM2TritonClient

        self.client = SAM2TritonClient(
            url, model_type=family, protocol=protocol, use_server_embeddings=session
        )
        if self.client.uses_server_embeddings != session:
            raise RuntimeError(f"{url}: the server does not offer the session model")
        self._hw = (0, 0)
        self._mask: np.ndarray | None = None

    def encode(self, rgb: np.ndarray) -> None:
        self.client.set_image(rgb)
        self._hw = (int(rgb.shape[0]), int(rgb.shape[1]))
        self._mask = None

    def click(self) -> np.ndarray:
        return self._keep(self.client.predict_full(click_of(self._hw), [1]))

    def box(self) -> np.ndarray:
        return self.client.predict_full(box=box_of(self._hw)).masks

    def refine(self) -> np.ndarray:
        if self._mask is None:
            self.click()
        return self._keep(self.client.predict_full(click_of(self._hw), [1], mask_input=self._mask))

    def request_bytes(self) -> int:
        return int(self.client.last_request_bytes)

    def close(self) -> None:
        self.client.close()

    def _keep(self, prediction: Any) -> np.ndarray:
        # The exact logits array the client remembered: the next refine names it by reference.
        self._mask = prediction.low_res_logits[0, 0]
        return prediction.masks


class OrtPath:
    """onnxruntime in this process on the repository's own ONNX files, as a user would call
    it: preprocess + encoder; prompts + decoder + the same postprocessing as the client.

    ``sessions`` (encoder, decoder) are shared by every caller: one ORT session serves
    concurrent ``run`` calls, as a user's threads would share it.
    """

    def __init__(self, sessions: tuple[Any, Any], family: FamilySpec) -> None:
        self.encoder, self.decoder = sessions
        self.family = family
        self._features: dict[str, np.ndarray] = {}
        self._hw = (0, 0)
        self._mask: np.ndarray | None = None

    def encode(self, rgb: np.ndarray) -> None:
        tensor = model_frame.preprocess(rgb, self.family.preprocessing)
        names = list(self.family.embedding_names)
        values = self.encoder.run(names, {self.family.encoder_inputs[0].name: tensor})
        self._features = dict(zip(names, values, strict=True))
        self._hw = (int(rgb.shape[0]), int(rgb.shape[1]))
        self._mask = None

    def click(self) -> np.ndarray:
        return self._decode(click_of(self._hw), [1], None, None, keep=True)

    def box(self) -> np.ndarray:
        return self._decode(None, None, box_of(self._hw), None, keep=False)

    def refine(self) -> np.ndarray:
        if self._mask is None:
            self.click()
        return self._decode(click_of(self._hw), [1], None, self._mask, keep=True)

    def request_bytes(self) -> int:
        return 0  # in process: nothing crosses a wire

    def close(self) -> None:
        pass

    def _decode(self, points: Any, labels: Any, box: Any, mask: Any, *, keep: bool) -> np.ndarray:
        inputs = {
            **self._features,
            **prompts.build_decoder_prompts(
                point_coords=points,
                point_labels=labels,
                box=box,
                mask_input=mask,
                orig_hw=self._hw,
                family=self.family,
            ),
        }
        names = list(prompts.output_names(False, self.family))
        out = dict(zip(names, self.decoder.run(names, inputs), strict=True))
        low_res, scores = prompts.select_outputs(out, False, self.family)
        prediction = make_prediction(low_res, scores, self._hw, self.family.preprocessing)
        if keep:
            self._mask = prediction.low_res_logits[0, 0]
        return prediction.masks


def ort_sessions(repository: FilePath, family: FamilySpec) -> tuple[Any, Any]:
    """(encoder, decoder) onnxruntime CPU sessions on ``repository``'s ONNX files, with
    onnxruntime's defaults (what a user gets): every core, all graph optimisations."""
    import onnxruntime as ort

    def session(model: str) -> Any:
        # Embedded twins symlink to the production repository's files.
        path = (repository / model / "1" / "model.onnx").resolve()
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    return session(family.encoder_model), session(family.decoder_model)


class OfficialPath:
    """The family's official predictor in this process (PyTorch on CPU): ``SamPredictor``
    (SAM1), ``SAM2ImagePredictor`` (SAM2.1), transformers' ``Sam3TrackerModel`` with
    ``Sam3TrackerProcessor`` (SAM3 tracker), on the checkpoint the ONNX files came from.

    ``predict`` returns the predictor's own result at the original size; single-mask output.
    """

    def __init__(self, spec: ModelSpec, checkpoint: FilePath) -> None:
        import torch

        self._torch = torch
        self.family = spec.family.family
        self._hw = (0, 0)
        self._mask: np.ndarray | None = None
        if self.family == "sam3":
            self._sam3 = _Sam3Predictor(checkpoint)
            self._set_image: Callable[[np.ndarray], None] = self._sam3.set_image
            self._predict: Callable[..., tuple[Any, Any, Any]] = self._sam3.predict
            return
        if self.family == "sam1":
            from segment_anything import SamPredictor

            from triton_sam.export.sam1 import build_model

            predictor: Any = SamPredictor(build_model(spec, checkpoint))
        elif self.family == "sam2":
            from sam2.sam2_image_predictor import SAM2ImagePredictor

            from triton_sam.export.sam2 import build_model as build_sam2

            predictor = SAM2ImagePredictor(build_sam2(spec, checkpoint))
        else:
            raise ValueError(f"family {self.family!r}: no official image predictor")
        self._set_image = predictor.set_image
        self._predict = lambda **kw: predictor.predict(multimask_output=False, **kw)

    def encode(self, rgb: np.ndarray) -> None:
        with self._torch.inference_mode():
            self._set_image(rgb)
        self._hw = (int(rgb.shape[0]), int(rgb.shape[1]))
        self._mask = None

    def click(self) -> np.ndarray:
        return self._run(point_coords=np.array(click_of(self._hw)), point_labels=np.array([1]))

    def box(self) -> np.ndarray:
        with self._torch.inference_mode():
            return self._predict(box=np.array(box_of(self._hw)))[0]

    def refine(self) -> np.ndarray:
        if self._mask is None:
            self.click()
        return self._run(
            point_coords=np.array(click_of(self._hw)),
            point_labels=np.array([1]),
            mask_input=self._mask,
        )

    def request_bytes(self) -> int:
        return 0  # in process: nothing crosses a wire

    def close(self) -> None:
        pass

    def _run(self, **kw: Any) -> np.ndarray:
        with self._torch.inference_mode():
            masks, _, low_res = self._predict(**kw)
        self._mask = np.asarray(low_res)[:1]  # [1, 256, 256]: the predictors' mask_input
        return masks


class _Sam3Predictor:
    """transformers' flow for the SAM3 tracker, as its documentation shows it: processor ->
    ``get_image_embeddings`` once per image -> ``model(...)`` per prompt ->
    ``processor.post_process_masks``."""

    def __init__(self, checkpoint: FilePath) -> None:
        from transformers import Sam3TrackerModel, Sam3TrackerProcessor
        from transformers.models.sam3.image_processing_sam3 import Sam3ImageProcessor

        self.model = Sam3TrackerModel.from_pretrained(checkpoint).eval()
        self.processor = Sam3TrackerProcessor(image_processor=Sam3ImageProcessor())
        self.sizes: Any = None
        self.embeddings: Any = None

    def set_image(self, rgb: np.ndarray) -> None:
        inputs = self.processor(images=rgb, return_tensors="pt")
        self.sizes = inputs["original_sizes"]
        self.embeddings = self.model.get_image_embeddings(inputs["pixel_values"])

    def predict(self, **prompt: np.ndarray) -> tuple[Any, Any, Any]:
        """The official predictors' ``predict`` keywords (``point_coords`` with
        ``point_labels``, ``box``, ``mask_input``), as ``_run`` passes them to either."""
        import torch

        kw: dict[str, Any] = {}
        if "point_coords" in prompt:
            points, labels = prompt["point_coords"], prompt["point_labels"]
            kw.update(input_points=[[points.tolist()]], input_labels=[[labels.tolist()]])
        if "box" in prompt:
            kw.update(input_boxes=[[prompt["box"].tolist()]])
        mask_input = prompt.get("mask_input")
        inputs = self.processor(original_sizes=self.sizes, return_tensors="pt", **kw)
        out = self.model(
            image_embeddings=self.embeddings,
            input_points=inputs.get("input_points"),
            input_labels=inputs.get("input_labels"),
            input_boxes=inputs.get("input_boxes"),
            input_masks=None if mask_input is None else torch.as_tensor(mask_input)[None],
            multimask_output=False,
        )
        low_res = out.pred_masks[:, 0]  # [1, 1, 288, 288]: point batch 0
        masks = self.processor.post_process_masks([low_res], self.sizes, binarize=False)[0]
        return masks[0].numpy(), out.iou_scores[0, 0].numpy(), low_res[0].numpy()
