"""The models of exported graphs as artifacts (:class:`~.writer.ModelFiles`) for the writer:
each graph's config rendered from the repository options (and, for the ``onnxruntime``
target, checked against its graph as the GPU container would check it), with its files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from triton_sam.errors import RepositoryError
from triton_sam.models.spec import FamilySpec, GraphSpec
from triton_sam.repository.config import (
    ModelConfig,
    RepositoryOptions,
    Target,
    config_to_text,
    graph_config,
)
from triton_sam.repository.onnx_check import check_onnx_config
from triton_sam.repository.writer import (
    ModelFiles,
    _model_sources,
    write_models,
)


def write_pair(
    repo_dir: str | os.PathLike[str], family: FamilySpec, **graphs: Any
) -> tuple[str, str]:
    """Write a family's encoder and decoder models as one atomic set.

    Args:
        repo_dir: the model repository.
        family: the family spec.
        graphs: :func:`pair_artifacts`' keyword arguments (``encoder_onnx``,
            ``decoder_onnx``, ``options``, optional ``encoder_name`` / ``decoder_name``).

    Returns:
        The two model names, encoder first.

    Raises:
        RepositoryError / InputValidationError: as :func:`pair_artifacts` and
            :func:`write_models`.
    """
    encoder, decoder = pair_artifacts(family, **graphs)
    write_models(repo_dir, [encoder, decoder])
    return encoder.name, decoder.name


def pair_artifacts(
    family: FamilySpec,
    *,
    encoder_onnx: str | os.PathLike[str],
    decoder_onnx: str | os.PathLike[str],
    options: RepositoryOptions,
    encoder_name: str | None = None,
    decoder_name: str | None = None,
) -> list[ModelFiles]:
    """A family's encoder and decoder (configs rendered from ``options``), encoder first:
    :func:`graph_artifacts` of ``family.graphs``.

    Raises:
        RepositoryError / InputValidationError: as :func:`graph_artifacts`.
    """
    return graph_artifacts(
        family.graphs,
        {"encoder": encoder_onnx, "decoder": decoder_onnx},
        options,
        names={"encoder": encoder_name, "decoder": decoder_name},
    )


def graph_artifacts(
    graphs: Sequence[GraphSpec],
    onnx: Mapping[str, str | os.PathLike[str]],
    options: RepositoryOptions,
    *,
    names: Mapping[str, str | None] | None = None,
    configs: Mapping[str, ModelConfig] | None = None,
) -> list[ModelFiles]:
    """The models of a family's declared graphs, however many, in the order given.

    Args:
        graphs: the graphs (``family.graphs``).
        onnx: role -> the exported ``.onnx``; its external-data sidecars go along.
        options: target and serving options (bounds per ``GraphSpec.batching``).
        names: role -> Triton model name (None or absent: ``GraphSpec.model``).
        configs: role -> a config already built (by :func:`~.config.graph_config`) where
            the caller adjusts it; the others are rendered from ``options``.

    Raises:
        RepositoryError / InputValidationError: as :func:`write_model`; a role without a
            graph; for the ``onnxruntime`` target also a config its graph contradicts in a
            way Triton's onnxruntime backend refuses (see ``repository.onnx_check``), before
            anything is written.
    """
    names, configs = names or {}, configs or {}
    artifacts = []
    for graph in graphs:
        if graph.role not in onnx:
            raise RepositoryError(f"no exported graph for {graph.role!r}: got {sorted(onnx)}")
        if graph.role in configs:
            config = configs[graph.role]
        else:
            config = graph_config(graph, options, name=names.get(graph.role))
        artifacts.append(onnx_artifact(config, onnx[graph.role], target=options.target))
    return artifacts


def onnx_artifact(
    config: ModelConfig, onnx_path: str | os.PathLike[str], *, target: Target
) -> ModelFiles:
    """The model of one ONNX graph with its config; for the ``onnxruntime`` target the
    config is first checked against the graph as the GPU container would check it.

    Raises:
        RepositoryError / InputValidationError: as :func:`onnx_model_files`, or a config
            the graph contradicts.
    """
    if target == "onnxruntime":
        check_onnx_config(config, Path(onnx_path))
    return onnx_model_files(config.name, onnx_path, config_to_text(config), target=target)


def onnx_model_files(
    name: str, onnx_path: str | os.PathLike[str], config_text: str, *, target: Target
) -> ModelFiles:
    """The files of an ONNX model: the graph, its external-data sidecars, and for the
    ``python`` target the runner (see :func:`write_model`).

    Raises:
        InputValidationError / RepositoryError: as :func:`write_model`.
    """
    path = Path(onnx_path)
    sources = _model_sources(name, path, config_text, target, _sidecars(path))
    return ModelFiles(name, config_text, sources)


def _sidecars(onnx_path: Path) -> list[Path]:
    if not onnx_path.is_file():
        raise RepositoryError(f"{onnx_path}: file not found")
    from triton_sam.export.onnx_utils import external_data_files

    return external_data_files(onnx_path)


__all__ = [
    "graph_artifacts",
    "onnx_artifact",
    "onnx_model_files",
    "pair_artifacts",
    "write_pair",
]
