"""``triton-sam``: thin typer entry points over the package (logic lives in the modules).

One module per command group, each registering its commands on the apps of
:mod:`triton_sam.cli.app`; the shared options are declared once in
:mod:`triton_sam.cli.options`. User errors (TritonSamError) print their message and exit 1,
without a traceback.
"""

from __future__ import annotations

from triton_sam.cli.app import RENAMED, add_renamed_commands, app, bench_app, main, proxy_app

# Imported for their commands, in the order `triton-sam --help` lists them.
# isort: off
from triton_sam.cli import setup, video, serve, tools, large  # noqa: F401
from triton_sam.cli import bench, load, proxy, label_studio  # noqa: F401
# isort: on

add_renamed_commands()

__all__ = ["RENAMED", "app", "bench_app", "main", "proxy_app"]
