"""The SAM3 side of ``bench video``: the seeded small ``Sam3TrackerVideoModel`` (facebook/sam3's
tensor contract, reduced widths: the full ViT is beyond a CPU benchmark) exported once, and
transformers' own loop on the same weights as the upstream path.

Speed depends on the widths, not on the values of the weights: the small config's figures say
how the served loop compares with transformers' on the same model, not how fast SAM3 is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def export_small(graphs_dir: Path, seed: int = 0) -> Path:
    """Export :func:`~triton_sam.export.sam3_video.random_model` (verified) into
    ``graphs_dir`` once, with its weights as a model directory beside (``checkpoint/``)."""
    from triton_sam.export.sam3_video import (
        TRACKER_CONFIG_FILENAME,
        build_video_model,
        export_sam3_video,
        save_random_video_checkpoint,
    )

    if not (graphs_dir / TRACKER_CONFIG_FILENAME).is_file():
        checkpoint = graphs_dir.parent / f"{graphs_dir.name}-checkpoint"
        if not checkpoint.exists():
            save_random_video_checkpoint(checkpoint, seed=seed)
        export_sam3_video(build_video_model(checkpoint), graphs_dir)
    return graphs_dir.parent / f"{graphs_dir.name}-checkpoint"


class TransformersTracker:
    """``Sam3TrackerVideoProcessor`` + ``Sam3TrackerVideoModel`` (CPU, fp32) behind the
    predictor-style calls the benchmark makes (``init_state`` on a folder of frames,
    ``add_new_points_or_box`` with clicks, ``propagate_in_video``)."""

    def __init__(self, checkpoint: Path) -> None:
        from transformers import (
            Sam2VideoVideoProcessor,
            Sam3ImageProcessor,
            Sam3TrackerVideoModel,
            Sam3TrackerVideoProcessor,
        )

        self.model = Sam3TrackerVideoModel.from_pretrained(checkpoint).eval()
        # facebook/sam3's processor settings (1008 square, mean = std = 0.5)
        video = Sam2VideoVideoProcessor(
            size={"height": 1008, "width": 1008}, image_mean=[0.5] * 3, image_std=[0.5] * 3
        )
        self.processor = Sam3TrackerVideoProcessor(
            image_processor=Sam3ImageProcessor(), video_processor=video
        )

    def init_state(self, video: Path):
        import torch
        from PIL import Image

        frames = [np.asarray(Image.open(f).convert("RGB")) for f in sorted(Path(video).iterdir())]
        return self.processor.init_video_session(
            video=frames, inference_device="cpu", dtype=torch.float32
        )

    def add_new_points_or_box(self, session, frame_idx, obj_id, points, labels):
        import torch

        self.processor.add_inputs_to_inference_session(
            session,
            frame_idx=frame_idx,
            obj_ids=obj_id,
            input_points=[[np.asarray(points, np.float32).tolist()]],
            input_labels=[[np.asarray(labels).tolist()]],
        )
        with torch.no_grad():
            return self.model(inference_session=session, frame_idx=frame_idx)

    def propagate_in_video(self, session):
        import torch

        with torch.no_grad():
            yield from self.model.propagate_in_video_iterator(session)
