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


def test_the_docs_draw_every_stage_and_every_moved_path(monkeypatch):
    """scripts/docs_import_graph.py, which the docs build runs for docs/architecture.md."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import docs_import_graph

    from triton_sam._moved import MOVED

    levels = docs_import_graph.stage_order()
    stages = [stage for level in levels for stage in level]
    assert stages[0] == "cli" and stages[-1] == "errors"
    picture = docs_import_graph.import_graph_markdown()
    assert picture.startswith("```mermaid\nflowchart TD\n")
    assert all(f"{stage}[" in picture for stage in stages)
    table = docs_import_graph.moved_table()
    assert all(f"| `{old}` | `{new}` |" in table for old, new in MOVED.items())
