"""Loading checkpoints safely and checking their structure, shared by every family's exporter.

A checkpoint the user names may be fine-tuned (MedSAM, micro-sam, a lab's own), so it is not
held to the published hash; instead its keys and tensor shapes must match the variant's
architecture exactly. A mismatch names the first differing keys, the variant that was
expected, and, when the file matches another variant of the family (a ViT-L file given for
``sam1_vit_b``), that variant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from triton_sam.errors import CheckpointError
from triton_sam.models.spec import ModelSpec

Structure = dict[str, tuple[int, ...]]
_SHOWN = 3  # keys named per kind of mismatch


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


def structure_of(state: Mapping[str, Any]) -> Structure:
    """``key -> shape`` of a state dict (tensors on any device, meta included)."""
    return {key: tuple(value.shape) for key, value in state.items()}


def meta_structure(build: Callable[[], nn.Module]) -> Structure:
    """The state-dict structure of the model ``build`` makes, without allocating its weights."""
    import torch

    with torch.device("meta"):
        return structure_of(build().state_dict())


def structure_mismatch(expected: Structure, found: Structure) -> list[str]:
    """Human-readable differences between two structures (empty when they match)."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [
        f"{k}: file {list(found[k])}, expected {list(expected[k])}"
        for k in expected
        if k in found and found[k] != expected[k]
    ]
    problems = []
    for label, keys in (
        ("keys with other shapes", shapes),
        ("missing keys", missing),
        ("unexpected keys", unexpected),
    ):
        if keys:
            problems.append(f"{len(keys)} {label} (first: {'; '.join(keys[:_SHOWN])})")
    return problems


def load_state(
    model: nn.Module,
    state: dict,
    checkpoint: Path,
    spec: ModelSpec,
    *,
    sibling_structure: Callable[[ModelSpec], Structure] | None = None,
) -> None:
    """Load ``state`` into ``model`` after checking its structure against the variant.

    Args:
        model: the official model of ``spec``.
        state: the checkpoint's state dict.
        checkpoint: its path (for messages).
        spec: the variant the user asked for.
        sibling_structure: how to get another variant's structure cheaply (a meta build);
            used only on a mismatch, to say which variant the file matches.

    Raises:
        CheckpointError: the keys or shapes differ; names the first differing keys, the
            expected variant and, if one matches, the variant the file belongs to.
    """
    problems = structure_mismatch(structure_of(model.state_dict()), structure_of(state))
    if problems:
        raise CheckpointError(
            _mismatch_message(spec, checkpoint, state, problems, sibling_structure)
        )
    model.load_state_dict(state, strict=True)


def _mismatch_message(
    spec: ModelSpec,
    checkpoint: Path,
    state: dict,
    problems: list[str],
    sibling_structure: Callable[[ModelSpec], Structure] | None,
) -> str:
    match = _matching_variant(spec, structure_of(state), sibling_structure)
    hint = (
        f" The file matches {match} instead: export it as that variant "
        f"(`triton-sam export {match} --checkpoint {checkpoint}`)."
        if match
        else f" It must be a {spec.family.family} checkpoint of the {spec.name} architecture "
        f"(fine-tuned weights are fine, other layer counts or widths are not)."
    )
    return (
        f"checkpoint: {checkpoint} does not match the architecture of {spec.name} "
        f"({spec.description or spec.upstream_config}): {'; '.join(problems)}.{hint}"
    )


def _matching_variant(
    spec: ModelSpec,
    found: Structure,
    sibling_structure: Callable[[ModelSpec], Structure] | None,
) -> str | None:
    """The registered variant of the same family whose structure equals ``found``, if any."""
    if sibling_structure is None:
        return None
    from triton_sam.models.registry import get_model, model_names

    for name in model_names():
        other = get_model(name)
        if name == spec.name or other.family.family != spec.family.family:
            continue
        try:
            if not structure_mismatch(sibling_structure(other), found):
                return name
        except Exception:  # best effort: a hint must never hide the real error
            continue
    return None
