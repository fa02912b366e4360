"""The options several commands share, declared once, and the one parser of comma lists.

Each alias carries the option's name and help; the default stays at the parameter (``model:
VariantOpt = DEFAULT_MODEL``) so ``--help`` shows it. Values a command parses further (comma
lists) are read by :func:`csv`, whose error names the option.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from triton_sam.errors import InputValidationError

T = TypeVar("T")

#: The variant a command serves, exports or measures when none is named.
DEFAULT_MODEL = "sam2.1_hiera_tiny"


class Protocol(StrEnum):
    """The wire protocol to Triton (a ``str``: compares and formats as its value)."""

    grpc = "grpc"
    http = "http"


# -- what to build ----------------------------------------------------------------------------

ModelArg = Annotated[
    str, typer.Argument(help=f"Variant name, e.g. {DEFAULT_MODEL} (see `triton-sam models`).")
]
VariantOpt = Annotated[str, typer.Option("--model", help="Variant to serve or benchmark.")]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Config overrides, key=value (hydra syntax).")
]
RepositoryOpt = Annotated[
    Path | None, typer.Option("--repository", "-r", help="Model repository directory.")
]
RandomInitOpt = Annotated[
    bool, typer.Option("--random-init", help="Skip the download; export random weights.")
]
Fp16Opt = Annotated[bool, typer.Option("--fp16", help="fp16 weights/compute, fp32 I/O.")]
TargetOpt = Annotated[
    str | None,
    typer.Option("--target", help="Repository target: onnxruntime (GPU container) | python."),
]
SuffixOpt = Annotated[str, typer.Option(help="Precision suffix: '' (fp32), _fp16, _q4...")]
WorkDirOpt = Annotated[
    Path, typer.Option("--work-dir", help="Scratch directory: exports, graphs (reused).")
]

# -- which server -----------------------------------------------------------------------------

ProtocolOpt = Annotated[Protocol, typer.Option("--protocol", help="Protocol to the server.")]
ServerUrlOpt = Annotated[str | None, typer.Option(help="Server URL (default $TRITON_URL).")]
RunningUrlOpt = Annotated[
    str | None, typer.Option("--url", help="A running server instead of an embedded one.")
]
ModelTypeOpt = Annotated[str, typer.Option(help="Model family of --url's models.")]

# -- what to measure --------------------------------------------------------------------------

NEncodeOpt = Annotated[int, typer.Option(min=1, help="Timed encodes per path.")]
ImageOpt = Annotated[Path | None, typer.Option(help="Image (default: synthetic).")]
SessionsOpt = Annotated[int, typer.Option(min=1, help="Concurrent sessions.")]
LevelsOpt = Annotated[
    str, typer.Option("--concurrency", help="Comma-separated concurrency levels.")
]
ReportDirOpt = Annotated[Path, typer.Option("--output", help="Report directory.")]


def csv(
    text: str,
    *,
    option: str,
    item: Callable[[str], T] = str,  # type: ignore[assignment]
    choices: Collection[str] | None = None,
    expected: str = "a comma-separated list",
) -> list[T]:
    """A comma-separated option value as a list: blanks dropped, duplicates kept once.

    Args:
        text: the value as typed, e.g. ``"1,4,16"``.
        option: the option's name for the error (``"--concurrency"``).
        item: converts one element; a ``ValueError`` it raises is the user's mistake.
        choices: the allowed elements, when they are a fixed set.
        expected: what a valid value looks like, for the error.

    Returns:
        The elements, converted, in the order given.

    Raises:
        InputValidationError: no element, an element ``item`` refuses or one not in
            ``choices``; the message names ``option``, the value and what was expected.
    """
    words = list(dict.fromkeys(w.strip() for w in text.split(",") if w.strip()))
    if choices is not None:
        expected = f"a comma-separated list from {', '.join(choices)}"
    try:
        values = [item(w) for w in words]
    except ValueError:  # the element's own message would speak of int(), not of the option
        values = []
    if not values or (choices is not None and not set(words) <= set(choices)):
        raise InputValidationError(option, f"got {text!r}, expected {expected}")
    return values


def positive_int(text: str) -> int:
    """An integer >= 1 (a concurrency level, a storm size)."""
    value = int(text)
    if value < 1:
        raise ValueError(f"{value} is below 1")
    return value


def levels(text: str, option: str = "--concurrency") -> list[int]:
    """Comma-separated integers >= 1, e.g. concurrency levels ``1,4,16``."""
    return csv(text, option=option, item=positive_int, expected="integers >= 1, e.g. 1,4,16")


def size(n: int) -> str:
    """Bytes for people: a click's few hundred bytes must not print as 0.00 MiB."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def echo_report(paths: dict[str, Path]) -> None:
    """Print a written benchmark report: its markdown, then where every file went."""
    typer.echo(paths["md"].read_text())
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()))


def finish_report(paths: dict[str, Path], failed: bool) -> None:
    """:func:`echo_report`, then exit 1 when the run ``failed`` (the command's CI verdict)."""
    echo_report(paths)
    if failed:
        raise typer.Exit(1)


def switch(help: str) -> Any:
    """A ``--name/--no-name`` flag of a command (its default set where it is used)."""
    return Annotated[bool, typer.Option(help=help)]


def path_option(help: str) -> Any:
    """An optional file or folder (``--name PATH``; its default, None, is set where it is
    used and the help says what None means)."""
    return Annotated[Path | None, typer.Option(help=help)]


def paintera_option(help: str, kind: Any = str) -> Any:
    """An option of `setup paintera`, shown in its own help panel."""
    return Annotated[kind, typer.Option(help=help, rich_help_panel="MODEL paintera")]
