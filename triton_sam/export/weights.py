"""Loading official checkpoints safely, shared by every family's exporter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from triton_sam.errors import CheckpointError
from triton_sam.models.spec import ModelSpec


def load_checkpoint_file(checkpoint: Path) -> Any:
    """``torch.load`` with ``weights_only=True``: tensors and containers, never arbitrary pickles.

    Raises:
        CheckpointError: unreadable file, or one that needs unpickling beyond weights.
    """
    import torch

    try:
        return torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several unrelated types for bad files
        raise CheckpointError(f"checkpoint: cannot load {checkpoint}: {e}") from e


def load_state(model: nn.Module, state: dict, checkpoint: Path, spec: ModelSpec) -> None:
    """Load ``state`` into ``model``, refusing missing or unexpected keys with a clear error."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint: {checkpoint} does not match {spec.name} ({spec.upstream_config}): "
            f"{len(missing)} missing keys (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected keys (e.g. {unexpected[:3]})"
        )
