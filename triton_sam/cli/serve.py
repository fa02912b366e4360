"""Serving: the embedded tritonserver (``serve``), the SAM_service gateway, the admin key, and a
smoke test of a running server (``check``).

The server, the repository writers and the gateway (uvicorn) are imported inside the
commands: ``triton-sam --help`` must not load them.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from triton_sam.cli.app import app
from triton_sam.cli.label_studio import AllowOpt, ApiKeyFileOpt, UrlOpt, backend_routes
from triton_sam.cli.options import ImageOpt, Protocol, ProtocolOpt, RepositoryOpt, ServerUrlOpt
from triton_sam.client import SAM2TritonClient
from triton_sam.setup.settings import load_config, section
from triton_sam.tools.sample import sample_image


@app.command("serve", short_help="Run the embedded tritonserver (no Docker) until Ctrl-C.")
def serve_cmd(
    repository: RepositoryOpt = None,
    http_port: Annotated[
        int | None, typer.Option(help="HTTP port (0 = any free port; default serve.http_port).")
    ] = None,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port (serve.grpc_port).")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus metrics port (serve.metrics_port).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (serve.host).")] = None,
    target: Annotated[
        str,
        typer.Option(
            help="How onnxruntime models run: onnxruntime (Triton's onnxruntime backend, the "
            "production configs on CPU) | python (the python-backend runner, a fallback where "
            "that backend cannot be had)."
        ),
    ] = "onnxruntime",
    onnxruntime_backend: Annotated[
        Path | None,
        typer.Option(
            envvar="TRITON_SAM_ONNXRUNTIME_BACKEND",
            help="Folder of Triton's onnxruntime backend (libtriton_onnxruntime.so); default: "
            "built by `make onnxruntime-backend`, else ../shared/triton-onnxruntime-backend/"
            "onnxruntime beside the checkout.",
        ),
    ] = None,
    fuse_attention: Annotated[
        bool,
        typer.Option(
            "--fuse-attention/--no-fuse-attention",
            help="Serve the session models' encoders with fused attention where the family "
            "has a fusion (SAM2.1: onnxruntime's MultiHeadAttention, faster on CPU, same "
            "results to 1e-5); a copy beside the CPU twin, the repository's graphs unchanged.",
        ),
    ] = True,
    self_heal: Annotated[
        bool,
        typer.Option(
            "--self-heal/--no-self-heal",
            help="Probe the session models every 5 s and reload one whose python stub died "
            "(Triton 2.51 keeps such a model READY while every request fails). Runs the "
            "server in poll mode: it reloads a model whose files change, and refuses every "
            "load/unload request.",
        ),
    ] = True,
    admin_key_file: Annotated[
        Path | None,
        typer.Option(
            help="File of the admin key that unlocks the model-repository, shared-memory, "
            "trace and logging APIs (created owner-only on first use; $TRITON_ADMIN_KEY "
            "overrides it). Default: $XDG_CONFIG_HOME/triton-sam/admin-key.",
        ),
    ] = None,
    web: Annotated[
        bool, typer.Option("--web", help="Also serve the browser annotator (prints its URL).")
    ] = False,
    web_port: Annotated[int, typer.Option(help="The annotator's port (0 = any free).")] = 8080,
    data_root: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=PATH: a directory the large-image models may open datasets under, as "
            "'NAME/<path inside it>' (repeatable; added to serve.data_roots; none by default).",
        ),
    ] = None,
) -> None:
    """Run the embedded tritonserver (no Docker) until Ctrl-C / SIGTERM.

    A repository written for the GPU container (onnxruntime target) is served with its own
    configs on Triton's onnxruntime backend, changed only in what a CPU host cannot do
    (KIND_GPU -> KIND_CPU, no TensorRT); the twins are written next to it and use the same
    ONNX files. The control APIs need the admin key (`triton-sam admin-key`); inference,
    health, metadata and statistics are open to whoever reaches the ports.
    """
    # Looked up here, not at the top: the server and the writers load onnx (and tests swap
    # them on their modules).
    from triton_sam.repository.writer import embedded_repository
    from triton_sam.server import EmbeddedTriton
    from triton_sam.server.admin_key import HTTP_HEADER, load_or_create
    from triton_sam.server.data_roots import parse_options
    from triton_sam.server.health import Watchdog, watched_models

    cfg = load_config()
    serve = section(cfg, "serve")  # the configuration's serve: section, options override it
    given = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    serve.update({k: v for k, v in (*given.items(), ("host", host)) if v is not None})
    serve["data_roots"] = {**(serve.get("data_roots") or {}), **parse_options(data_root or ())}
    repo = embedded_repository(
        repository or Path(cfg.paths.repository),
        target=target,  # type: ignore[arg-type]
        fuse_attention=fuse_attention,
    )
    # Self-heal: poll mode, the watchdog touches a dead model's folders and Triton reloads it.
    serve["model_control"] = "poll" if self_heal else "none"
    key = load_or_create(admin_key_file)
    server = EmbeddedTriton(
        repo, onnxruntime_backend=onnxruntime_backend, admin_key=key.value, **serve
    )
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with server:
        typer.echo(f"HTTP    {server.http_url}\ngRPC    {server.grpc_url}")
        typer.echo(f"metrics {server.metrics_url}/metrics\nlog     {server.log_path}")
        typer.echo(f"admin   header {HTTP_HEADER}: the key in {key.source}")
        watched = watched_models(repo) if self_heal else {}
        # The gRPC address lets it probe decoupled models (segment everything) over a stream.
        watchdog = (
            Watchdog(
                server.http_address, watched, repository=repo, grpc_address=server.grpc_address
            ).start()
            if watched
            else None
        )
        if watchdog is not None:
            typer.echo(f"self-heal: watching {', '.join(watchdog.models)}")
        page = _web_server(server, repo, web_port).start() if web else None
        if page is not None:
            typer.echo(f"web     {page.url}   <- open in a browser")
        typer.echo("ready; Ctrl-C to stop")
        try:
            signal.pause()
        except KeyboardInterrupt:
            typer.echo("stopping...")
        finally:
            if page is not None:
                page.stop()
            if watchdog is not None:
                watchdog.stop()


def _web_server(server, repo: Path, port: int):
    """The annotator (the gateway with the page) next to the embedded ``server``."""
    from triton_sam.web.serve import WebServer, served_family

    return WebServer(
        server.http_url,
        server.grpc_address,
        host=server.host,
        port=port,
        model_type=served_family(repo),
    )


@app.command("gateway", short_help="Serve Janelia SAM_service's HTTP API on top of Triton.")
def gateway_cmd(
    triton_url: Annotated[
        str, typer.Option(help="Triton's gRPC address (cancels reach Triton).")
    ] = "localhost:8001",
    protocol: ProtocolOpt = Protocol.grpc,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    model_type: Annotated[str, typer.Option(help="Family served (SAM_service: sam1).")] = "sam1",
    workers: Annotated[int, typer.Option(help="Encodes sent to Triton at once.")] = 2,
    web: Annotated[
        bool, typer.Option("--web", help="Also serve the browser annotator at /web/.")
    ] = False,
    triton_http_url: Annotated[
        str | None,
        typer.Option(help="Triton's HTTP address for --web (default: --triton-url's host:8000)."),
    ] = None,
    label_studio: Annotated[
        bool,
        typer.Option(
            "--label-studio", help="Also serve Label Studio's ML backend at /label-studio."
        ),
    ] = False,
    label_studio_url: UrlOpt = None,
    label_studio_model_type: Annotated[
        str, typer.Option(help="Family the Label Studio backend segments with.")
    ] = "sam2",
    label_studio_api_key_file: ApiKeyFileOpt = None,
    label_studio_allow_origin: AllowOpt = None,
    label_studio_tokens_file: Annotated[
        Path | None,
        typer.Option(
            help="Tokens file (`triton-sam proxy token` writes one): Label Studio must send a "
            "token (Basic auth password), whose tenant goes to Triton. Without it the "
            "backend listens on localhost only.",
        ),
    ] = None,
) -> None:
    """/embedded_model, /new_session_id, /cancel_pending, /from_model, /prediction, /models
    and /health as SAM_service answers them (docs/gateway.md); with --web, the annotator
    page and Triton's inference API (/v2) from the same origin (docs/web.md); with
    --label-studio, Label Studio's ML backend under /label-studio (docs/label-studio.md)."""
    from triton_sam.gateway import BackendOptions, GatewayOptions, serve

    backend = BackendOptions(url=triton_url, protocol=protocol, model_type=model_type)
    routes, on_close = [], []
    if web:
        from triton_sam.web import PassThroughOptions, web_routes

        http_url = triton_http_url or f"{triton_url.rsplit(':', 1)[0]}:8000"
        routes, close = web_routes(
            PassThroughOptions(http_url), triton_url if protocol == "grpc" else None
        )
        on_close = [close]
    if label_studio:
        ls_routes, ls_close = backend_routes(
            triton_url=triton_url,
            protocol=protocol,
            host=host,
            port=port,
            url=label_studio_url,
            model_type=label_studio_model_type,
            api_key_file=label_studio_api_key_file,
            allow_origins=label_studio_allow_origin,
            tokens_file=label_studio_tokens_file,
        )
        routes, on_close = [*routes, *ls_routes], [*on_close, ls_close]
    serve(
        GatewayOptions(backend=backend, workers=workers),
        host=host,
        port=port,
        extra_routes=routes,
        on_close=on_close,
    )


@app.command("admin-key", short_help="Create or rotate the admin key (never printed).")
def admin_key_cmd(
    env_file: Annotated[
        Path | None,
        typer.Option(help="Also set TRITON_ADMIN_KEY in this dotenv file (0600), for compose."),
    ] = None,
    rotate: Annotated[
        bool, typer.Option("--rotate", help="Replace the key with a fresh one.")
    ] = False,
    key_file: Annotated[
        Path | None, typer.Option(help="Key file (default $XDG_CONFIG_HOME/triton-sam/admin-key).")
    ] = None,
) -> None:
    """Create (first use) or rotate the admin key, and say where it is; it is never printed.

    `triton-sam serve` reads it at start (restart it after --rotate); compose reads
    TRITON_ADMIN_KEY from .env: `triton-sam admin-key --env-file .env`.
    """
    from triton_sam.server.admin_key import (
        default_key_path,
        generate_key,
        load_or_create,
        write_env_file,
        write_key_file,
    )

    path = key_file or default_key_path()
    if rotate:
        write_key_file(path, generate_key())
    key = load_or_create(path)
    typer.echo(f"admin key: {key.source}")
    if env_file is not None:
        typer.echo(f"TRITON_ADMIN_KEY set in {write_env_file(env_file, key.value)} (mode 0600)")


@app.command("check", short_help="Smoke-test a running server: an encode and a click.")
def check_cmd(
    url: ServerUrlOpt = None,
    protocol: ProtocolOpt = Protocol.http,
    model_type: Annotated[str, typer.Option(help="sam2 | sam1 | sam3")] = "sam2",
    image: ImageOpt = None,
) -> None:
    """Smoke-test a running server: encode an image, predict a click, print timings."""
    with SAM2TritonClient(url, model_type=model_type, protocol=protocol) as client:
        img = image if image is not None else sample_image()
        client.set_image(img)
        typer.echo(f"set_image: {client.last_timings_ms}")
        h, w = client.original_size
        masks, iou = client.predict(point_coords=[[w / 2, h / 2]], point_labels=[1])
        typer.echo(f"predict:   {client.last_timings_ms}, {client.last_request_bytes} bytes sent")
        typer.echo(
            f"mask {masks.shape}, {float(np.mean(masks[0, 0] > 0)):.1%} foreground, iou {iou}"
        )
