"""``triton-sam proxy``: the nginx proxy before Triton replicas (its configuration, its bearer
tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from triton_sam.cli.app import proxy_app
from triton_sam.scaleout.nginx import (
    compose_config,
    new_token,
    read_tokens_file,
    render_nginx_conf,
    write_tokens_file,
)


@proxy_app.command("config")
def proxy_config_cmd(
    replicas: Annotated[int, typer.Option(min=1, help="Triton replicas (one per GPU).")] = 2,
    host_pattern: Annotated[
        str, typer.Option(help="Replica host names; {i} is the replica index.")
    ] = "triton-{i}",
    tokens_file: Annotated[
        str | None,
        typer.Option(help="Bearer tokens on: the tokens file's path as nginx sees it."),
    ] = None,
) -> None:
    """Print the image-affine nginx configuration of deploy/compose for N replicas
    (consistent hash of the clients' x-sam-image-id header, HTTP and gRPC); with
    --tokens-file, requests need a bearer token and carry its tenant."""
    config = compose_config(replicas, host_pattern=host_pattern, tokens_file=tokens_file)
    typer.echo(render_nginx_conf(config), nl=False)


@proxy_app.command("token")
def proxy_token_cmd(
    tenant: Annotated[str, typer.Argument(help="The tenant (team) the new token stands for.")],
    file: Annotated[
        Path, typer.Option(help="The proxy's tokens file (created owner-only if missing).")
    ] = Path("deploy/compose/tokens/tokens.map"),
) -> None:
    """Add a bearer token for TENANT to the proxy's tokens file and print it (once: only the
    file keeps it). Restart or reload the proxy to use it."""
    tokens = read_tokens_file(file) if file.exists() else {}
    token = new_token()
    write_tokens_file(file, {**tokens, token: tenant})
    typer.echo(token)
