"""mkdocs hooks (mkdocs.yml): the pages are checked against the code before the site is built,
and the CLI reference page is rendered from the typer app itself, never committed, so it can
not go stale. See scripts/check_docs.py for what is checked. The architecture page's import
picture and moved-from table are generated the same way (scripts/docs_import_graph.py), in
place of the markers it holds.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_docs  # noqa: E402  (found through the line above)
import docs_import_graph  # noqa: E402

# marker in a page -> what replaces it at build time
GENERATED = {
    "<!-- generated: import-graph -->": docs_import_graph.import_graph_markdown,
    "<!-- generated: moved-from -->": docs_import_graph.moved_table,
}

CLI_PAGE = "cli.md"


def on_pre_build(config) -> None:
    problems = check_docs.check()
    if problems:
        lines = "\n".join(f"  {p}" for p in problems)
        raise PluginError(
            f"{len(problems)} problem(s): the pages name commands, tasks or files "
            f"that do not exist:\n{lines}"
        )


def on_files(files: Files, config) -> Files:
    if files.get_file_from_path(CLI_PAGE) is not None:
        raise PluginError(f"docs/{CLI_PAGE} is generated at build time: remove the committed one")
    files.append(File.generated(config, CLI_PAGE, content=check_docs.cli_reference_markdown()))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, render in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
