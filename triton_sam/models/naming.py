"""Model names shared by the repository writer and the clients (dependency-free).

An entry model (:mod:`triton_sam.repository.entry`) may take our encoder's default name for
another client (Paintera's ``sam1_encoder``); our encoder is then written under
:func:`normalized_name`, and our clients, finding a Triton ensemble under the encoder's name,
encode with that one.
"""

from __future__ import annotations

NORMALIZED_SUFFIX = "_normalized"
ENSEMBLE_PLATFORM = "ensemble"  # Triton's platform of an ensemble model


def normalized_name(encoder: str) -> str:
    """The name our mean/std-normalised encoder is written under when an entry model takes
    its own name (``sam1_encoder`` -> ``sam1_encoder_normalized``)."""
    return encoder + NORMALIZED_SUFFIX
