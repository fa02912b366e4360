"""The SAM2.1 video graphs as declared ``GraphSpec``s: spec data, below the exporter that
traces them and the repository that writes them (one declaration for both).

Their tensors are the tracker's wire contract (``serving/protocol/tracker.py``: the python
model inside Triton calls them by those names); their bounds are the tracker's
(``repository.video_config.TrackerOptions``).
"""

from __future__ import annotations

from triton_sam.models.spec import GraphSpec, TensorSpec
from triton_sam.serving.protocol import tracker as protocol


def video_graphs() -> tuple[GraphSpec, ...]:
    """The five video graphs, declared from the protocol's contracts (role = graph key,
    ``protocol.GRAPHS``; name = its default Triton model name)."""
    return tuple(
        GraphSpec(
            key,
            name,
            tuple(TensorSpec(*t) for t in protocol.GRAPHS[key][0]),
            tuple(TensorSpec(*t) for t in protocol.GRAPHS[key][1]),
        )
        for key, name in protocol.DEFAULT_MODEL_NAMES.items()
    )
