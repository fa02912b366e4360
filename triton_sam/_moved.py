"""Old import paths of modules that moved into the stage folders, kept for one release.

``import triton_sam.pipeline`` still works: a finder on ``sys.meta_path`` answers each old
name with the module at its new home (the same module object, so patching either name
patches both) and warns with a ``DeprecationWarning`` naming the new path. One table, so
the docs' moved-from table and this finder cannot disagree.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

# old module path -> new module path
MOVED: dict[str, str] = {
    "triton_sam.admin_key": "triton_sam.server.admin_key",
    "triton_sam.health": "triton_sam.server.health",
    "triton_sam.lifecycle": "triton_sam.server.lifecycle",
    "triton_sam.pipeline": "triton_sam.setup.pipeline",
    "triton_sam.config": "triton_sam.setup.settings",
    "triton_sam.paintera": "triton_sam.setup.paintera",
    "triton_sam.demo": "triton_sam.tools.demo",
    "triton_sam.segment": "triton_sam.tools.segment",
    "triton_sam.segment_everything": "triton_sam.tools.everything",
    "triton_sam.everything_local": "triton_sam.tools.everything_local",
    "triton_sam.sample": "triton_sam.tools.sample",
    "triton_sam.logs": "triton_sam.cli.logs",
    "triton_sam.repository.everything_config": "triton_sam.repository.everything_job",
    "triton_sam.repository.everything": "triton_sam.repository.everything_decoder",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self.old} moved to {self.new}; import it from there "
            "(the old path is removed in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at the new path is already executed."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 (importlib's signature)
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(fullname, new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import triton_sam`` calls it)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
