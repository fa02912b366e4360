"""The operator's data roots: the only places the server reads datasets from.

Configured as JSON (the large model's ``data_roots`` parameter, empty by default: no dataset
can be opened)::

    {"em": {"path": "/data/em", "tenants": ["alice", "bob"]}, "public": {"path": "/data/pub"}}

A root without ``tenants`` is every tenant's. A request names a dataset as
``"<root>/<path inside it>"``; :meth:`DataRoots.resolve` refuses anything that could read
elsewhere: an absolute path, ``..``, ``.`` or empty parts, NUL, a path whose real path (links
followed) leaves the root's real path, and a root the tenant may not see, with the same
message as a root that does not exist (a tenant learns nothing of other tenants' roots).

Links inside a dataset (a zarr chunk that is a symlink) are followed by the readers: keep a
root writable only by those trusted with what the server process can read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..bounds import RequestError

CONFIG_FIELD = "data_roots"
MAX_DATASET_CHARS = 4096


@dataclass(frozen=True)
class Root:
    """One data root: its folder (absolute) and who may read it (None: every tenant)."""

    path: Path
    tenants: frozenset[str] | None

    def visible_to(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


class DataRoots:
    """The configured data roots, by name."""

    def __init__(self, roots: dict[str, Root]) -> None:
        self._roots = dict(roots)

    @classmethod
    def from_json(cls, text: str) -> DataRoots:
        """Parses the ``data_roots`` parameter (``""``: no roots).

        Raises:
            RequestError: (field ``data_roots``) malformed JSON, a name that is empty or
                holds ``/``, a path that is not absolute, or tenants that are not strings.
        """
        if not text.strip():
            return cls({})
        try:
            config = json.loads(text)
        except ValueError as e:
            raise RequestError(CONFIG_FIELD, f"not JSON ({e})") from None
        if not isinstance(config, dict):
            raise RequestError(CONFIG_FIELD, 'expected {"<name>": {"path": "/abs/dir"}, ...}')
        return cls({name: _root(name, entry) for name, entry in config.items()})

    def names(self, tenant: str) -> list[str]:
        """The roots ``tenant`` may read, sorted."""
        return sorted(name for name, root in self._roots.items() if root.visible_to(tenant))

    def resolve(self, dataset: str, tenant: str, *, field: str = "request.dataset") -> Path:
        """The real path of ``"<root>/<path inside it>"`` for ``tenant``.

        Returns:
            The dataset's real path (links resolved), inside its root's real path.

        Raises:
            RequestError: a malformed path, a root unknown to (or hidden from) the tenant, a
                path that leaves its root, or a path that does not exist.
        """
        name, rel = _split(dataset, field)
        root = self._roots.get(name)
        if root is None or not root.visible_to(tenant):
            known = ", ".join(self.names(tenant)) or "none are configured for you"
            raise RequestError(field, f"no data root {name!r} (your data roots: {known})")
        base = Path(os.path.realpath(root.path))
        target = Path(os.path.realpath(base.joinpath(*rel.split("/"))))
        if not target.is_relative_to(base):
            raise RequestError(field, f"{dataset!r} leaves its data root (a link out of it)")
        if not _exists(target):
            raise RequestError(field, f"no dataset {dataset!r} (the path does not exist)")
        return target


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long, a permission denied on the way: none to read
        return False


def _root(name: object, entry: object) -> Root:
    if not isinstance(name, str) or not name or "/" in name or "\0" in name:
        raise RequestError(CONFIG_FIELD, f"root name {name!r}: expected a word without '/'")
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise RequestError(CONFIG_FIELD, f'root {name!r}: expected {{"path": "/abs/dir"}}')
    if set(entry) - {"path", "tenants"}:
        raise RequestError(CONFIG_FIELD, f"root {name!r}: unknown keys {sorted(set(entry))}")
    path = Path(entry["path"])
    if not path.is_absolute():
        raise RequestError(CONFIG_FIELD, f"root {name!r}: path {str(path)!r} is not absolute")
    tenants = entry.get("tenants")
    if tenants is not None and not (
        isinstance(tenants, list) and all(isinstance(t, str) for t in tenants)
    ):
        raise RequestError(CONFIG_FIELD, f"root {name!r}: tenants must be a list of names")
    return Root(path, None if tenants is None else frozenset(tenants))


def _split(dataset: object, field: str) -> tuple[str, str]:
    """``"<root>/<relative path>"`` split, refusing what could name a path elsewhere."""
    if not isinstance(dataset, str) or not dataset or len(dataset) > MAX_DATASET_CHARS:
        raise RequestError(
            field, f"expected '<data root>/<path inside it>', at most {MAX_DATASET_CHARS} chars"
        )
    parts = dataset.split("/")
    problem = (
        "an absolute path"
        if dataset.startswith("/")
        else "a NUL character"
        if "\0" in dataset
        else "a backslash"
        if "\\" in dataset
        else "'..' or '.' parts"
        if any(p in ("..", ".") for p in parts)
        else "empty parts"
        if len(parts) < 2 or "" in parts
        else None
    )
    if problem:
        raise RequestError(
            field,
            f"got {dataset[:200]!r}, which has {problem}; expected '<data root>/<path inside "
            "it>' (e.g. 'em/section.zarr')",
        )
    return parts[0], "/".join(parts[1:])
