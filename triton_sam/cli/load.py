"""``triton-sam bench`` under load: speculative drags (``stress``), many sessions for a while
(``soak``), storms of embeds (``storm``) and replicas behind nginx (``replicas``). Each runs
against ``--url`` or an embedded server (:func:`triton_sam.bench.harness.served`) and exits 1
when the run failed what it checks.

The benchmarks are imported inside the commands: they load tritonclient's gRPC stack and the
repository writers, which ``triton-sam --help`` must not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from triton_sam.bench.harness import served
from triton_sam.cli.app import bench_app
from triton_sam.cli.options import (
    DEFAULT_MODEL,
    ImageOpt,
    ModelTypeOpt,
    Protocol,
    ProtocolOpt,
    ReportDirOpt,
    RepositoryOpt,
    RunningUrlOpt,
    SessionsOpt,
    VariantOpt,
    csv,
    echo_report,
    finish_report,
    positive_int,
)
from triton_sam.errors import InputValidationError
from triton_sam.tools.sample import sample_image


@bench_app.command("stress", short_help="Speculative decoding under simulated mouse drags.")
def stress_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    url: RunningUrlOpt = None,
    protocol: ProtocolOpt = Protocol.grpc,
    http_url: Annotated[
        str | None, typer.Option(help="Statistics endpoint of --url (default: its host:8000).")
    ] = None,
    metrics_url: Annotated[
        str | None, typer.Option(help="Metrics endpoint of --url (default: its host:8002).")
    ] = None,
    model_type: ModelTypeOpt = "sam2",
    events: Annotated[int, typer.Option(min=1, help="Mouse events per drag.")] = 50,
    rate: Annotated[float, typer.Option(min=0.1, help="Events per second.")] = 100.0,
    sessions: SessionsOpt = 4,
    repeats: Annotated[int, typer.Option(min=1, help="Drags per session.")] = 1,
    modes: Annotated[str, typer.Option(help="Comma-separated.")] = "reference,cancel,latest",
    image: ImageOpt = None,
    output: ReportDirOpt = Path("outputs/stress"),
) -> None:
    """Speculative decoding under simulated mouse drags: the reference behaviour (send all,
    mark cancelled locally), real cancellation (gRPC; HTTP has no server-side cancel), and
    latest-wins, in one run; executed and cancelled requests from the server's own counters
    (JSON + markdown)."""
    from triton_sam.bench.stress import (
        MODES,
        DragSettings,
        counter_urls,
        run_stress_on_server,
        write_report,
    )

    settings = DragSettings(events=events, rate_hz=rate, sessions=sessions, repeats=repeats)
    chosen = csv(modes, option="--modes", choices=MODES)  # before an export or a connection
    picture = image if image is not None else sample_image()
    work = Path(".stress")
    with served(url, protocol=protocol, model=model, model_type=model_type, work=work) as s:
        stats, metrics = (s.http_url, s.metrics_url)
        if url:
            stats, metrics = counter_urls(url, http_url, metrics_url)
        report = run_stress_on_server(
            s.url, protocol=protocol, http_url=stats, metrics_url=metrics, image=picture,
            model_type=s.family, settings=settings, modes=chosen, model_name=s.name,
        )  # fmt: skip
        echo_report(write_report(report, output))


@bench_app.command("soak", short_help="Many concurrent sessions for a while; exits 1 on a failure.")
def soak_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    url: RunningUrlOpt = None,
    protocol: ProtocolOpt = Protocol.grpc,
    model_type: ModelTypeOpt = "sam2",
    sessions: SessionsOpt = 16,
    duration: Annotated[float, typer.Option(min=1, help="Seconds of prompting.")] = 60.0,
    warmup: Annotated[
        float, typer.Option(min=0, help="Seconds of prompting before memory growth counts.")
    ] = 0.0,
    images: Annotated[
        int, typer.Option(min=0, help="Distinct images encoded (0 = one per session).")
    ] = 0,
    encode_every: Annotated[
        int, typer.Option(min=0, help="Re-encode after this many prompts (0 = never).")
    ] = 0,
    server_embeddings: Annotated[
        bool,
        typer.Option(
            "--server-embeddings/--stateless",
            help="Keep each image's features on the server (the <family>_session model, "
            "what the clients use by default) or send them with every click.",
        ),
    ] = True,
    output: ReportDirOpt = Path("outputs/soak"),
) -> None:
    """Many concurrent sessions for a while: failures, latency p50/p95/p99, and client and
    server memory (RSS) sampled throughout (JSON + markdown). Exits 1 on any failure."""
    from triton_sam.bench.soak import SoakSettings, run_soak_on_server, write_report

    settings = SoakSettings(
        sessions=sessions,
        duration_s=duration,
        warmup_s=warmup,
        images=images,
        encode_every=encode_every,
        server_embeddings=server_embeddings,
    )
    work = Path(".soak")
    with served(url, protocol=protocol, model=model, model_type=model_type, work=work) as s:
        report = run_soak_on_server(s, settings=settings, protocol=protocol, progress=typer.echo)
        finish_report(write_report(report, output), bool(report.failures))


@bench_app.command("storm", short_help="Storms of concurrent embeds while users click.")
def bench_storm_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    url: RunningUrlOpt = None,
    model_type: ModelTypeOpt = "sam2",
    embeds: Annotated[
        str, typer.Option(help="Storm sizes (concurrent embeds), comma-separated.")
    ] = "64,256",
    clickers: Annotated[int, typer.Option(min=1, help="Users clicking meanwhile.")] = 16,
    think: Annotated[float, typer.Option(min=0, help="Clickers' pause between clicks (s).")] = 0.5,
    output: ReportDirOpt = Path("outputs/storm"),
) -> None:
    """Storms of concurrent embeds (distinct PNGs) while users click: typed refusals, zero
    transport errors, the server's peak memory twice per size, the clicks' p95 against their
    idle p95 (JSON + markdown). Exits 1 on any transport error."""
    from triton_sam.bench.storm import StormSettings, run_storm_on_server, write_report

    sizes = tuple(csv(embeds, option="--embeds", item=positive_int, expected="e.g. 64,256"))
    settings = StormSettings(embeds=sizes, clickers=clickers, think_s=think)
    work = Path(".storm")
    with served(url, protocol="grpc", model=model, model_type=model_type, work=work) as s:
        report = run_storm_on_server(s, settings, progress=typer.echo)
    finish_report(write_report(report, output), bool(report.transport_errors))


@bench_app.command("replicas", short_help="Replicas behind nginx, one killed mid-run.")
def bench_replicas_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    protocol: Annotated[str, typer.Option(help="grpc | http | both")] = "both",
    replicas: Annotated[int, typer.Option(min=2, help="Triton replicas behind nginx.")] = 3,
    sessions: SessionsOpt = 16,
    clicks: Annotated[int, typer.Option(min=1, help="Clicks per session.")] = 30,
    images: Annotated[int, typer.Option(min=1, help="Distinct images.")] = 8,
    kill_after: Annotated[
        float, typer.Option(min=0.0, max=0.99, help="Fraction of clicks before a replica dies.")
    ] = 0.4,
    output: ReportDirOpt = Path("outputs/bench-replicas"),
    repository: RepositoryOpt = None,
) -> None:
    """Embedded Triton replicas behind a real nginx (image-affine consistent hashing), many
    sessions clicking, one replica SIGKILLed mid-run: failed clicks, requests per replica,
    images moved, re-embeds, masks vs one server (JSON + markdown). Needs nginx on PATH.
    Exits 1 on a failed click or a mask that differs from the single-server run."""
    from triton_sam.bench.replicas import ReplicaBenchOptions, write_report
    from triton_sam.bench.replicas_served import serve_and_bench_replicas
    from triton_sam.scaleout.proxy import find_nginx

    if protocol not in ("http", "grpc", "both"):
        raise InputValidationError("protocol", f"got {protocol!r}, expected http, grpc or both")
    find_nginx()  # fail before the export when nginx is missing
    options = ReplicaBenchOptions(
        replicas=replicas, sessions=sessions, clicks=clicks, images=images, kill_after=kill_after
    )
    protocols = ["http", "grpc"] if protocol == "both" else [protocol]
    reports = serve_and_bench_replicas(
        model, protocols, options, repository=repository, progress=typer.echo
    )
    failed = any(r.failed_clicks or r.mask_mismatches for r in reports)
    finish_report(write_report(reports, options, output), failed)
