"""Check the documentation against the code, and render the CLI reference from the CLI itself.

Every markdown page of the repository (README.md, docs/, deploy/...), the pixi tasks in
pyproject.toml and the CLI's own help texts are read for command lines, and each one must
name something that exists:

- ``triton-sam <command> [<subcommand>] [--option]``: a command of the typer app, shown in
  ``triton-sam --help`` (a hidden or deprecated command is stale too: pages teach the names a
  user is meant to type), with options that command takes;
- ``pixi run <task>``: a task of pyproject's ``[tool.pixi.tasks]`` (also every task's
  ``depends-on``);
- ``make <target>``: a target of the Makefile.

Command lines are read from code only (fenced blocks and inline code spans), at the start of
a shell command (after ``$``, ``&&``, ``|``, ``;``, environment assignments...), so a prose
mention of the project or ``kubectl -n triton-sam ...`` is not mistaken for a command.

No file of the sources, tests, docs, examples or deploy/ may cite an issue number of ours
("issue N" with a number): readers of the repository cannot see the tracker.

Relative links of the pages outside docs/ (README.md, deploy/README.md...) must point to files
that exist, and their ``#anchors`` to headings of the target page (GitHub's heading ids); the
pages inside docs/ are checked by ``mkdocs build --strict``, which renders them.

Run: ``python scripts/check_docs.py`` (exit 1 and one line per problem). ``make docs`` runs it
through the mkdocs hook (scripts/mkdocs_hooks.py) before building the site, which also writes
the CLI reference page with :func:`cli_reference_markdown`.
"""

from __future__ import annotations

import ast
import difflib
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CLI_NAME = "triton-sam"

# Words that run the command after them (`sudo triton-sam serve`, `time make test`).
_WRAPPERS = {"sudo", "time", "exec", "env", "nohup", "command"}
# Shell operators that start a new command.
_SEPARATORS = re.compile(r"&&|\|\||[;|()]|\$\(|`")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# A name a page could mean as a command, task or target: anything else (`<what>`, `...`,
# `$TASK`) is a placeholder and left alone.
_WORD = re.compile(r"^[a-z][a-z0-9_.-]*$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
_INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


@dataclass(frozen=True)
class Problem:
    """One thing a page says that the code does not have."""

    where: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Names:
    """What exists: the CLI's command tree, the pixi tasks and the Makefile targets."""

    cli: Any  # the root click group (typer ships its own copy of click: duck-typed here)
    tasks: frozenset[str]
    targets: frozenset[str]


# --- what exists -------------------------------------------------------------------------


def _is_group(command: Any) -> bool:
    return hasattr(command, "commands")


def _is_option(param: Any) -> bool:
    return param.param_type_name == "option"


def cli_group() -> Any:
    """The click group behind the typer app, imported from this checkout."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import typer

    from triton_sam.cli import app

    group = typer.main.get_command(app)
    assert _is_group(group), type(group)
    return group


def pixi_tasks(pyproject: Path) -> dict[str, str | dict]:
    """Every pixi task (``[tool.pixi.tasks]`` and each feature's), by name."""
    pixi = tomllib.loads(pyproject.read_text()).get("tool", {}).get("pixi", {})
    tasks = dict(pixi.get("tasks", {}))
    for feature in pixi.get("feature", {}).values():
        tasks.update(feature.get("tasks", {}))
    return tasks


def make_targets(makefile: Path) -> frozenset[str]:
    """The Makefile's explicit targets (``name:`` rules and .PHONY names)."""
    targets: set[str] = set()
    for line in makefile.read_text().splitlines():
        if line.startswith(".PHONY:"):
            targets.update(line.split(":", 1)[1].split())
            continue
        m = re.match(
            r"^([A-Za-z0-9][A-Za-z0-9_.-]*(?:\s+[A-Za-z0-9][A-Za-z0-9_.-]*)*)\s*:(?!=)", line
        )
        if m:
            targets.update(m.group(1).split())
    return frozenset(targets)


def load_names(root: Path = ROOT) -> Names:
    return Names(
        cli=cli_group(),
        tasks=frozenset(pixi_tasks(root / "pyproject.toml")),
        targets=make_targets(root / "Makefile"),
    )


# --- command lines in markdown ---------------------------------------------------------


def code_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, code) for each line of a fenced block and each inline code span.

    A fenced line ending in a backslash is joined with the next one, as the shell does.
    """
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(2)
                continue
            for span in _INLINE_CODE.finditer(line):
                yield number, span.group(2).strip()
            continue
        if m and m.group(2).startswith(fence) and not m.group(3).strip():
            fence = None
            if pending:
                yield pending
                pending = None
            continue
        if pending:
            number, line = pending[0], pending[1] + " " + line.strip()
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        yield number, line


def shell_commands(code: str) -> Iterator[list[str]]:
    """The words of each command in a line of shell (comments and prompts dropped)."""
    code = re.sub(r"(^|\s)#.*$", "", code)
    for part in _SEPARATORS.split(code):
        try:
            words = shlex.split(part)
        except ValueError:  # an unbalanced quote in prose-like code: split on spaces
            words = part.split()
        while words and (
            words[0] in _WRAPPERS or words[0] in {"$", ">", "%"} or _ASSIGNMENT.match(words[0])
        ):
            words.pop(0)
        if words:
            yield words


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _option_names(command: Any) -> dict[str, Any]:
    names: dict[str, Any] = {"--help": None, "-h": None}
    for param in command.params:
        if _is_option(param):
            for opt in [*param.opts, *param.secondary_opts]:
                names[opt] = param
    return names


def check_cli_words(names: Names, words: list[str]) -> Iterator[str]:
    """Problems of one ``triton-sam ...`` command line (``words`` after the program name)."""
    command = names.cli
    path = [CLI_NAME]
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            return
        if word.startswith("-"):
            if not re.match(r"^--?[A-Za-z]", word):
                continue  # a negative number or a lone dash, not an option
            name = word.split("=", 1)[0]
            options = _option_names(command)
            if name not in options:
                yield (
                    f"`{' '.join(path)}` has no option {name}"
                    f"{_suggest(name, [o for o in options if o.startswith('--')])}"
                )
                return
            param = options[name]
            takes_value = param is not None and not param.is_flag and not param.count
            if takes_value and "=" not in word:
                i += 1
            continue
        if not _is_group(command):
            continue  # an argument of a leaf command (a model name, a path)
        if not _WORD.match(word):
            return  # a placeholder: `triton-sam <command>`
        sub = command.commands.get(word)
        if sub is None:
            visible = [n for n, c in command.commands.items() if not c.hidden]
            yield f"`{' '.join(path)} {word}`: no such command{_suggest(word, visible)}"
            return
        path.append(word)
        if sub.deprecated or sub.hidden:
            why = "deprecated" if sub.deprecated else "hidden from --help"
            yield f"`{' '.join(path)}` is {why}: name the command users see in --help"
            return
        command = sub


def check_command(names: Names, words: list[str]) -> Iterator[str]:
    """Problems of one shell command, if it runs triton-sam, pixi run or make."""
    program = words[0].rsplit("/", 1)[-1]
    rest = words[1:]
    if program == "python" and rest[:2] == ["-m", "triton_sam.cli"]:
        program, rest = CLI_NAME, rest[2:]
    if program == CLI_NAME:
        yield from check_cli_words(names, rest)
    elif program == "pixi" and rest[:1] == ["run"]:
        rest = rest[1:]
        while rest and rest[0].startswith("-"):  # pixi run's own options (-e ENV, --frozen)
            rest = rest[2:] if rest[0] in {"-e", "--environment", "--manifest-path"} else rest[1:]
        if not rest or not _WORD.match(rest[0]):
            return
        if rest[0] == CLI_NAME:
            yield from check_cli_words(names, rest[1:])
        elif rest[0] not in names.tasks:
            yield (
                f"`pixi run {rest[0]}`: no task {rest[0]!r} in pyproject.toml's "
                f"[tool.pixi.tasks]{_suggest(rest[0], names.tasks)}"
            )
    elif program == "make":
        for word in rest:
            if word.startswith("-") or "=" in word or not _WORD.match(word):
                continue
            if word not in names.targets:
                hint = _suggest(word, names.targets)
                yield f"`make {word}`: no target {word!r} in the Makefile{hint}"


def check_commands(names: Names, text: str, where: str) -> list[Problem]:
    """Every stale command line in the code of one markdown text."""
    problems = []
    for number, code in code_lines(text):
        for words in shell_commands(code):
            problems += [Problem(where, number, m) for m in check_command(names, words)]
    return problems


def check_pixi_tasks(names: Names, pyproject: Path) -> list[Problem]:
    """Each task's command line and ``depends-on`` must name what exists."""
    problems = []
    where = pyproject.name
    lines = pyproject.read_text().splitlines()
    for task, spec in pixi_tasks(pyproject).items():
        line = next(
            (
                n
                for n, text in enumerate(lines, 1)
                if re.match(rf'^\s*"?{re.escape(task)}"?\s*=', text)
            ),
            0,
        )
        cmd = spec if isinstance(spec, str) else spec.get("cmd", "")
        depends = [] if isinstance(spec, str) else spec.get("depends-on", [])
        for words in shell_commands(cmd if isinstance(cmd, str) else " ".join(cmd)):
            problems += [
                Problem(where, line, f"task {task}: {m}") for m in check_command(names, words)
            ]
        for dep in depends:
            dep = dep if isinstance(dep, str) else dep.get("task", "")
            if dep not in names.tasks:
                problems.append(
                    Problem(where, line, f"task {task}: depends on {dep!r}, no such task")
                )
    return problems


# --- links --------------------------------------------------------------------------------

_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)"
)
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HTML_REF = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")


def _without_code(text: str) -> str:
    """The text with fenced blocks and code spans blanked (line numbers kept)."""
    out, fence = [], None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
            out.append("")
        elif fence is not None:
            if m and m.group(2).startswith(fence) and not m.group(3).strip():
                fence = None
            out.append("")
        else:
            out.append(_INLINE_CODE.sub("", line))
    return "\n".join(out)


def github_anchors(text: str) -> set[str]:
    """The ids GitHub gives the headings of a markdown page (and explicit ``id``/``name``)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _without_code_keep_headings(text):
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # links: their text
        title = re.sub(r"<[^>]+>", "", title).replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    anchors.update(re.findall(r"""<a\s[^>]*(?:name|id)\s*=\s*["']([^"']+)["']""", text))
    return anchors


def _without_code_keep_headings(text: str) -> list[str]:
    lines, fence = [], None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
        elif fence is not None:
            if m and m.group(2).startswith(fence) and not m.group(3).strip():
                fence = None
        else:
            lines.append(line)
    return lines


def check_links(page: Path, root: Path = ROOT) -> list[Problem]:
    """Relative links of one page: the file exists, and a markdown target has the anchor."""
    text = page.read_text()
    where = str(page.relative_to(root))
    problems = []
    for number, line in enumerate(_without_code(text).splitlines(), start=1):
        targets = [m.group(1) for pattern in (_LINK, _HTML_REF) for m in pattern.finditer(line)]
        targets += [m.group(1) for m in _REF_DEF.finditer(line)]
        for target in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http(s), mailto: checked by nobody offline
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                problems.append(Problem(where, number, f"link to {target}: no such file"))
                continue
            if anchor and dest.suffix == ".md" and anchor not in github_anchors(dest.read_text()):
                problems.append(
                    Problem(where, number, f"link to {target}: no heading #{anchor} in {dest.name}")
                )
    return problems


# --- the API page -------------------------------------------------------------------------


def public_api(package_init: Path) -> dict[str, str]:
    """The package's ``__all__``: name -> the module it is imported from (dunders left out)."""
    tree = ast.parse(package_init.read_text())
    origin: dict[str, str] = {}
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            origin.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            exported = list(ast.literal_eval(node.value))
    return {name: origin.get(name, "") for name in exported if not name.startswith("__")}


def check_api_page(page: Path, package_init: Path) -> list[Problem]:
    """Each public name has its ``::: triton_sam.NAME`` (or its whole module's) on the page."""
    if not page.exists():
        return [Problem(str(page.name), 0, "the API reference page is missing")]
    rendered = set(re.findall(r"^:::\s*(\S+)", page.read_text(), re.M))
    package = package_init.parent.name
    return [
        Problem(
            f"docs/{page.name}",
            0,
            f"{package}.{name} is public ({package}.__all__) but not on the page: "
            f"add `::: {package}.{name}`",
        )
        for name, module in public_api(package_init).items()
        if f"{package}.{name}" not in rendered and module not in rendered
    ]


# --- references to the issue tracker ------------------------------------------------------

# "issue N", "issue-N", "Issue #N", "issues N" (N a number): our tracker, which readers of the
# repository cannot see, so the text must give the reason itself (or point to the page that
# does). Another project's issue is named by its project or URL ("segment-anything #61",
# ".../issues/61") and passes.
_ISSUE_REFERENCE = re.compile(r"(?<![/\w])issues?[- ]?#?\d+\b", re.I)
#: Where user-facing text and comments live.
ISSUE_SCANNED = (
    "README.md",
    "Makefile",
    "pyproject.toml",
    "docs",
    "deploy",
    "examples",
    "scripts",
    "tests",
    "triton_sam",
)


def scanned_files(root: Path = ROOT) -> list[Path]:
    """The files of :data:`ISSUE_SCANNED`: tracked or new, not ignored (without git: a walk)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *ISSUE_SCANNED],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        return sorted(root / p for p in listed if (root / p).is_file())
    except (OSError, subprocess.CalledProcessError):
        found = [root / name for name in ISSUE_SCANNED if (root / name).is_file()]
        for name in ISSUE_SCANNED:
            if (root / name).is_dir():
                found += [
                    p
                    for p in (root / name).rglob("*")
                    if p.is_file() and not any(part.startswith(".") for part in p.parts)
                ]
        return sorted(found)


def check_issue_references(root: Path = ROOT, files: Iterable[Path] | None = None) -> list[Problem]:
    """Each mention of an issue number of ours in the sources, tests, docs and examples."""
    problems = []
    for path in scanned_files(root) if files is None else files:
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        where = str(path.relative_to(root))
        for number, line in enumerate(data.decode(errors="replace").splitlines(), start=1):
            for m in _ISSUE_REFERENCE.finditer(line):
                problems.append(
                    Problem(
                        where,
                        number,
                        f"{m.group(0)!r}: readers cannot see our issues; say the reason itself "
                        "or point to the page that explains it",
                    )
                )
    return problems


# --- the pages ----------------------------------------------------------------------------


def markdown_pages(root: Path = ROOT) -> list[Path]:
    """The repository's markdown pages: tracked or new, not ignored (a plain walk without git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return sorted(root / p for p in listed if (root / p).is_file())
    except (OSError, subprocess.CalledProcessError):
        skip = {"site", "build", "dist", "outputs", "node_modules"}
        return sorted(
            p
            for p in root.rglob("*.md")
            if not any(part.startswith(".") or part in skip for part in p.relative_to(root).parts)
        )


def check(root: Path = ROOT, names: Names | None = None, *, cli_help: bool = True) -> list[Problem]:
    """Every problem of the repository's pages, pixi tasks and the CLI's help texts."""
    names = names or load_names(root)
    problems: list[Problem] = []
    for page in markdown_pages(root):
        where = str(page.relative_to(root))
        problems += check_commands(names, page.read_text(), where)
        if not where.startswith("docs/"):
            problems += check_links(page, root)
    problems += check_pixi_tasks(names, root / "pyproject.toml")
    problems += check_api_page(root / "docs" / "api.md", root / "triton_sam" / "__init__.py")
    problems += check_issue_references(root)
    if cli_help:
        problems += check_commands(names, cli_reference_markdown(names.cli), "triton-sam --help")
    return problems


# --- the CLI reference ------------------------------------------------------------------


def _escape(text: str) -> str:
    """Help text as markdown: code spans kept, characters markdown would act on escaped."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([\\*_\[\]])", r"\\\1", parts[i]).replace("<", "&lt;")
    return "".join(parts)


def _help_markdown(text: str) -> str:
    """Click help text (paragraphs; a ``\\b`` paragraph is preformatted) as markdown."""
    blocks = []
    for para in re.split(r"\n\s*\n", text.strip()):
        if para.startswith("\b"):
            blocks.append("```text\n" + para.lstrip("\b\n") + "\n```")
        else:
            blocks.append(_escape(" ".join(line.strip() for line in para.splitlines())))
    return "\n\n".join(blocks)


def _commands(group: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub_ctx = command.context_class(command, info_name=name, parent=ctx)
        yield sub_ctx, command
        if _is_group(command):
            yield from _commands(command, sub_ctx)


def _anchor(ctx: Any) -> str:
    return ctx.command_path.replace(" ", "-")


def cli_reference_markdown(group: Any = None) -> str:
    """The CLI reference page: every visible command with its usage, arguments and options."""
    group = group or cli_group()
    root_ctx = group.context_class(group, info_name=CLI_NAME)
    commands = list(_commands(group, root_ctx))
    out = [
        "# Command line",
        "",
        "Generated from the `triton-sam` app when the site is built, so it is always the help "
        "of the commands as they are (`triton-sam COMMAND --help` prints the same).",
        "",
        _help_markdown(group.help or ""),
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    for ctx, command in commands:
        summary = _escape(command.get_short_help_str(limit=120)).replace("|", "\\|")
        out.append(f"| [`{ctx.command_path}`](#{_anchor(ctx)}) | {summary} |")
    for ctx, command in commands:
        out += ["", f"## `{ctx.command_path}` {{#{_anchor(ctx)}}}", ""]
        if command.deprecated:
            out += ["**Deprecated.**", ""]
        out += [
            "```text",
            f"{ctx.command_path} {' '.join(command.collect_usage_pieces(ctx))}",
            "```",
            "",
        ]
        out += [_help_markdown(command.help or ""), ""]
        params = [p for p in command.get_params(ctx) if p.get_help_record(ctx)]
        for title, kind in (("Arguments", "argument"), ("Options", "option")):
            records = [p.get_help_record(ctx) for p in params if p.param_type_name == kind]
            if records:
                out += [f"**{title}**", ""]
                out += [
                    f"- `{opts}`: {_escape(text)}" if text else f"- `{opts}`"
                    for opts, text in records
                ]
                out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    problems = check()
    for problem in problems:
        print(problem)
    if problems:
        print(
            f"{len(problems)} problem(s): the pages must name commands, tasks and files that "
            "exist, and no text may cite our issue numbers"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
