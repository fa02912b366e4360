"""The committed model_repository/ configs are exactly what the renderer writes by default.

docker compose mounts model_repository/ as is; `triton-sam setup` rewrites the same files
(plus 1/model.onnx). A hand edit or a spec change without re-rendering fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from triton_sam.models import get_family
from triton_sam.repository.config import RepositoryOptions, parse_config, render_config

REPO = Path(__file__).resolve().parents[2] / "model_repository"


@pytest.mark.parametrize("graph", ["encoder", "decoder"])
def test_committed_sam2_config_matches_the_renderer(graph):
    family = get_family("sam2")
    name = getattr(family, f"{graph}_model")
    committed = (REPO / name / "config.pbtxt").read_text()
    assert committed == render_config(family, graph, RepositoryOptions())
    config = parse_config(committed)
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size > 0
    assert config.HasField("dynamic_batching")
