"""The root ``triton-sam`` app, its ``bench`` and ``proxy`` groups, the renamed commands' notes
and the entry point (a package error: its message and exit 1, no traceback).

The command modules (``cli/setup.py``, ``cli/serve.py``...) register their commands on these
apps; ``cli/__init__.py`` imports them in the order ``triton-sam --help`` lists them.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from triton_sam.cli import logs
from triton_sam.errors import TritonSamError

app = typer.Typer(
    name="triton-sam",
    help=(
        "Serve Segment Anything on NVIDIA Triton.\n\n"
        "Flow: download -> export (ONNX, verified against torch) -> repository -> serve "
        "(docker compose or `serve`) -> client (triton_sam.SAM2TritonClient).\n\n"
        "OVERRIDES: hydra's key=value, e.g. export.fp16=true (see `triton-sam config`)."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def renamed_note(old: str, new: str) -> None:
    """Tell the user (on stderr) that ``old`` is now spelled ``new``."""
    typer.echo(
        f"`triton-sam {old}` is now `triton-sam {new}`; the old name goes in the next release",
        err=True,
    )


class _BenchGroup(TyperGroup):
    """``triton-sam bench``: the measurements. Options with no subcommand (``triton-sam bench
    --model X``, the old spelling of ``bench users``) still run ``bench users``, with a note."""

    #: The order of `triton-sam bench --help`: what most users run first.
    ORDER = (
        "users",
        "click",
        "backends",
        "video",
        "concepts",
        "stress",
        "soak",
        "storm",
        "replicas",
        "perf-analyzer",
    )

    def list_commands(self, ctx: typer.Context) -> list[str]:
        rank = {name: i for i, name in enumerate(self.ORDER)}
        return sorted(super().list_commands(ctx), key=lambda name: rank.get(name, len(rank)))

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0].startswith("-") and args[0] not in ctx.help_option_names:
            renamed_note("bench", "bench users")
            args = ["users", *args]
        return super().parse_args(ctx, args)


bench_app = typer.Typer(
    name="bench",
    cls=_BenchGroup,
    help="Latency, throughput, cancellation, soak, scale-out.",
    no_args_is_help=True,
)
proxy_app = typer.Typer(
    name="proxy",
    help="The nginx proxy before Triton replicas: config, tokens.",
    no_args_is_help=True,
)
app.add_typer(bench_app)
app.add_typer(proxy_app)

#: Old command names -> their new spelling; kept, hidden, for one release.
RENAMED = {
    "bench-click": "bench click",
    "bench-backends": "bench backends",
    "bench-video": "bench video",
    "bench-concepts": "bench concepts",
    "bench-replicas": "bench replicas",
    "bench-storm": "bench storm",
    "perf-analyzer": "bench perf-analyzer",
    "stress": "bench stress",
    "soak": "bench soak",
    "proxy-config": "proxy config",
    "proxy-token": "proxy token",
}


def _renamed_command(old: str, new: str) -> type[TyperCommand]:
    """A command class that prints the renaming note before anything else (--help included)."""

    class Renamed(TyperCommand):
        def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
            renamed_note(old, new)
            return super().parse_args(ctx, args)

    return Renamed


def add_renamed_commands() -> None:
    """Register each old name of :data:`RENAMED`, hidden, over its new command's callback
    (call it once, after the command modules registered theirs)."""
    apps = {"bench": bench_app, "proxy": proxy_app}
    for old, new in RENAMED.items():
        group, name = new.split(" ", 1)
        info = next(c for c in apps[group].registered_commands if c.name == name)
        app.command(old, hidden=True, cls=_renamed_command(old, new), help=info.callback.__doc__)(
            info.callback
        )


@app.callback()
def _global_options(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Also show other libraries' INFO logs and warnings (onnxruntime's "
            "optimizer, onnx, torch's exporter).",
        ),
    ] = False,
) -> None:
    logs.setup_logging(verbose=verbose)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except TritonSamError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
