"""Session fixtures shared by the slow tiers: one random-init SAM2.1-tiny, exported once.

``sam2_tiny_checkpoint`` is an official-format checkpoint of the official config's random
initialisation; ``sam2_tiny_server`` serves its export (python target) on free ports.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def sam2_tiny_spec():
    from triton_sam.models import get_model

    return get_model("sam2.1_hiera_tiny")


@pytest.fixture(scope="session")
def sam2_tiny_checkpoint(sam2_tiny_spec, tmp_path_factory) -> Path:
    from triton_sam.export import save_random_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "sam2.1_hiera_tiny.pt"
    return save_random_checkpoint(sam2_tiny_spec, path, seed=1)


@pytest.fixture(scope="session")
def sam2_tiny_repository(sam2_tiny_spec, sam2_tiny_checkpoint, tmp_path_factory) -> Path:
    from triton_sam.pipeline import build_repository
    from triton_sam.repository.config import RepositoryOptions

    repo = tmp_path_factory.mktemp("sam2_tiny") / "model_repository"
    build_repository(
        sam2_tiny_spec,
        repo,
        checkpoint=sam2_tiny_checkpoint,
        repository_options=RepositoryOptions(target="python"),
    )
    return repo


@pytest.fixture(scope="session")
def sam2_tiny_server(sam2_tiny_repository):
    from triton_sam.server import EmbeddedTriton

    with EmbeddedTriton(sam2_tiny_repository, http_port=0, grpc_port=0, metrics_port=0) as server:
        yield server
