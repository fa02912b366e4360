"""scripts/check_docs.py (run by `make docs` through the mkdocs hook): pages that name a
command, pixi task or make target that does not exist, or link to a missing file or heading,
fail; the repository's own pages pass; the CLI reference is rendered from the app itself.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parents[2]


def _load_check_docs():
    spec = importlib.util.spec_from_file_location("check_docs", ROOT / "scripts" / "check_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_docs"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


check_docs = _load_check_docs()

PYPROJECT = """\
[tool.pixi.tasks]
serve = "triton-sam serve"
setup = { depends-on = ["setup-sam2"] }
setup-sam2 = "triton-sam setup sam2.1_hiera_base_plus"
"""
MAKEFILE = """\
.PHONY: install test
test: install
\t.venv/bin/pytest
demo lint: install
\techo
"""


def _toy_cli():
    """A CLI with a group, a hidden and a deprecated command, and options."""
    app = typer.Typer()
    bench = typer.Typer(help="Measurements.")

    @app.command()
    def serve(
        port: int = typer.Option(8000, "--port", "-p"),
        fuse: bool = typer.Option(True, "--fuse/--no-fuse"),
    ) -> None:
        """Serve."""

    @app.command()
    def setup(model: str) -> None:
        """Set up MODEL."""

    @app.command("old-serve", hidden=True)
    def old_serve() -> None:
        """Old."""

    @app.command("bench-click", deprecated=True)
    def bench_click_old() -> None:
        """Old name of `bench click`."""

    @bench.command("click")
    def bench_click(n: int = typer.Option(10, "--n")) -> None:
        """Clicks."""

    app.add_typer(bench, name="bench")
    return typer.main.get_command(app)


@pytest.fixture
def names(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "Makefile").write_text(MAKEFILE)
    return check_docs.Names(
        cli=_toy_cli(),
        tasks=frozenset(check_docs.pixi_tasks(tmp_path / "pyproject.toml")),
        targets=check_docs.make_targets(tmp_path / "Makefile"),
    )


def _messages(names, page: str) -> list[str]:
    return [p.message for p in check_docs.check_commands(names, page, "page.md")]


def test_pages_naming_what_exists_pass(names):
    page = """\
Run `triton-sam serve --port 9000 --no-fuse` or `pixi run setup`, then `make test`.

```bash
$ pixi run serve &
TRITON_URL=localhost:8001 triton-sam bench click --n 5 && make demo lint
.venv/bin/triton-sam serve \\
    -p 8000
triton-sam --help; triton-sam bench --help
kubectl -n triton-sam create secret generic triton-sam-admin   # a namespace, not a command
```

triton-sam turns checkpoints into models (prose, not code); `triton-sam <command>`,
`make VENV=/elsewhere/venv test`.
"""
    assert _messages(names, page) == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("`triton-sam serv`", "`triton-sam serv`: no such command (did you mean serve?)"),
        ("`triton-sam bench clik`", "`triton-sam bench clik`: no such command"),
        ("`triton-sam serve --prot 1`", "`triton-sam serve` has no option --prot"),
        ("`triton-sam old-serve`", "`triton-sam old-serve` is hidden from --help"),
        ("`triton-sam bench-click`", "`triton-sam bench-click` is deprecated"),
        ("`pixi run setup-sam3`", "`pixi run setup-sam3`: no task 'setup-sam3'"),
        ("`make tests`", "`make tests`: no target 'tests' in the Makefile (did you mean test?)"),
        ("```sh\ncd x && triton-sam stress\n```", "`triton-sam stress`: no such command"),
        ("```\ntriton-sam serve \\\n  --bogus\n```", "`triton-sam serve` has no option --bogus"),
    ],
)
def test_a_stale_name_fails(names, line, expected):
    (message,) = _messages(names, f"Intro.\n\n{line}\n")
    assert message.startswith(expected)


def test_problems_carry_the_page_and_line(names):
    problems = check_docs.check_commands(names, "one\n\ntwo `triton-sam nope`\n", "docs/x.md")
    assert [str(p) for p in problems] == ["docs/x.md:3: `triton-sam nope`: no such command"]


def test_pixi_tasks_must_run_existing_commands(names, tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(PYPROJECT + 'stress = "triton-sam stres"\nall = { depends-on = ["x"] }\n')
    names = check_docs.Names(names.cli, frozenset(check_docs.pixi_tasks(pyproject)), names.targets)
    problems = [str(p) for p in check_docs.check_pixi_tasks(names, pyproject)]
    assert problems == [
        "pyproject.toml:5: task stress: `triton-sam stres`: no such command",
        "pyproject.toml:6: task all: depends on 'x', no such task",
    ]


def test_links_must_reach_a_file_and_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## The `serve` command: flags\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Top\n\n## Quick start\n\n"
        "[ok](docs/guide.md) [ok](docs/guide.md#the-serve-command-flags) [ok](#quick-start)\n"
        "[web](https://example.org/missing) `[not a link](nowhere.md)`\n"
        "[gone](docs/missing.md)\n"
        "[no heading](docs/guide.md#usage) ![img](docs/logo.png)\n"
    )
    problems = [str(p) for p in check_docs.check_links(readme, tmp_path)]
    assert problems == [
        "README.md:7: link to docs/missing.md: no such file",
        "README.md:8: link to docs/guide.md#usage: no heading #usage in guide.md",
        "README.md:8: link to docs/logo.png: no such file",
    ]


def test_the_api_page_covers_every_public_name(tmp_path):
    init = tmp_path / "triton_sam" / "__init__.py"
    init.parent.mkdir()
    init.write_text(
        "from triton_sam.client import Client, helper\nfrom triton_sam.errors import A, B\n"
        "__version__ = '1'\n__all__ = ['A', 'B', 'Client', 'helper', '__version__']\n"
    )
    page = tmp_path / "api.md"
    page.write_text("::: triton_sam.Client\n\n::: triton_sam.errors\n")
    (problem,) = check_docs.check_api_page(page, init)
    assert "triton_sam.helper is public" in problem.message


def test_a_whole_tree_with_a_stale_page_fails(tmp_path):
    """check() over a root that is not a git checkout: every markdown page is read."""
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "Makefile").write_text(MAKEFILE)
    (tmp_path / "triton_sam").mkdir()
    (tmp_path / "triton_sam" / "__init__.py").write_text("__all__ = []\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "api.md").write_text("# API\n")
    (tmp_path / "README.md").write_text("# x\n\n`triton-sam serve` and [api](docs/api.md)\n")
    names = check_docs.load_names(tmp_path)
    assert check_docs.check(tmp_path, names, cli_help=False) == []

    (tmp_path / "docs" / "page.md").write_text("```bash\ntriton-sam serve-all\n```\n")
    problems = check_docs.check(tmp_path, names, cli_help=False)
    assert [str(p) for p in problems] == [
        "docs/page.md:2: `triton-sam serve-all`: no such command (did you mean serve?)"
    ]


def test_the_repository_pages_name_only_what_exists():
    """README.md, docs/, deploy/..., the pixi tasks and the CLI's help against the real CLI."""
    problems = check_docs.check()
    assert problems == [], "\n".join(map(str, problems))


def test_the_cli_reference_lists_every_visible_command_with_its_options():
    group = check_docs.cli_group()
    page = check_docs.cli_reference_markdown(group)
    for name, command in group.commands.items():
        heading = f"## `triton-sam {name}` {{#triton-sam-{name}}}"
        assert (heading in page) == (not command.hidden), name
    assert "`-r, --repository <path>`" in page  # serve's option, as --help prints it


def test_the_cli_reference_of_a_group_and_a_deprecated_command():
    page = check_docs.cli_reference_markdown(_toy_cli())
    assert "## `triton-sam bench click` {#triton-sam-bench-click}" in page
    assert "old-serve" not in page
    assert "**Deprecated.**" in page


def test_the_docs_lock_keeps_every_pin_of_the_main_lock():
    """`make docs` installs lock-docs.txt with --no-deps on top of lock.txt: a package both
    name at different versions would be silently replaced in the venv the tests run in."""

    def pins(name: str) -> dict[str, str]:
        text = (ROOT / "requirements" / name).read_text()
        return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M))

    main, docs = pins("lock.txt"), pins("lock-docs.txt")
    assert {"mkdocs", "mkdocs-material", "mkdocstrings-python"} <= docs.keys()
    assert {k: (main[k], docs[k]) for k in main.keys() & docs.keys() if main[k] != docs[k]} == {}


def test_a_reference_to_our_issue_numbers_fails(tmp_path):
    """Readers cannot see our tracker: "issue N" in a comment, docstring or page fails; another
    project's issue, named by its project or URL, passes."""
    ours = "iss" + "ue"  # spelled apart so that this file passes the check itself
    (tmp_path / "triton_sam").mkdir()
    (tmp_path / "triton_sam" / "a.py").write_text(
        f"x = 1  # the {ours}-13 goal\n"
        "# segment-anything #61; https://github.com/facebookresearch/sam2/issues/61\n"
        "# a tissue 3 mm thick\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(f"# Page\n\nWhat moved in {ours} 16.\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(f'"""Owns its inputs ({ours.title()} #12)."""\n')
    (tmp_path / "tests" / "blob.bin").write_bytes(b"\0" + f"{ours} 1".encode())
    problems = check_docs.check_issue_references(tmp_path)
    assert [(p.where, p.line) for p in problems] == [
        ("docs/page.md", 3),
        ("tests/test_x.py", 1),
        ("triton_sam/a.py", 1),
    ]
    assert "readers cannot see our issues" in problems[0].message


def test_the_repository_cites_no_issue_numbers_of_ours():
    problems = check_docs.check_issue_references()
    assert problems == [], "\n".join(map(str, problems))
