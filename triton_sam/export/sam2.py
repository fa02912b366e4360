"""SAM2.1 exporter: the official ``sam2`` model split into an ONNX encoder and decoder.

The wrappers reproduce ``SAM2ImagePredictor`` exactly:

- encoder = ``set_image``: ``forward_image`` (which already applies ``conv_s0``/``conv_s1``
  to the two high-resolution levels), ``no_mem_embed`` added to the lowest-resolution level,
  features reshaped to NCHW.
- decoder = ``_predict``: points embedded by the official prompt encoder (the client places
  box corners labelled 2/3 first, then clicks, then the padding point labelled -1, as the
  predictor does), the official mask decoder with the high-resolution features, and both
  output selections (single mask with dynamic multimask via stability; multimask = tokens 1-3).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from triton_sam.errors import CheckpointError, ExportError
from triton_sam.export.weights import Structure, load_checkpoint_file, load_state, structure_of
from triton_sam.export.wrapper import ModelWrapper
from triton_sam.models.spec import ModelSpec


@contextmanager
def _sam2_hydra():
    """Point hydra's global state at the sam2 package's configs for the duration of a build.

    ``sam2/__init__`` initialises hydra globally at import; our own CLI composes its configs
    in a scoped context, so we reset to sam2's module here and clean up afterwards.
    """
    import sam2  # noqa: F401  (registers its config module)
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    initialize_config_module("sam2", version_base="1.2")
    try:
        yield
    finally:
        GlobalHydra.instance().clear()


def build_model(spec: ModelSpec, checkpoint: Path | None) -> nn.Module:
    """Build the official SAM2 model for ``spec`` in eval mode on CPU.

    Uses ``sam2.build_sam.build_sam2`` with its image-predictor post-processing overrides
    (dynamic multimask via stability), then loads ``checkpoint`` with ``weights_only=True``.

    Args:
        spec: a SAM2 variant.
        checkpoint: an official-format checkpoint (``{"model": state_dict}``), or None for
            the random initialisation of the official config.

    Raises:
        CheckpointError: unreadable checkpoint, or keys that do not match the config.
    """
    from sam2.build_sam import build_sam2

    with _sam2_hydra():
        model = build_sam2(spec.upstream_config, ckpt_path=None, device="cpu", mode="eval")
    if checkpoint is not None:
        _load_state(model, checkpoint, spec)
    return model.eval()


def structure(spec: ModelSpec) -> Structure:
    """``key -> shape`` of the variant's state dict (a CPU build: SAM2's Hiera calls ``.item()``
    while it is built, which a meta build cannot; 1-4 s, only on a checkpoint mismatch)."""
    import torch

    with torch.no_grad():
        return structure_of(build_model(spec, None).state_dict())


def _load_state(model: nn.Module, checkpoint: Path, spec: ModelSpec) -> None:
    state = load_checkpoint_file(checkpoint)
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(
            f"checkpoint: {checkpoint} is not an official SAM2 checkpoint "
            "(expected a dict with a 'model' state dict)"
        )
    load_state(model, state["model"], checkpoint, spec, sibling_structure=structure)


def save_random_checkpoint(spec: ModelSpec, path: Path, *, seed: int = 0) -> Path:
    """Write a random-init checkpoint of ``spec`` in the official format (for offline tests).

    The weights are the official config's own initialisation under ``torch.manual_seed(seed)``.
    """
    torch.manual_seed(seed)
    model = build_model(spec, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"model": model.state_dict()}, tmp)
    tmp.replace(path)
    return path


class SAM2Encoder(ModelWrapper):
    """image [B,3,1024,1024] -> image_embed [B,256,64,64], high_res_feats_0/1.

    Computes what ``SAM2ImagePredictor.set_image`` computes, arranged so the exported graph
    holds only per-image work (measured on SAM2.1-tiny, ORT CPU: 15% of the encoder's time
    went to constants recomputed on every run):

    - Hiera's position embedding (``pos_embed`` bicubic-resized to the 256x256 token grid
      plus the tiled window embedding) depends on the weights and the fixed input size
      only. Traced, its size came from the input's shape, so the graph ran a bicubic
      ``Resize`` per image (ORT's bicubic is ~8x slower than torch's). The wrapper computes
      it once with the trunk's own ``_get_pos_embed`` and the graph adds that table, the
      same values bit for bit.
    - The neck's sine position encodings are not encoder outputs; the predictor only reads
      their sizes. Taking the sizes from the features instead lets the exporter drop them.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        trunk = model.image_encoder.trunk
        with torch.no_grad():
            table = trunk._get_pos_embed(_token_grid(trunk, model.image_size))
        # A buffer, so the exporter writes it as an initializer (external data moves it).
        self.register_buffer("pos_embed", table.detach().clone())

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with _fixed_pos_embed(self.model.image_encoder.trunk, self.pos_embed):
            backbone_out = self.model.forward_image(image)
        # backbone_fpn is NCHW already (conv_s0/conv_s1 applied by forward_image); the
        # predictor's flatten/permute round trip (_prepare_backbone_features, then
        # set_image's permute back) only moves values, so it is skipped.
        feats = backbone_out["backbone_fpn"][-self.model.num_feature_levels :]
        embed = feats[-1]
        if self.model.directly_add_no_mem_embed:
            # no_mem_embed [1,1,C] is added per channel to HWxBxC tokens; the same in NCHW.
            embed = embed + self.model.no_mem_embed.reshape(1, -1, 1, 1)
        return embed, feats[0], feats[1]


def _token_grid(trunk: nn.Module, image_size: int) -> tuple[int, int]:
    """(H, W) of the token grid Hiera's patch embedding makes of a square ``image_size``."""
    conv = trunk.patch_embed.proj
    size = [
        (image_size + 2 * pad - kernel) // stride + 1
        for pad, kernel, stride in zip(conv.padding, conv.kernel_size, conv.stride, strict=True)
    ]
    return size[0], size[1]


@contextmanager
def _fixed_pos_embed(trunk: nn.Module, table: torch.Tensor):
    """Have ``trunk`` add ``table`` as its position embedding for the grid it was made for
    (any other grid falls back to the trunk's own computation); restored on exit."""
    original = trunk._get_pos_embed

    def pos_embed(hw: tuple[int, int]) -> torch.Tensor:
        return table if tuple(int(v) for v in hw) == tuple(table.shape[1:3]) else original(hw)

    trunk._get_pos_embed = pos_embed
    try:
        yield
    finally:
        del trunk._get_pos_embed  # the instance attribute; the class method shows again


class SAM2Decoder(nn.Module):
    """Embeddings + prompts -> single-mask and multimask low-res logits and scores.

    Inputs (B = Triton batch, N = points incl. box corners and the padding point):
        image_embed [B,256,64,64], high_res_feats_0 [B,32,256,256],
        high_res_feats_1 [B,64,128,128], point_coords [B,N,2] float32 (X, Y) in the
        1024x1024 input frame, point_labels [B,N] float32 in {-1, 0, 1, 2, 3},
        mask_input [B,1,256,256] low-res logits, has_mask_input [B,1] in {0, 1}.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.prompt_encoder = model.sam_prompt_encoder
        self.mask_decoder = model.sam_mask_decoder

    def forward(
        self,
        image_embed: torch.Tensor,
        high_res_feats_0: torch.Tensor,
        high_res_feats_1: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mask_input: torch.Tensor,
        has_mask_input: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        masks, iou, _, _ = predict_all_tokens(
            self.prompt_encoder,
            self.mask_decoder,
            (image_embed, high_res_feats_0, high_res_feats_1),
            (point_coords, point_labels, mask_input, has_mask_input),
        )
        if self.mask_decoder.dynamic_multimask_via_stability:
            single, single_iou = self.mask_decoder._dynamic_multimask_via_stability(masks, iou)
        else:
            single, single_iou = masks[:, 0:1], iou[:, 0:1]
        return single, single_iou, masks[:, 1:], iou[:, 1:]


def predict_all_tokens(
    prompt_encoder: nn.Module,
    mask_decoder: nn.Module,
    features: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    prompt: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every mask token of SAM2's mask decoder for a point-list prompt (image and video graphs).

    Args:
        features: image_embed [B,256,64,64] (the video decoder's has ``no_mem_embed`` added
            or not), high_res_feats_0 [B,32,256,256], high_res_feats_1 [B,64,128,128].
        prompt: point_coords [B,N,2], point_labels [B,N] (the padding point already
            appended), mask_input [B,1,256,256], has_mask_input [B,1].

    Returns:
        ``predict_masks``' masks [B,4,256,256], ious [B,4], mask tokens and object scores.
    """
    point_coords, point_labels, mask_input, has_mask_input = prompt
    # The client already appended the padding point, so the encoder must not pad again.
    sparse = prompt_encoder._embed_points(point_coords, point_labels, pad=False)
    # Arithmetic instead of a branch on has_mask_input so one graph serves both cases;
    # with has_mask_input = 0 this is exactly the predictor's no_mask_embed path.
    has_mask = has_mask_input.reshape(-1, 1, 1, 1)
    no_mask = prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
    dense = has_mask * prompt_encoder._embed_masks(mask_input) + (1 - has_mask) * no_mask
    return mask_decoder.predict_masks(
        image_embeddings=features[0],
        image_pe=prompt_encoder.get_dense_pe(),
        sparse_prompt_embeddings=sparse,
        dense_prompt_embeddings=dense,
        repeat_image=False,
        high_res_features=list(features[1:]),
    )


def wrap_encoder(model: nn.Module) -> nn.Module:
    """The ONNX-exportable encoder of a built SAM2 model."""
    return SAM2Encoder(model).eval()


def wrap_decoder(model: nn.Module) -> nn.Module:
    """The ONNX-exportable decoder of a built SAM2 model."""
    if not getattr(model.sam_mask_decoder, "use_high_res_features", False):
        raise ExportError("decoder: this SAM2 config has no high-resolution features")
    return SAM2Decoder(model).eval()
