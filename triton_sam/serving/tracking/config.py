"""The hyperparameters the tracking orchestration reproduces (dependency-free).

The exporter reads them from the built model (sam2's ``SAM2VideoPredictor`` or transformers'
``Sam3TrackerVideoModel``, so a family and a variant are data, not code) and the repository
writes them, as JSON, into the tracker model's config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

PREPROCESSINGS = ("sam2", "sam3")


@dataclass(frozen=True)
class TrackerConfig:
    """Tracking settings of one SAM2 variant (names and meaning as in ``SAM2Base`` /
    ``SAM2VideoPredictor``; the defaults are SAM2.1's).

    Attributes:
        image_size: square model input side.
        num_maskmem: memories per frame: 1 conditioning slot + (num_maskmem - 1) recent frames.
        max_obj_ptrs_in_encoder: object pointers cross-attended (capped by the video length).
        memory_temporal_stride_for_eval: the stride r between recent memory frames.
        max_cond_frames_in_attn: conditioning frames attended (-1 = all).
        only_obj_ptrs_in_the_past_for_eval: skip pointers of conditioning frames ahead.
        use_signed_tpos_enc_to_obj_ptrs: signed temporal offsets for pointers.
        multimask_output_in_sam / multimask_output_for_tracking / multimask_min_pt_num /
            multimask_max_pt_num: when the decoder outputs three masks (``_use_multimask``).
        use_mask_input_as_output_without_sam: a mask prompt is taken as the output.
        add_all_frames_to_correct_as_cond: corrections become conditioning frames.
        clear_non_cond_mem_around_input: drop recent memories around a corrected frame.
        feat_size: side of the lowest-resolution feature map (1024 / 16 for SAM2.1, 1008 / 14
            for SAM3); the low-resolution masks are 4x that, the high-resolution levels 4x
            and 2x.
        hidden_dim / mem_dim: channels of the features and object pointers / of a memory.
        preprocessing: how a frame becomes the model input: ``"sam2"`` (Pillow bicubic,
            ImageNet mean/std, as ``load_video_frames``) or ``"sam3"`` (antialiased bilinear
            on uint8, mean = std = 0.5, as transformers' SAM3 processors).
        forward_on_prompt: how a prompt is run. False: ``SAM2VideoPredictor`` (the prompted
            object alone, its output kept temporary until propagation encodes its memory,
            previous logits fed back as the mask input of a correction). True:
            transformers' ``Sam3TrackerVideoModel``, where a prompt is ``forward`` on its
            frame: every object runs (the prompted one from its points, the others from
            their memory or their cached conditioning output), the memories are encoded at
            once (binarised for all when any object was prompted), no previous logits are
            fed back, and a conditioning frame is never marked as tracked.
        mask_prompt_memory: the ``mask_prompt`` graph also returns the prompt's memory
            (``maskmem_features``): transformers encodes it from the full-resolution mask.
    """

    image_size: int = 1024
    num_maskmem: int = 7
    max_obj_ptrs_in_encoder: int = 16
    memory_temporal_stride_for_eval: int = 1
    max_cond_frames_in_attn: int = -1
    only_obj_ptrs_in_the_past_for_eval: bool = True
    use_signed_tpos_enc_to_obj_ptrs: bool = True
    multimask_output_in_sam: bool = True
    multimask_output_for_tracking: bool = True
    multimask_min_pt_num: int = 0
    multimask_max_pt_num: int = 1
    use_mask_input_as_output_without_sam: bool = True
    add_all_frames_to_correct_as_cond: bool = False
    clear_non_cond_mem_around_input: bool = False
    feat_size: int = 64
    hidden_dim: int = 256
    mem_dim: int = 64
    preprocessing: str = "sam2"
    forward_on_prompt: bool = False
    mask_prompt_memory: bool = False

    def __post_init__(self) -> None:
        if self.preprocessing not in PREPROCESSINGS:
            raise ValueError(
                f"preprocessing: got {self.preprocessing!r}, expected one of {list(PREPROCESSINGS)}"
            )

    @property
    def mask_size(self) -> int:
        """Side of the low-resolution mask logits (stride 4 of the lowest feature level)."""
        return 4 * self.feat_size

    def to_json(self) -> str:
        """Compact JSON, as stored in the tracker model's config."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TrackerConfig:
        """Parse :meth:`to_json` output; unknown keys are refused (a newer exporter's setting
        this orchestration would silently ignore).

        Raises:
            ValueError: not a JSON object, unknown keys, or wrong types.
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"model_config: expected a JSON object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"model_config: unknown settings {unknown}")
        types = {"bool": bool, "str": str}
        for name, value in data.items():
            wanted = types.get(str(known[name].type), int)
            if type(value) is not wanted:
                raise ValueError(f"model_config: {name} = {value!r}, expected {wanted.__name__}")
        return cls(**data)

    def use_multimask(self, is_init_cond_frame: bool, num_points: int) -> bool:
        """``SAM2Base._use_multimask``: three candidate masks for this call or one."""
        return (
            self.multimask_output_in_sam
            and (is_init_cond_frame or self.multimask_output_for_tracking)
            and self.multimask_min_pt_num <= num_points <= self.multimask_max_pt_num
        )
