"""What a python model ships beside its ``model.py``: derived from its imports, not listed.

A ``model.py`` imports the dependency-free serving package under its shipped name
(``from triton_sam_serving import bounds``, ``from triton_sam_serving.protocol import tenancy``);
each of those modules imports its siblings relatively (``from .bounds import RequestError``).
:func:`shipped_files` follows those imports (module level and inside functions alike) through
``triton_sam/serving`` and returns every file the model needs, each package's ``__init__`` on
the way included, so a model that starts importing a new module ships it without anyone
editing a list.
"""

from __future__ import annotations

import ast
from pathlib import Path

from triton_sam.serving.protocol import SHIPPED_PACKAGE

SERVING_DIR = Path(__file__).resolve().parent.parent / "serving"
# A model.py may also name the package by its source-tree path (the session model does).
_ROOTS = (SHIPPED_PACKAGE, "triton_sam.serving")


def imported_modules(source: str | Path) -> tuple[str, ...]:
    """The ``triton_sam/serving`` modules ``source`` needs, transitively, sorted.

    Args:
        source: a ``model.py`` source file (any python file importing the serving package).

    Returns:
        paths relative to ``triton_sam/serving`` without ``.py`` (``"protocol/tenancy"``),
        every package ``__init__`` on the way included; never a file outside ``serving/``.
    """
    found: set[str] = set()
    todo = _imports(Path(source), None)
    while todo:
        module = todo.pop()
        if module in found:
            continue
        found.add(module)
        todo += [m for m in _parents(module) if m not in found]
        todo += _imports(SERVING_DIR / f"{module}.py", module)
    return tuple(sorted(found))


def shipped_files(source: str | Path) -> dict[str, Path]:
    """Version-directory files shipping what ``source`` imports as ``SHIPPED_PACKAGE``:
    ``{"triton_sam_serving/protocol/tenancy.py": <its source path>, ...}``."""
    return {f"{SHIPPED_PACKAGE}/{m}.py": SERVING_DIR / f"{m}.py" for m in imported_modules(source)}


def _imports(path: Path, module: str | None) -> list[str]:
    """The serving modules ``path`` imports; ``module`` is its own name relative to
    ``serving/`` (None for a model.py, which imports only absolute names)."""
    package = _package(module) if module is not None else None
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [n for alias in node.names if (n := _relative(alias.name)) is not None]
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, package)
            if base is None:
                continue
            names.append(base)
            names += [f"{base}/{a.name}".lstrip("/") for a in node.names]
    return [m for m in map(_resolve, names) if m is not None]


def _base(node: ast.ImportFrom, package: list[str] | None) -> str | None:
    """The serving-relative path a ``from X import ...`` reads from, or None (elsewhere)."""
    if node.level == 0:
        return _relative(node.module or "")
    if package is None:
        return None
    parts = package[: len(package) - (node.level - 1)] if node.level > 1 else list(package)
    if node.level - 1 > len(package):
        raise ValueError(f"relative import beyond triton_sam/serving: {node.module}")
    return "/".join(parts + (node.module.split(".") if node.module else []))


def _relative(dotted: str) -> str | None:
    for root in _ROOTS:
        if dotted == root:
            return ""
        if dotted.startswith(root + "."):
            return dotted[len(root) + 1 :].replace(".", "/")
    return None


def _package(module: str) -> list[str]:
    """The package a module sits in, as path parts (a package's ``__init__`` is its own)."""
    parts = module.split("/")
    return parts[:-1]


def _resolve(name: str) -> str | None:
    """The file a serving-relative name is: a module, a package's ``__init__``, or None (a
    name imported from a module, not a module)."""
    for module in (name, f"{name}/__init__".lstrip("/")):
        if module and (SERVING_DIR / f"{module}.py").is_file():
            return module
    return None


def _parents(module: str) -> list[str]:
    parts = module.split("/")[:-1]
    return [("/".join(parts[:i]) + "/__init__").lstrip("/") for i in range(len(parts) + 1)]
