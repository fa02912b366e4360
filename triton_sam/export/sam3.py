"""SAM3 tracker exporter: transformers' ``Sam3TrackerModel`` split into an ONNX encoder/decoder.

The wrappers call upstream's own modules, so the graphs compute what transformers computes:

- encoder = ``Sam3TrackerModel.get_image_embeddings``: the vision encoder, ``conv_s0`` /
  ``conv_s1`` on the two high-resolution levels, ``no_memory_embedding`` added as upstream
  adds it, features reshaped to NCHW -> ``image_embeddings.0/1/2``.
- decoder (``SAM3_FAMILY``): points embedded by the official prompt encoder (the client lays
  out clicks, box corners 2/3 and the padding point -1 as ``Sam3TrackerPromptEncoder``
  does), ``mask_input`` through the official mask embedding when ``has_mask_input`` is 1
  (arithmetic, not a branch), then the official mask decoder once; both selections come
  from that one run: single mask = upstream's ``_dynamic_multimask_via_stability``, multimask
  = tokens 1-3, plus the object score logit.
- decoder in the onnx-community layout (``SAM3_ONNX_COMMUNITY_FAMILY``), for users who want
  their own weights in that layout (and for testing the import path): transformers' prompt
  tensors in, ``multimask_output=True`` outputs out.

Checkpoints are Hugging Face model directories (``config.json`` + ``model.safetensors``),
such as the snapshot of ``facebook/sam3`` or ``save_pretrained`` output; transformers loads
safetensors, never pickles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from triton_sam.errors import CheckpointError
from triton_sam.export.weights import structure_mismatch
from triton_sam.export.wrapper import ModelWrapper
from triton_sam.models.spec import ModelSpec


def small_config() -> Any:
    """A small random-init ``Sam3TrackerConfig`` with the real model's tensor contract.

    Same 1008x1008 input, 14-pixel patches and 256-channel FPN, hence the same three feature
    levels and 288x288 masks as ``facebook/sam3``; only the ViT (2 layers of width 32) and the
    decoder MLPs are small, so export and parity tests run in seconds on a CPU. Three FPN
    scales (the 0.5 scale only feeds SAM3's detector), so ``no_memory_embedding`` lands on
    the 72x72 level the decoder reads.
    """
    from transformers import Sam3TrackerConfig

    return Sam3TrackerConfig(
        vision_config={
            "model_type": "sam3_vision_model",
            "backbone_config": {
                "model_type": "sam3_vit_model",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "global_attn_indexes": [1],
            },
            "scale_factors": [4.0, 2.0, 1.0],
            "backbone_feature_sizes": [[288, 288], [144, 144], [72, 72]],
        },
        mask_decoder_config={"mlp_dim": 64, "iou_head_hidden_dim": 32},
    )


def build_model(spec: ModelSpec, checkpoint: Path | None) -> nn.Module:
    """Build ``Sam3TrackerModel`` in eval mode on CPU.

    Args:
        spec: a SAM3 variant.
        checkpoint: a Hugging Face model directory (``config.json`` + weights), e.g. the
            ``facebook/sam3`` snapshot; None builds the default ``Sam3TrackerConfig``'s random
            initialisation (the full-size model).

    Raises:
        CheckpointError: not a model directory, unreadable, or weights that leave tracker
            parameters uninitialised (the message lists some of them).
    """
    from transformers import Sam3TrackerConfig, Sam3TrackerModel

    if checkpoint is None:
        return Sam3TrackerModel(Sam3TrackerConfig()).eval()
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise CheckpointError(
            f"checkpoint: {checkpoint} is not a Hugging Face model directory (no config.json); "
            f"expected the snapshot of {spec.checkpoint.hf_repo or spec.upstream_config} "
            "or a save_pretrained() directory"
        )
    try:
        # Mismatched shapes are collected (not raised) so that the error below can name them.
        model, info = Sam3TrackerModel.from_pretrained(
            checkpoint, output_loading_info=True, ignore_mismatched_sizes=True
        )
    except Exception as e:  # transformers raises OSError, ValueError, KeyError...
        raise CheckpointError(f"checkpoint: cannot load {checkpoint}: {e}") from e
    # A fine-tuned directory brings its own config.json; its weights must fit that
    # architecture exactly (extra keys, e.g. the detector of a full facebook/sam3, are fine).
    mismatched = sorted(info.get("mismatched_keys", ()), key=lambda item: item[0])
    found = {key: tuple(ckpt) for key, ckpt, _ in mismatched}
    expected = {key: tuple(model_shape) for key, _, model_shape in mismatched}
    problems = structure_mismatch(expected, found)
    missing = sorted(info.get("missing_keys", []))
    if missing:
        problems.append(f"{len(missing)} missing keys (first: {'; '.join(missing[:3])})")
    if problems:
        raise CheckpointError(
            f"checkpoint: {checkpoint} does not match the architecture of its config.json "
            f"(Sam3TrackerModel, {spec.name}): {'; '.join(problems)}. The weights must come "
            "from a model of this config (fine-tuned weights are fine, other sizes are not)."
        )
    return model.eval()


def save_random_checkpoint(
    spec: ModelSpec, path: Path, *, seed: int = 0, config: Any = None
) -> Path:
    """Write a random-init model directory (``save_pretrained``) for offline tests and demos.

    Args:
        spec: a SAM3 variant.
        path: the directory to create.
        seed: ``torch.manual_seed`` for the initialisation.
        config: a ``Sam3TrackerConfig``; default the full-size one (see :func:`small_config`).

    ``no_memory_embedding`` is zero-initialised upstream (it is learnt); it gets random values
    here so that tests can see whether the encoder applies it.
    """
    from transformers import Sam3TrackerConfig, Sam3TrackerModel

    torch.manual_seed(seed)
    model = Sam3TrackerModel(config if config is not None else Sam3TrackerConfig()).eval()
    with torch.no_grad():
        model.no_memory_embedding.normal_(std=0.5)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    if path.exists():
        raise CheckpointError(f"checkpoint: {path} already exists; not overwriting it")
    tmp.replace(path)
    return path


class Sam3Encoder(ModelWrapper):
    """pixel_values [B,3,1008,1008] -> image_embeddings.0 [B,32,288,288], .1 [B,64,144,144],
    .2 [B,256,72,72] (``get_image_embeddings``)."""

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.model.get_image_embeddings(pixel_values))


class _Decode(ModelWrapper):
    """Shared tail: sparse/dense prompt embeddings -> every mask token of the official decoder."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.prompt_encoder = model.prompt_encoder
        self.mask_decoder = model.mask_decoder

    def decode(
        self,
        embeddings: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        sparse: torch.Tensor,
        dense: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the mask decoder once; return (single, single_iou, multi, multi_iou, object).

        Shapes: [B,P,1,h,w], [B,P,1], [B,P,3,h,w], [B,P,3], [B,P,1]. Single = upstream's
        ``multimask_output=False`` selection (dynamic multimask via stability), captured from
        the same run that yields tokens 1-3.
        """
        batch = embeddings[-1].shape[0]
        image_pe = self.model.get_image_wide_positional_embeddings().repeat(batch, 1, 1, 1)
        captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        select = self.mask_decoder._dynamic_multimask_via_stability

        def capture(masks: torch.Tensor, iou: torch.Tensor) -> Any:
            captured.append((masks, iou))
            return select(masks, iou)

        self.mask_decoder._dynamic_multimask_via_stability = capture  # instance attribute
        try:
            single, single_iou, _, object_score = self.mask_decoder(
                image_embeddings=embeddings[-1],
                image_positional_embeddings=image_pe,
                sparse_prompt_embeddings=sparse,
                dense_prompt_embeddings=dense,
                multimask_output=False,
                high_resolution_features=list(embeddings[:-1]),
            )
        finally:
            del self.mask_decoder._dynamic_multimask_via_stability
        if not captured:
            raise RuntimeError("mask decoder did not run its single-mask selection")
        masks, iou = captured[0]
        return single, single_iou, masks[:, :, 1:], iou[:, :, 1:], object_score


class Sam3Decoder(_Decode):
    """Embeddings + point-list prompts -> both selections and the object score.

    Inputs (B = Triton batch, N = points incl. box corners and the padding point):
        image_embeddings.0/1/2 as the encoder returns them, point_coords [B,N,2] float32
        (X, Y) in the 1008x1008 input frame, point_labels [B,N] float32 in {-1, 0, 1, 2, 3},
        mask_input [B,1,288,288] low-res logits, has_mask_input [B,1] in {0, 1}.
    Outputs: masks [B,1,288,288], iou_predictions [B,1], multimask_masks [B,3,288,288],
        multimask_iou_predictions [B,3], object_score_logits [B,1].
    """

    def forward(
        self,
        image_embeddings_0: torch.Tensor,
        image_embeddings_1: torch.Tensor,
        image_embeddings_2: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mask_input: torch.Tensor,
        has_mask_input: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        labels = point_labels.round().to(torch.int64)[:, None]
        # The client already appended the padding point, so the encoder must not pad again.
        sparse = self.prompt_encoder._embed_points(point_coords[:, None], labels, pad=False)
        has_mask = has_mask_input.reshape(-1, 1, 1, 1)
        no_mask = self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
        dense = has_mask * self.prompt_encoder.mask_embed(mask_input) + (1 - has_mask) * no_mask
        embeddings = (image_embeddings_0, image_embeddings_1, image_embeddings_2)
        single, single_iou, multi, multi_iou, obj = self.decode(embeddings, sparse, dense)
        return single[:, 0], single_iou[:, 0], multi[:, 0], multi_iou[:, 0], obj[:, 0]


class Sam3OnnxCommunityDecoder(_Decode):
    """The onnx-community ``prompt_encoder_mask_decoder`` contract, computed by upstream code.

    Inputs: input_points [B,P,N,2] float32, input_labels [B,P,N] int64, input_boxes [B,nb,4]
    float32 with nb = 0 (no box) or P, image_embeddings.0/1/2. Outputs: iou_scores [B,P,3],
    pred_masks [B,P,3,288,288], object_score_logits [B,P,1], as ``Sam3TrackerModel`` with
    ``multimask_output=True`` and ``input_boxes=None`` when nb = 0.

    Boxes join the points as corners labelled 2/3 followed by one padding point, which is
    what ``Sam3TrackerPromptEncoder`` computes for points + box (and, with no box, for
    points padded by one); written with concatenation so one graph serves nb = 0 and nb = P.
    """

    def forward(
        self,
        input_points: torch.Tensor,
        input_labels: torch.Tensor,
        input_boxes: torch.Tensor,
        image_embeddings_0: torch.Tensor,
        image_embeddings_1: torch.Tensor,
        image_embeddings_2: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, point_batch = input_points.shape[0], input_points.shape[1]
        corners = input_boxes.reshape(batch, point_batch, -1, 2)
        corner_index = torch.ones_like(corners[..., 0]).cumsum(-1) - 1  # 0, 1, 2, 3, ...
        corner_labels = (2 + torch.remainder(corner_index, 2)).to(input_labels.dtype)
        # One padding point per point batch, also when N = 0 (a sum over N keeps that dim as 1).
        pad_point = torch.zeros_like(input_points.sum(dim=2, keepdim=True))
        pad_label = torch.full_like(input_labels.sum(dim=2, keepdim=True), -1)
        points = torch.cat([input_points, corners, pad_point], dim=2)
        labels = torch.cat([input_labels, corner_labels, pad_label], dim=2)
        sparse = self.prompt_encoder._embed_points(points, labels, pad=False)
        grid = self.prompt_encoder.image_embedding_size
        dense = self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(
            batch, -1, grid[0], grid[1]
        )
        embeddings = (image_embeddings_0, image_embeddings_1, image_embeddings_2)
        _, _, multi, multi_iou, obj = self.decode(embeddings, sparse, dense)
        return multi_iou, multi, obj


def wrap_encoder(model: nn.Module) -> nn.Module:
    """The ONNX-exportable encoder of a built ``Sam3TrackerModel``."""
    return Sam3Encoder(model).eval()


def wrap_decoder(model: nn.Module) -> nn.Module:
    """The ONNX-exportable point-list decoder (``SAM3_FAMILY``) of a built model."""
    return Sam3Decoder(model).eval()


def wrap_onnx_community_decoder(model: nn.Module) -> nn.Module:
    """The ONNX-exportable decoder in the onnx-community layout of a built model."""
    return Sam3OnnxCommunityDecoder(model).eval()


def export_onnx_community_pair(
    spec: ModelSpec, checkpoint: Path | None, out_dir: Path, *, opset: int = 17
) -> tuple[Path, Path]:
    """Export ``out_dir/{vision_encoder,prompt_encoder_mask_decoder}.onnx`` (+ ``.onnx_data``).

    File names, external-data sidecars and tensor names are those of
    ``onnx-community/sam3-tracker-ONNX``, so the result can be imported with
    ``triton_sam.repository.importer`` or used by transformers.js-style clients.

    Returns:
        (encoder path, decoder path).

    Raises:
        CheckpointError / ExportError: as :func:`triton_sam.export.export_model`.
    """
    from triton_sam.export import graph_edits, onnx_utils
    from triton_sam.models.sam3 import (
        ONNX_COMMUNITY_DECODER,
        ONNX_COMMUNITY_ENCODER,
        SAM3_ONNX_COMMUNITY_FAMILY,
    )

    fam = SAM3_ONNX_COMMUNITY_FAMILY
    model = build_model(spec, checkpoint)
    encoder, decoder = wrap_encoder(model), wrap_onnx_community_decoder(model)
    size = fam.preprocessing.image_size
    pixels = torch.zeros(2, 3, size, size)
    with torch.no_grad():
        embeddings = encoder(pixels)
    enc_path = onnx_utils.export_graph(
        encoder,
        (pixels,),
        Path(out_dir) / ONNX_COMMUNITY_ENCODER,
        input_names=["pixel_values"],
        output_names=list(fam.embedding_names),
        dynamic_axes={n: {0: "batch_size"} for n in ["pixel_values", *fam.embedding_names]},
        opset=opset,
        external_data=True,
    )
    # Traced with N = 2 clicks and one box per point batch, so no dim is traced as 0 or 1.
    points = torch.tensor([[[[100.0, 200.0], [300.0, 50.0]]]]).repeat(2, 1, 1, 1)
    labels = torch.tensor([[[1, 0]]]).repeat(2, 1, 1)
    boxes = torch.tensor([[[10.0, 20.0, 500.0, 600.0]]]).repeat(2, 1, 1)
    axes = {
        "input_points": {0: "batch_size", 1: "point_batch_size", 2: "num_points"},
        "input_labels": {0: "batch_size", 1: "point_batch_size", 2: "num_points"},
        "input_boxes": {0: "batch_size", 1: "num_boxes"},
        **{n: {0: "batch_size"} for n in fam.embedding_names},
        **{t.name: {0: "batch_size", 1: "point_batch_size"} for t in fam.decoder_outputs},
    }
    dec_path = onnx_utils.export_graph(
        decoder,
        (points, labels, boxes, *embeddings),
        Path(out_dir) / ONNX_COMMUNITY_DECODER,
        input_names=[t.name for t in fam.decoder_inputs],
        output_names=[t.name for t in fam.decoder_outputs],
        dynamic_axes=axes,
        opset=opset,
        external_data=True,
    )
    from triton_sam.export import bound_prompt_points

    bound_prompt_points(dec_path, fam.decoder_inputs)
    # The fixed output sizes Triton's onnxruntime backend compares exactly.
    graph_edits.set_output_dims(enc_path, fam.encoder_outputs)
    graph_edits.set_output_dims(dec_path, fam.decoder_outputs)
    return enc_path, dec_path
