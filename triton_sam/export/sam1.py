"""SAM1 exporter: the official ``segment_anything`` model split into an ONNX encoder and decoder.

The wrappers reproduce ``SamPredictor`` exactly:

- encoder = ``set_torch_image`` after ``Sam.preprocess`` (which the client does): the
  official ``image_encoder`` on the normalised, zero-padded 1024x1024 image.
- decoder = ``predict_torch`` without the upsampling (the client upsamples): prompts embedded
  by the official ONNX helper ``SamOnnxModel`` (clicks 0/1, padding -1, box corners 2/3 as
  points, ``has_mask_input`` as arithmetic instead of a branch), then the official
  ``MaskDecoder.predict_masks``; token 0 is the single mask, tokens 1-3 the multimask output
  (``MaskDecoder.forward``'s selection; see ``triton_sam.models.sam1`` for why not the ONNX
  export's rule).

``segment_anything``'s package ``__init__`` imports torchvision (for the automatic mask
generator); building and exporting the model does not use it, but it must be importable.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from triton_sam.errors import CheckpointError, ConfigError
from triton_sam.export.weights import Structure, load_checkpoint_file, load_state, meta_structure
from triton_sam.models.spec import ModelSpec


def build_model(spec: ModelSpec, checkpoint: Path | None) -> nn.Module:
    """Build the official SAM1 model for ``spec`` (``sam_model_registry[upstream_config]``).

    The registry builder runs with ``checkpoint=None`` (it would ``torch.load`` without
    ``weights_only``); the state dict is loaded here with ``weights_only=True``.

    Args:
        spec: a SAM1 variant (``upstream_config`` is ``"vit_b"``, ``"vit_l"`` or ``"vit_h"``).
        checkpoint: an official-format checkpoint (a plain state dict, like
            ``sam_vit_b_01ec64.pth``), or None for the random initialisation.

    Raises:
        ConfigError: ``upstream_config`` is not a key of ``sam_model_registry``.
        CheckpointError: unreadable checkpoint, or keys that do not match the config.
    """
    from segment_anything import sam_model_registry

    builder = sam_model_registry.get(spec.upstream_config)
    if builder is None:
        raise ConfigError(
            f"upstream_config: {spec.upstream_config!r} is not a SAM1 model type; expected "
            f"one of {sorted(sam_model_registry)}"
        )
    model = builder(checkpoint=None)
    if checkpoint is not None:
        _load_state(model, checkpoint, spec)
    return model.eval()


def structure(spec: ModelSpec) -> Structure:
    """``key -> shape`` of the variant's state dict, from a meta build (no weights allocated)."""
    from segment_anything import sam_model_registry

    return meta_structure(lambda: sam_model_registry[spec.upstream_config](checkpoint=None))


def _load_state(model: nn.Module, checkpoint: Path, spec: ModelSpec) -> None:
    state = load_checkpoint_file(checkpoint)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(
            f"checkpoint: {checkpoint} is not an official SAM1 checkpoint "
            "(expected a plain state dict of tensors, like sam_vit_b_01ec64.pth)"
        )
    load_state(model, state, checkpoint, spec, sibling_structure=structure)


def save_random_checkpoint(spec: ModelSpec, path: Path, *, seed: int = 0) -> Path:
    """Write a random-init checkpoint of ``spec`` in the official format (for offline tests).

    The weights are the official builder's own initialisation under ``torch.manual_seed(seed)``,
    saved as a plain state dict like the published ``.pth`` files.
    """
    torch.manual_seed(seed)
    model = build_model(spec, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(path)
    return path


class SAM1Encoder(nn.Module):
    """image [B,3,1024,1024] (normalised, zero-padded) -> image_embeddings [B,256,64,64]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.image_encoder = model.image_encoder

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.image_encoder(image),)


class _OneEmbeddingPerPromptSet(TorchFunctionMode):
    """Inside ``MaskDecoder.predict_masks``, pair prompt set i with image embedding i.

    Upstream expands ONE image embedding to all prompt sets of a call with
    ``torch.repeat_interleave(image_embeddings, n_prompt_sets, dim=0)``. A Triton batch holds
    one embedding per request, already aligned with that request's prompts (what SAM2 calls
    ``repeat_image=False``), so exactly that call, on exactly that tensor, becomes the
    identity; everything else runs, and traces, as upstream. At batch 1 both are the same.
    """

    def __init__(self, image_embeddings: torch.Tensor) -> None:
        super().__init__()
        self.image_embeddings = image_embeddings

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.repeat_interleave and args and args[0] is self.image_embeddings:
            return self.image_embeddings
        return func(*args, **(kwargs or {}))


class SAM1Decoder(nn.Module):
    """Embeddings + prompts -> SamPredictor's single-mask and multimask low-res logits, scores.

    Inputs (B = Triton batch, N = points incl. box corners and the padding point):
        image_embeddings [B,256,64,64], point_coords [B,N,2] float32 (X, Y) in the 1024x1024
        input frame, point_labels [B,N] float32 in {-1, 0, 1, 2, 3}, mask_input
        [B,1,256,256] low-res logits, has_mask_input [B,1] in {0, 1}.

    Outputs: masks [B,1,256,256] + iou_predictions [B,1] (token 0), multimask_masks
    [B,3,256,256] + multimask_iou_predictions [B,3] (tokens 1-3).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from segment_anything.utils.onnx import SamOnnxModel

        # Only its traceable prompt embedding is used; selection and upsampling are not.
        self.prompts = SamOnnxModel(model, return_single_mask=False)
        self.prompt_encoder = model.prompt_encoder
        self.mask_decoder = model.mask_decoder

    def forward(
        self,
        image_embeddings: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mask_input: torch.Tensor,
        has_mask_input: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        sparse = self.prompts._embed_points(point_coords, point_labels)
        # SamOnnxModel takes has_mask_input as [1]; per batch item it must broadcast as
        # [B,1,1,1] against the [B,256,64,64] dense embedding.
        dense = self.prompts._embed_masks(mask_input, has_mask_input.reshape(-1, 1, 1, 1))
        with _OneEmbeddingPerPromptSet(image_embeddings):
            masks, iou = self.mask_decoder.predict_masks(
                image_embeddings=image_embeddings,
                image_pe=self.prompt_encoder.get_dense_pe(),
                sparse_prompt_embeddings=sparse,
                dense_prompt_embeddings=dense,
            )
        return masks[:, 0:1], iou[:, 0:1], masks[:, 1:], iou[:, 1:]


def wrap_encoder(model: nn.Module) -> nn.Module:
    """The ONNX-exportable encoder of a built SAM1 model."""
    return SAM1Encoder(model).eval()


def wrap_decoder(model: nn.Module) -> nn.Module:
    """The ONNX-exportable decoder of a built SAM1 model."""
    return SAM1Decoder(model).eval()
