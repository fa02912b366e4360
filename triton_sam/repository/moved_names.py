"""Old import paths of names that moved out of a module that stays, kept for one release.

``repository.config``'s CPU-twin policy moved to ``repository.cpu_twin``, ``writer``'s
artifacts and embedded twins to ``artifacts`` and ``embedded``: the new homes import the old
one, so the old one cannot import them at its top (a cycle). Its ``__getattr__`` (PEP 562),
made by :func:`moved_names`, imports them on first use instead. (Whole modules that moved
keep their old paths through ``triton_sam/_moved.py``.)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def moved_names(module: str, *homes: str) -> Callable[[str], object]:
    """A module ``__getattr__`` answering the names in the ``__all__`` of ``homes``.

    Args:
        module: the old home's ``__name__``, for the ``AttributeError`` of an unknown name.
        homes: dotted paths of the new homes, searched in order, each imported on first use.
    """

    def __getattr__(name: str) -> object:
        for home in homes:
            found = importlib.import_module(home)
            if name in found.__all__:
                return getattr(found, name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
