"""The settings of concept tracking: ``Sam3VideoConfig``'s orchestration fields.

Defaults are ``Sam3VideoConfig``'s (transformers 5.23). ``fill_hole_area`` is not here: the
served model does no hole filling, as upstream does none without the ``kernels`` package's
``cv-utils`` kernel (its ``fill_holes_in_mask_scores`` falls back to a no-op), which is how
the parity tests run it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..bounds import RequestError


@dataclass(frozen=True)
class ConceptVideoSettings:
    """Thresholds and counters of the detector-tracker reconciliation.

    Attributes:
        score_threshold_detection: keep detections whose probability (query x presence)
            exceeds it.
        det_nms_thresh: mask IoU above which a lower-scoring detection is suppressed (0 = off).
        use_nms: run the detector NMS at all; ``False`` reproduces upstream without the
            ``kernels`` package, which skips NMS and keeps every detection above threshold.
        assoc_iou_thresh: IoU at which a detection matches a masklet (a detection matching
            none may become a new object).
        trk_assoc_iou_thresh: IoU at which a masklet counts as matched by some detection.
        new_det_thresh: probability a detection needs to become a new object.
        recondition_on_trk_masks: recondition with the tracked mask (True) or the detection's.
        hotstart_delay: frames an answer is held back so hot-start removals can still hide
            an object before its first frame is answered (0 = answer each frame at once).
        hotstart_unmatch_thresh: unmatched frames that remove an object born within the delay.
        hotstart_dup_thresh: frames a later object shares a detection with an earlier one
            before it is removed as a duplicate.
        suppress_unmatched_only_within_hotstart: never hide long-unmatched older objects.
        init_trk_keep_alive / max_trk_keep_alive / min_trk_keep_alive: the keep-alive
            counter's start and bounds.
        suppress_overlapping_based_on_recent_occlusion_threshold: IoU above which, of two
            overlapping masklets of one prompt, the more recently occluded is suppressed.
        decrease_trk_keep_alive_for_empty_masklets: an empty masklet loses keep-alive too.
        max_num_objects: at most this many objects per session (the best new ones admitted).
        recondition_every_nth_frame: reconditioning period in frames (0 = never).
        high_conf_thresh / high_iou_thresh: what a detection needs to recondition a masklet.
    """

    score_threshold_detection: float = 0.5
    det_nms_thresh: float = 0.1
    use_nms: bool = True
    assoc_iou_thresh: float = 0.1
    trk_assoc_iou_thresh: float = 0.5
    new_det_thresh: float = 0.7
    recondition_on_trk_masks: bool = True
    hotstart_delay: int = 15
    hotstart_unmatch_thresh: int = 8
    hotstart_dup_thresh: int = 8
    suppress_unmatched_only_within_hotstart: bool = True
    init_trk_keep_alive: int = 30
    max_trk_keep_alive: int = 30
    min_trk_keep_alive: int = -1
    suppress_overlapping_based_on_recent_occlusion_threshold: float = 0.7
    decrease_trk_keep_alive_for_empty_masklets: bool = False
    max_num_objects: int = 10000
    recondition_every_nth_frame: int = 16
    high_conf_thresh: float = 0.8
    high_iou_thresh: float = 0.8

    def __post_init__(self) -> None:
        # Sam3VideoConfig.validate_architecture: a threshold above the delay could never fire
        if self.hotstart_delay > 0:
            for name in ("hotstart_unmatch_thresh", "hotstart_dup_thresh"):
                value = getattr(self, name)
                if value > self.hotstart_delay:
                    raise RequestError(
                        name, f"got {value}, expected <= hotstart_delay ({self.hotstart_delay})"
                    )
        if self.max_num_objects < 1:
            raise RequestError(
                "max_num_objects", f"got {self.max_num_objects}, expected at least 1"
            )
