"""micro-sam 1.8.14, the tiled SAM labs use today, loaded as the reference of the large-image
benchmarks and tests, running micro-sam's own code on the weights the server serves.

micro-sam is installed next to the venv, not into it (``make micro-sam``:
requirements/lock-micro-sam.txt into ``<venv>/tools/micro-sam``, ``--no-deps``: it declares
napari and PyQt6, which none of the paths used here imports). :func:`micro_sam` appends that
folder to ``sys.path`` after site-packages, so every package the venv holds (torch,
segment_anything, numpy, zarr...) is the venv's own; only what the venv lacks comes from the
folder. ``TRITON_SAM_MICRO_SAM`` overrides the folder (several, ``os.pathsep`` between them).

The predictor is a ``segment_anything.SamPredictor`` over a SAM1 checkpoint
(``triton_sam.export.sam1.build_model``), with the two attributes micro-sam's embedding
signature reads (``model_type``, ``model_name``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

MICRO_SAM_ENV = "TRITON_SAM_MICRO_SAM"
MICRO_SAM_VERSION = "1.8.14"
MODEL_TYPE = "vit_b"  # micro-sam's name of the architecture our SAM1 test model is


def micro_sam_dirs() -> list[Path]:
    """``$TRITON_SAM_MICRO_SAM`` (``os.pathsep``-separated), else ``<venv>/tools/micro-sam``."""
    value = os.environ.get(MICRO_SAM_ENV)
    if value:
        return [Path(p) for p in value.split(os.pathsep) if p]
    return [Path(sys.prefix) / "tools" / "micro-sam"]


def micro_sam() -> SimpleNamespace:
    """micro-sam's modules the tests use: ``util``, ``prompts``
    (``prompt_based_segmentation``) and ``Blocking`` (its tile grid).

    Raises:
        ImportError: micro-sam is not installed where :func:`micro_sam_dirs` says (``make
            micro-sam`` installs it; CI does), or it is not version 1.8.14.
    """
    for folder in micro_sam_dirs():
        if str(folder) not in sys.path:
            sys.path.append(str(folder))  # after site-packages: the venv's versions win
    try:
        import micro_sam
        from bioimage_cpp.utils import Blocking
        from micro_sam import prompt_based_segmentation, util
    except ImportError as err:
        raise ImportError(
            f"micro-sam {MICRO_SAM_VERSION} is not importable from {micro_sam_dirs()}: "
            f"run `make micro-sam` (or set {MICRO_SAM_ENV}); {err}"
        ) from err
    if micro_sam.__version__ != MICRO_SAM_VERSION:
        raise ImportError(f"micro-sam {micro_sam.__version__}, expected {MICRO_SAM_VERSION}")
    return SimpleNamespace(util=util, prompts=prompt_based_segmentation, Blocking=Blocking)


def tiled_generator():
    """micro-sam's ``TiledAutomaticMaskGenerator`` (its module imports torch_em, pandas and
    scikit-learn, which the prompt path does not need: imported only here)."""
    micro_sam()
    from micro_sam.instance_segmentation import TiledAutomaticMaskGenerator

    return TiledAutomaticMaskGenerator


def reference_predictor(spec, checkpoint: Path):
    """The official ``SamPredictor`` over ``build_model(spec, checkpoint)`` (CPU, eval), named
    as micro-sam's ``get_sam_model`` names its predictors."""
    from segment_anything import SamPredictor

    from triton_sam.export.sam1 import build_model

    predictor = SamPredictor(build_model(spec, checkpoint).eval())
    predictor.model_type = MODEL_TYPE
    predictor.model_name = MODEL_TYPE
    return predictor
