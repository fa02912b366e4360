"""Registry: family name -> FamilySpec, variant name -> ModelSpec.

Families are Python (one spec module each, imported lazily so ``import triton_sam`` stays
light); variants are data: one YAML file each under ``triton_sam/conf/model/``, which is also
the hydra config group, so adding a variant is adding a file.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib import resources
from typing import Any

import yaml

from triton_sam.errors import ConfigError, UnsupportedModelError
from triton_sam.models.spec import Checkpoint, FamilySpec, ModelSpec

# family name -> "module:attribute" of its FamilySpec
_FAMILIES: dict[str, str] = {
    "sam1": "triton_sam.models.sam1:SAM1_FAMILY",
    "sam2": "triton_sam.models.sam2:SAM2_FAMILY",
    "sam3": "triton_sam.models.sam3:SAM3_FAMILY",
    "sam3_onnx_community": "triton_sam.models.sam3:SAM3_ONNX_COMMUNITY_FAMILY",
    "sam3_concept": "triton_sam.models.sam3_concept:SAM3_CONCEPT_FAMILY",
}


def family_names() -> list[str]:
    """Names of the supported families (also the client's ``model_type`` values)."""
    return sorted(_FAMILIES)


def get_family(name: str) -> FamilySpec:
    """Return the spec of a model family (``ConceptFamilySpec`` for text-prompted families,
    see :func:`is_concept_family`).

    Raises:
        UnsupportedModelError: ``name`` is not a known family; the message lists the valid ones.
    """
    if name not in _FAMILIES:
        raise UnsupportedModelError(
            f"model_type: unknown model family {name!r}; expected one of {family_names()}"
        )
    module, attr = _FAMILIES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def is_concept_family(family: object) -> bool:
    """True for a text-prompted family (``ConceptFamilySpec``: four graphs behind a serving
    model) rather than an encoder/decoder pair (``FamilySpec``)."""
    from triton_sam.models.sam3_concept import ConceptFamilySpec  # light: specs only

    return isinstance(family, ConceptFamilySpec)


@cache
def _variants() -> dict[str, ModelSpec]:
    specs: dict[str, ModelSpec] = {}
    for entry in sorted(resources.files("triton_sam.conf").joinpath("model").iterdir()):
        if not entry.name.endswith(".yaml"):
            continue
        spec = spec_from_mapping(yaml.safe_load(entry.read_text()), source=entry.name)
        if spec.name in specs:
            raise ConfigError(f"{entry.name}: duplicate model name {spec.name!r}")
        specs[spec.name] = spec
    return specs


def spec_from_mapping(data: Any, *, source: str) -> ModelSpec:
    """Build a ModelSpec from one variant config (a YAML file or a hydra node)."""
    try:
        ckpt = dict(data["checkpoint"])
        return ModelSpec(
            name=str(data["name"]),
            family=get_family(str(data["family"])),
            upstream_config=str(data["upstream_config"]),
            checkpoint=Checkpoint(
                url=str(ckpt["url"]),
                filename=str(ckpt["filename"]),
                sha256=ckpt.get("sha256"),
                sha256_prefix=ckpt.get("sha256_prefix"),
                hf_repo=ckpt.get("hf_repo"),
            ),
            params_m=float(data.get("params_m", 0.0)),
            description=str(data.get("description", "")),
        )
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{source}: model config is missing or has a bad field: {e}") from e


def model_names() -> list[str]:
    """Names of every registered variant."""
    return sorted(_variants())


def get_model(name: str) -> ModelSpec:
    """Return the spec of a variant, e.g. ``get_model("sam2.1_hiera_tiny")``.

    Raises:
        UnsupportedModelError: unknown name; the message lists the valid ones.
    """
    variants = _variants()
    if name not in variants:
        raise UnsupportedModelError(
            f"model: unknown model {name!r}; expected one of {sorted(variants)}"
        )
    return variants[name]
