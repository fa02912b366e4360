"""Model registry: families (tensor contracts) and variants (checkpoints)."""

from triton_sam.models.registry import family_names, get_family, get_model, model_names
from triton_sam.models.spec import Checkpoint, FamilySpec, ModelSpec, Preprocessing, TensorSpec

__all__ = [
    "Checkpoint",
    "FamilySpec",
    "ModelSpec",
    "Preprocessing",
    "TensorSpec",
    "family_names",
    "get_family",
    "get_model",
    "model_names",
]
