"""The operator's data roots, handed to the served large-image models at serve time.

The ``<family>_large`` models read datasets only under the directories the operator names
here (none by default). The server passes them in the environment variable
:data:`~triton_sam.serving.protocol.large.DATA_ROOTS_ENV` of the tritonserver process, which
every python stub inherits, so the model repository (written by ``setup``, possibly on
another machine) never holds a path of the serving host. ``triton-sam serve --data-root
NAME=PATH`` and the configuration's ``serve.data_roots`` set them for the embedded server;
compose sets the variable in the container's environment (``docker-compose.yml``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from triton_sam.errors import InputValidationError
from triton_sam.serving.protocol.large import DATA_ROOTS_ENV

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def parse_options(options: Iterable[str]) -> dict[str, str]:
    """``--data-root NAME=PATH`` options as ``{name: path}``.

    Raises:
        InputValidationError: (``--data-root``) not ``NAME=PATH``, or a name given twice.
    """
    roots: dict[str, str] = {}
    for option in options:
        name, sep, path = option.partition("=")
        if not sep or not name or not path:
            raise InputValidationError("--data-root", f"got {option!r}, expected NAME=PATH")
        if name in roots:
            raise InputValidationError("--data-root", f"{name!r} given twice")
        roots[name] = path
    return roots


def roots_json(roots: Mapping[str, Any] | None) -> str:
    """The JSON the large models read (``{"<name>": {"path": "/abs/dir", "tenants": [...]}}``)
    of ``roots``: name -> a directory, or -> ``{"path": dir, "tenants": [names]}`` (a root
    without ``tenants`` is every tenant's). "" when there are none.

    Raises:
        InputValidationError: (``data_roots.<name>``) a name that is not a plain word, a path
            that is not an existing directory, tenants that are not a list of names.
    """
    out = {}
    for name, value in (roots or {}).items():
        field = f"data_roots.{name}"
        if not isinstance(name, str) or not NAME.match(name):
            raise InputValidationError(field, "expected a name of letters, digits, _ . -")
        entry = dict(value) if isinstance(value, Mapping) else {"path": value}
        if set(entry) - {"path", "tenants"} or not isinstance(entry.get("path"), str | Path):
            raise InputValidationError(field, "expected a directory, or {path, tenants}")
        path = Path(entry["path"]).expanduser().resolve()
        if not path.is_dir():
            raise InputValidationError(field, f"{path}: not an existing directory")
        out[name] = {"path": str(path)}
        tenants = entry.get("tenants")
        if tenants is not None:
            if not isinstance(tenants, list | tuple) or not all(
                isinstance(t, str) for t in tenants
            ):
                raise InputValidationError(f"{field}.tenants", "expected a list of tenant names")
            out[name]["tenants"] = list(tenants)
    return json.dumps(out, sort_keys=True) if out else ""


def environment(roots: Mapping[str, Any] | None) -> dict[str, str]:
    """The server's environment entry for ``roots`` ({} when there are none)."""
    text = roots_json(roots)
    return {DATA_ROOTS_ENV: text} if text else {}
