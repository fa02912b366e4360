"""The package's imports between stages, read from the code (grimp), for docs/architecture.md.

The docs build (scripts/mkdocs_hooks.py) puts two generated blocks into the architecture
page, so neither can go stale: a mermaid picture of which stage imports which, and the
moved-from table of ``triton_sam/_moved.py``. The stages and their order come from the layers
contract in pyproject.toml (``[tool.importlinter]``), the one import-linter checks in CI.

``python scripts/docs_import_graph.py`` prints both blocks.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "triton_sam"


def stage_order(pyproject: Path = ROOT / "pyproject.toml") -> list[list[str]]:
    """The layers contract's levels, top first; each level lists its stages."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    for contract in config["contracts"]:
        if contract["type"] == "layers":
            return [[s.strip() for s in level.split("|")] for level in contract["layers"]]
    raise ValueError(f"{pyproject}: no layers contract under [tool.importlinter]")


def stage_imports(package: str = PACKAGE) -> Counter[tuple[str, str]]:
    """(importing stage, imported stage) -> number of module-to-module imports, inside
    functions too; imports within a stage and of the package root are left out."""
    import grimp  # the docs tools and the dev extra install it; only this script needs it

    graph = grimp.build_graph(package, cache_dir=None)
    edges: Counter[tuple[str, str]] = Counter()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = _stage(importer), _stage(imported)
            if a and b and a != b:
                edges[(a, b)] += 1
    return edges


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and not parts[1].startswith("_") else None


def _shown(stage: str) -> str:
    """``client/`` for a stage folder, ``errors.py`` for a stage module."""
    return f"{stage}/" if (ROOT / PACKAGE / stage).is_dir() else f"{stage}.py"


def _reaches(edges: set[tuple[str, str]], start: str, goal: str, skip: tuple[str, str]) -> bool:
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        for a, b in edges:
            if a == node and (a, b) != skip and b not in seen:
                if b == goal:
                    return True
                seen.add(b)
                todo.append(b)
    return False


def mermaid(edges: Counter[tuple[str, str]], levels: list[list[str]]) -> str:
    """A mermaid flowchart, top stage first. An arrow another path already implies is left
    out (the picture shows what reaches what; the table beside it lists every arrow); an
    arrow pointing up, against the layers contract, is always drawn, dashed and red."""
    rank = {stage: i for i, level in enumerate(levels) for stage in level}
    arrows = set(edges)
    lines = ["flowchart TD"]
    for i, level in enumerate(levels):
        lines.append(f"  subgraph L{i} [ ]")
        lines.extend(f"    {stage}[{_shown(stage)}]" for stage in level)
        lines.append("  end")
    upward, drawn = [], 0  # linkStyle counts the arrows in the order they are drawn
    for a, b in sorted(arrows, key=lambda e: (rank.get(e[0], 99), rank.get(e[1], 99))):
        if rank.get(a, 99) >= rank.get(b, 99):
            upward.append(drawn)
            lines.append(f"  {a} -.->|{edges[(a, b)]}| {b}")
        elif not _reaches(arrows, a, b, skip=(a, b)):
            lines.append(f"  {a} --> {b}")
        else:
            continue
        drawn += 1
    lines.extend(f"  style L{i} fill:none,stroke:none" for i in range(len(levels)))
    lines.extend(f"  linkStyle {n} stroke:red,color:red" for n in upward)
    return "```mermaid\n" + "\n".join(lines) + "\n```\n"


def edge_table(edges: Counter[tuple[str, str]], levels: list[list[str]]) -> str:
    """Every stage and the stages it imports directly (number of imports), top first."""
    rows = ["| stage | imports (number of module imports) |", "|---|---|"]
    order = [stage for level in levels for stage in level]
    for stage in order:
        targets = sorted(
            ((b, n) for (a, b), n in edges.items() if a == stage),
            key=lambda t: order.index(t[0]) if t[0] in order else 99,
        )
        listed = ", ".join(f"`{b}` ({n})" for b, n in targets) or "nothing in the package"
        rows.append(f"| `{_shown(stage)}` | {listed} |")
    return "\n".join(rows) + "\n"


def moved_table(moved_py: Path = ROOT / PACKAGE / "_moved.py") -> str:
    """``MOVED`` of triton_sam/_moved.py as a markdown table (read, not imported: the docs
    build never runs the package's import hooks)."""
    tree = ast.parse(moved_py.read_text())
    for node in ast.walk(tree):
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "MOVED":
            moved = ast.literal_eval(node.value)
            break
    else:
        raise ValueError(f"{moved_py}: no MOVED table")
    rows = ["| old import path | new import path |", "|---|---|"]
    rows += [f"| `{old}` | `{new}` |" for old, new in sorted(moved.items())]
    return "\n".join(rows) + "\n"


def import_graph_markdown() -> str:
    levels = stage_order()
    edges = stage_imports()
    return mermaid(edges, levels) + "\n" + edge_table(edges, levels)


if __name__ == "__main__":
    print(import_graph_markdown())
    print(moved_table())
