"""Old import paths of names that moved out of a module that stays, kept for one release.

``repository.config``'s CPU-twin policy moved to ``repository.cpu_twin``, ``writer``'s
artifacts and embedded twins to ``artifacts`` and ``embedded``. The new homes import the old
one, so the old one cannot import them at its top (a cycle): its module ``__getattr__``
(PEP 562) imports them on first use and asks :func:`moved_name` for the name. The import
stays written out there, so import-linter sees the arrow. (Whole modules that moved keep
their old paths through ``triton_sam/_moved.py``.)
"""

from __future__ import annotations

from types import ModuleType


def moved_name(module: str, name: str, *homes: ModuleType) -> object:
    """``name`` from the first of ``homes`` whose ``__all__`` lists it.

    Args:
        module: the old home's ``__name__``, for the error.
        name: the attribute asked of the old home.
        homes: the new homes, searched in order.

    Raises:
        AttributeError: no home lists ``name`` (as for any unknown module attribute).
    """
    for home in homes:
        if name in home.__all__:
            return getattr(home, name)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
