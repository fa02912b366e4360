"""The SAM3 video graphs as declared ``GraphSpec``s (spec data: the exporter traces them, the
repository writes them). Same roles and tensor names as the SAM2.1 video graphs
(:mod:`triton_sam.models.sam2_video`), at SAM3's sizes (``protocol.SAM3_GRAPHS``: 1008 input,
72x72 features, 288x288 masks); SAM3's ``mask_prompt`` also returns the mask's memory
(see ``export/sam3_video.py``).
"""

from __future__ import annotations

from triton_sam.models.spec import GraphSpec, TensorSpec
from triton_sam.serving.protocol import tracker as protocol


def video_graphs() -> tuple[GraphSpec, ...]:
    """The five SAM3 video graphs (role = graph key; name = its default Triton model name)."""
    return tuple(
        GraphSpec(
            key,
            protocol.SAM3_MODEL_NAMES[key],
            tuple(TensorSpec(*t) for t in inputs),
            tuple(TensorSpec(*t) for t in outputs),
        )
        for key, (inputs, outputs) in protocol.SAM3_GRAPHS.items()
    )
