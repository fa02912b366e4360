"""The import contracts of pyproject.toml (``[tool.importlinter]``) hold for the package.

``serving/`` imports nothing else from the package, the client imports neither export nor the
server, no stage imports a stage above it, and no sibling modules or packages import each
other in a cycle. import-linter prints the import that breaks a contract.
"""

from __future__ import annotations

import sys
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold(monkeypatch):
    monkeypatch.chdir(ROOT)  # pyproject.toml is read from the working directory
    monkeypatch.setattr(sys, "path", [str(ROOT), *sys.path])  # this checkout's package
    assert lint_imports(no_cache=True, no_logo=True) == 0, "see the broken contracts above"
