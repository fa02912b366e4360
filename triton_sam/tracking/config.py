"""The SAM2 hyperparameters the tracking orchestration reproduces (dependency-free).

The exporter reads them from the built ``SAM2VideoPredictor`` (so a variant is data, not
code) and the repository writes them, as JSON, into the tracker model's config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields


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
        for name, value in data.items():
            wanted = bool if known[name].type in ("bool", bool) else int
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
