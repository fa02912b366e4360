"""``triton-sam label-studio``: the Label Studio ML backend's helpers (precompute), and the
options ``triton-sam gateway --label-studio`` turns into the backend's settings.

Label Studio's API key is read from ``$LABEL_STUDIO_API_KEY`` or a file
(``--label-studio-api-key-file``), never from a command-line argument, where ``ps`` and shell
histories would show it.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated

import typer

from triton_sam.cli.app import app
from triton_sam.cli.options import Protocol, ProtocolOpt
from triton_sam.errors import InputValidationError

API_KEY_ENV = "LABEL_STUDIO_API_KEY"
URL_ENV = "LABEL_STUDIO_URL"

label_studio_app = typer.Typer(
    name="label-studio",
    help="Label Studio's ML backend: precompute a project.",
    no_args_is_help=True,
)
app.add_typer(label_studio_app)

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--label-studio-url",
        envvar=URL_ENV,
        help="Label Studio's URL (task images are fetched from its origin with its API key).",
    ),
]
ApiKeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--label-studio-api-key-file",
        help=f"File holding Label Studio's API key (else ${API_KEY_ENV}).",
    ),
]
AllowOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--label-studio-allow-origin",
        help="Another origin (scheme://host[:port]) task images may come from, fetched "
        "without the key, e.g. a storage bucket (repeatable).",
    ),
]


def read_api_key(path: Path | None) -> str | None:
    """The API key from ``path`` (its first line) or ``$LABEL_STUDIO_API_KEY``; None if neither.

    Raises:
        InputValidationError: the file cannot be read or is empty.
    """
    if path is not None:
        try:
            key = path.read_text().strip().splitlines()
        except OSError as e:
            raise InputValidationError(
                "label_studio_api_key_file", f"cannot read {path}: {e.strerror}"
            ) from None
        if not key or not key[0].strip():
            raise InputValidationError("label_studio_api_key_file", f"{path} is empty")
        return key[0].strip()
    return os.environ.get(API_KEY_ENV, "").strip() or None


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def backend_routes(
    *,
    triton_url: str,
    protocol: str,
    host: str,
    port: int,
    url: str | None,
    model_type: str,
    api_key_file: Path | None,
    allow_origins: list[str] | None,
    tokens_file: Path | None,
):
    """The backend's routes for ``gateway --label-studio`` (says at start how it is secured).

    Raises:
        InputValidationError: no Label Studio URL, an unreadable key or tokens file, or a
            non-loopback ``host`` without tokens (an open backend stays on this machine).
    """
    from triton_sam.label_studio import (
        PREFIX,
        FetchPolicy,
        LabelStudioOptions,
        TritonOptions,
        label_studio_routes,
    )
    from triton_sam.scaleout.access import read_tokens_file

    if not url:
        raise InputValidationError(
            "label_studio_url", f"missing: give --label-studio-url or ${URL_ENV}"
        )
    key = read_api_key(api_key_file)
    tokens = read_tokens_file(tokens_file) if tokens_file is not None else {}
    if not tokens and not is_loopback(host):
        raise InputValidationError(
            "host",
            f"{host!r} without --label-studio-tokens-file: a backend without tokens listens "
            "on localhost only (127.0.0.1)",
        )
    options = LabelStudioOptions(
        fetch=FetchPolicy(url, api_key=key, allowed_origins=tuple(allow_origins or ())),
        triton=TritonOptions(url=triton_url, protocol=protocol, model_type=model_type),
        tokens=tokens,
    )
    if tokens:
        typer.echo(
            f"label-studio: {len(tokens)} token(s): requests need one (Basic auth password "
            "or Bearer); each goes to Triton as its tenant"
        )
    else:
        typer.echo(
            "label-studio: no tokens: open to this machine only, every request in the "
            "default tenant (--label-studio-tokens-file to require tokens)"
        )
    if key is None:
        typer.echo(f"label-studio: no API key (${API_KEY_ENV}): images are fetched without one")
    typer.echo(f"label-studio: backend at http://{host}:{port}{PREFIX} ({options.model_version})")
    return label_studio_routes(options)


@label_studio_app.command("precompute")
def precompute_cmd(
    project: Annotated[int, typer.Option(help="The Label Studio project id.")],
    url: UrlOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    allow_origin: AllowOpt = None,
    triton_url: Annotated[str, typer.Option(help="Triton's address.")] = "localhost:8001",
    protocol: ProtocolOpt = Protocol.grpc,
    model_type: Annotated[str, typer.Option(help="Family served (sam2, sam1, sam3).")] = "sam2",
    tenant: Annotated[
        str,
        typer.Option(help="The tenant the backend clicks in (its token's; '' = default)."),
    ] = "",
) -> None:
    """Embed every task image of a project on the server, so each first click is fast."""
    from tqdm import tqdm

    from triton_sam.label_studio import Fetcher, FetchPolicy, Segmenter, TritonOptions
    from triton_sam.label_studio.precompute import precompute_project

    if not url:
        raise InputValidationError(
            "label_studio_url", f"missing: give --label-studio-url or ${URL_ENV}"
        )
    policy = FetchPolicy(
        url, api_key=read_api_key(api_key_file), allowed_origins=tuple(allow_origin or ())
    )
    fetcher = Fetcher(policy)
    segmenter = Segmenter(TritonOptions(url=triton_url, protocol=protocol, model_type=model_type))
    try:
        with tqdm(desc=f"project {project}", unit="image") as bar:
            report = precompute_project(
                fetcher, segmenter, project, tenant=tenant, on_task=lambda: bar.update(1)
            )
    finally:
        fetcher.close()
    typer.echo(f"{report.tasks} tasks, {report.embedded} images sent to embed")
    for task_id, reason in report.failed:
        typer.echo(f"  task {task_id}: {reason}")
    if report.failed:
        raise typer.Exit(1)
