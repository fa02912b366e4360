"""Session fixtures shared by the slow tiers: random-init models, each exported once.

``sam2_tiny_checkpoint`` is an official-format checkpoint of the official config's random
initialisation; ``sam2_tiny_server`` serves its export (python target) on free ports.
``sam1_vit_b_*`` is the same for SAM1 ViT-B, exported with external data forced on, so the
``.onnx_data`` sidecar path is what the embedded Triton loads.
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


@pytest.fixture(scope="session")
def sam1_vit_b_spec():
    from triton_sam.models import get_model

    return get_model("sam1_vit_b")


@pytest.fixture(scope="session")
def sam1_vit_b_checkpoint(sam1_vit_b_spec, tmp_path_factory) -> Path:
    from triton_sam.export import save_random_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / sam1_vit_b_spec.checkpoint.filename
    return save_random_checkpoint(sam1_vit_b_spec, path, seed=1)


@pytest.fixture(scope="session")
def sam1_vit_b_build(sam1_vit_b_spec, sam1_vit_b_checkpoint, tmp_path_factory):
    """(repository, RepositoryBuild) of the one ViT-B export of the session (~1-3 min)."""
    from triton_sam.export import ExportOptions
    from triton_sam.pipeline import build_repository
    from triton_sam.repository.config import RepositoryOptions

    repo = tmp_path_factory.mktemp("sam1_vit_b") / "model_repository"
    build = build_repository(
        sam1_vit_b_spec,
        repo,
        checkpoint=sam1_vit_b_checkpoint,
        export_options=ExportOptions(external_data=True),
        repository_options=RepositoryOptions(target="python"),
    )
    return repo, build


@pytest.fixture(scope="session")
def sam1_vit_b_server(sam1_vit_b_build):
    from triton_sam.server import EmbeddedTriton

    repo, _ = sam1_vit_b_build
    with EmbeddedTriton(repo, http_port=0, grpc_port=0, metrics_port=0) as server:
        yield server
