"""Hydra configs -> typed options. Hydra is started here, from the CLI, never at import.

``triton_sam/conf/config.yaml`` holds export, repository and serve options; the
``model`` group holds one YAML per variant (the registry reads the same files).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from triton_sam.errors import ConfigError
from triton_sam.models.registry import get_model, spec_from_mapping
from triton_sam.models.spec import ModelSpec


def load_config(model: str | None = None, overrides: Sequence[str] = ()) -> Any:
    """Compose the config for ``model`` with hydra-style ``key=value`` overrides.

    Raises:
        UnsupportedModelError: unknown model (lists the valid names).
        ConfigError: a malformed or unknown override.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if model is not None:
        get_model(model)  # a clear error listing valid names, before hydra's
    args = ([f"model={model}"] if model else []) + list(overrides)
    # `import sam2` initialises hydra globally for its own configs; ours is scoped (cleared
    # on exit), and the sam2 exporter re-initialises its own when it builds a model.
    GlobalHydra.instance().clear()
    try:
        # A scoped context: the global hydra state is cleared on exit, so sam2's own
        # hydra usage (see export/sam2.py) never sees ours.
        with initialize_config_module("triton_sam.conf", version_base=None):
            return compose("config", overrides=args)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(
            f"overrides: {list(overrides)} could not be applied: {e}. "
            "Use key=value with keys from `triton-sam config`, e.g. export.fp16=true"
        ) from e


def model_spec(cfg: Any) -> ModelSpec:
    """The variant spec, including any ``model.*`` overrides."""
    from omegaconf import OmegaConf

    return spec_from_mapping(OmegaConf.to_container(cfg.model, resolve=True), source="config")


def section(cfg: Any, name: str) -> dict[str, Any]:
    """A config section as a plain dict (for the option dataclasses)."""
    from omegaconf import OmegaConf

    return dict(OmegaConf.to_container(cfg[name], resolve=True))  # type: ignore[arg-type]
