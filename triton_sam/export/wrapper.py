"""The base of the export wrappers: a module around a built upstream model.

Each family's exporter wraps the upstream model in one ``nn.Module`` per graph whose
``forward`` takes and returns the graph's tensors in the family's declared order. Most of
them need only the model itself, kept as ``self.model`` (the attribute name is part of the
exported graph's node names, so it stays the same for every wrapper).
"""

from __future__ import annotations

from torch import nn


class ModelWrapper(nn.Module):
    """An export wrapper holding the built upstream model as ``self.model``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
