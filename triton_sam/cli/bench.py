"""``triton-sam bench``: what users run (``users``), where a click's time goes (``click``),
the backends, concepts, segment everything and Triton's perf_analyzer. The load tests are in
:mod:`triton_sam.cli.load`, ``bench video`` in :mod:`triton_sam.cli.video`.

Each command parses its options, calls one function of :mod:`triton_sam.bench` and prints;
the benchmarks (onnxruntime, torch, the server) are imported inside the commands so that
``triton-sam --help`` does not load them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from triton_sam.bench.harness import served
from triton_sam.cli.app import bench_app
from triton_sam.cli.options import (
    DEFAULT_MODEL,
    LevelsOpt,
    NEncodeOpt,
    Protocol,
    ProtocolOpt,
    ReportDirOpt,
    RunningUrlOpt,
    VariantOpt,
    WorkDirOpt,
    csv,
    echo_report,
    levels,
    path_option,
    switch,
)
from triton_sam.models.registry import get_model
from triton_sam.tools.sample import sample_image


@bench_app.command(
    "users", short_help="What users run: encode, click, box, refinement; goal ratios."
)
def bench_cmd(
    model: Annotated[
        str, typer.Option(help="Comma-separated variants, e.g. sam1_vit_b,sam2.1_hiera_tiny.")
    ] = DEFAULT_MODEL,
    n_encode: NEncodeOpt = 3,
    n_decode: Annotated[
        int, typer.Option(min=1, help="Timed calls per prompt kind and caller (c=4: 4x).")
    ] = 30,
    concurrency: LevelsOpt = "1,4",
    protocols: Annotated[str, typer.Option(help="Comma-separated: grpc, http.")] = "grpc,http",
    official: switch("Time the official predictor (PyTorch) in-process too.") = True,
    runner: switch("Time the session path on the python-runner twins too.") = True,
    encoder_variants: Annotated[
        str,
        typer.Option(
            help="Comma-separated encoder exports to time (encode rows + agreement with fp32): "
            "fp32 (as exported), fused (fused attention: what `triton-sam serve` serves for "
            "families with a fusion; skipped for the others), int8 (int8 weights)."
        ),
    ] = "fp32,fused",
    during_encode: switch("Time a session click sent during another image's encode.") = True,
    isolate: switch("Each model in its own child process (bounds the run's memory).") = True,
    work_dir: WorkDirOpt = Path(".bench_users"),
    output: ReportDirOpt = Path("outputs/bench"),
) -> None:
    """What users run, in one run: encode, click, box and refinement through the official
    predictor and onnxruntime in-process, and our client on the embedded server (session
    model and stateless decoder, onnxruntime backend; the python runner as one more row),
    a click during another image's encode, and encoder export variants; p50/p95/p99,
    throughput, the same-run goal ratios and peak memory (JSON, markdown, PNG)."""
    from triton_sam.bench.users import (
        BASE_VARIANT,
        ENCODER_VARIANTS,
        BenchSettings,
        prepare_model,
        run_user_benchmark,
        write_report,
    )

    names = csv(model, option="--model")
    chosen = csv(protocols, option="--protocols", choices=list(Protocol))
    variants = csv(encoder_variants, option="--encoder-variants", choices=ENCODER_VARIANTS)
    if BASE_VARIANT not in variants:
        variants.insert(0, BASE_VARIANT)  # the other variants are compared with it
    settings = BenchSettings(
        protocols=tuple(chosen),
        concurrency=tuple(levels(concurrency)),
        n_encode=n_encode,
        n_decode=n_decode,
        official=official,
        during_encode=during_encode,
    )
    models = [prepare_model(n, work_dir, runner=runner, encoder_variants=variants) for n in names]
    report = run_user_benchmark(
        models, sample_image(), settings, encoder_variants=variants, isolate=isolate
    )
    echo_report(write_report(report, output))


def parse_sizing(text: str) -> tuple[int, int] | None:
    """``INSTANCESxTHREADS`` (e.g. ``2x1``) as a pair; ``default`` as None.

    Raises:
        ValueError: anything else (:func:`csv` names the option).
    """
    if text == "default":
        return None
    instances, threads = (int(v) for v in text.lower().split("x"))
    if instances < 1 or threads < 1:
        raise ValueError(f"{text!r}: a count below 1")
    return instances, threads


@bench_app.command("click", short_help="Where a session click's time goes, stage by stage.")
def bench_click_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    n: Annotated[int, typer.Option(min=1, help="Timed clicks per variant.")] = 50,
    protocol: ProtocolOpt = Protocol.grpc,
    cpu_features: Annotated[
        str, typer.Option(help="Comma-separated feature stores: shared_memory, process.")
    ] = "process,shared_memory",
    concurrency: Annotated[
        int, typer.Option(min=0, help="Also time clicks/s with this many callers (0: no).")
    ] = 0,
    decoder_sizing: Annotated[
        str,
        typer.Option(
            help="Comma-separated decoder sizings to compare, INSTANCESxTHREADS (e.g. 2x1,1x2); "
            "'default' is what the repository writer chose for this host."
        ),
    ] = "default",
    work_dir: WorkDirOpt = Path(".bench_users"),
    output: ReportDirOpt = Path("outputs/bench-click"),
) -> None:
    """Where a session click's time goes: client stages, Triton's per-model statistics and
    the session model's own stage counters, per click, beside onnxruntime in process on the
    same decoder; one table per (feature store, decoder sizing) of the session model (JSON
    too)."""
    from triton_sam.bench import breakdown
    from triton_sam.bench.click_grid import run_click_grid

    sizings = csv(
        decoder_sizing, option="--decoder-sizing", item=parse_sizing,
        expected="INSTANCESxTHREADS such as 2x1, or default",
    )  # fmt: skip

    def show(label: str, report: breakdown.ClickBreakdown) -> None:
        typer.echo(f"## {model}, {label}, {protocol}, n={n}\n")
        typer.echo(breakdown.markdown(report) + "\n")

    path = run_click_grid(
        model, work_dir=work_dir, output=output, n=n, protocol=protocol,
        stores=csv(cpu_features, option="--cpu-features"), sizings=sizings,
        concurrency=concurrency, progress=show,
    )  # fmt: skip
    typer.echo(f"wrote {path}")


@bench_app.command("backends", short_help="onnxruntime backend vs the python-backend runner.")
def bench_backends_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    protocol: ProtocolOpt = Protocol.grpc,
    n_encode: NEncodeOpt = 10,
    n_click: Annotated[int, typer.Option(min=1, help="Timed session clicks per path.")] = 50,
    output: ReportDirOpt = Path("outputs/bench"),
) -> None:
    """Encode and click (session path) latency on Triton's onnxruntime backend vs the
    python-backend runner: the same repository served both ways at once, requests
    alternating, in one run (JSON + markdown)."""
    from triton_sam.bench.backends import write_report
    from triton_sam.bench.backends_served import serve_and_compare_backends

    report = serve_and_compare_backends(
        model, protocol=protocol, n_encode=n_encode, n_click=n_click
    )
    echo_report(write_report(report, output))


@bench_app.command("concepts", short_help="Concept segmentation through Triton vs Sam3Model.")
def bench_concepts_cmd(
    checkpoint: path_option(
        "facebook/sam3 model directory (default: small random weights)."
    ) = None,
    images: Annotated[int, typer.Option(min=1, help="New images timed per path.")] = 3,
    repeats: Annotated[int, typer.Option(min=1, help="Timed predict calls per path.")] = 3,
    text: Annotated[list[str] | None, typer.Option("--text", "-t", help="Phrases.")] = None,
    work_dir: WorkDirOpt = Path(".bench_concepts"),
    out: Annotated[Path, typer.Option(help="Markdown report.")] = Path("outputs/bench_concepts.md"),
) -> None:
    """Concept segmentation through the embedded Triton vs Sam3Model in-process, one run."""
    from triton_sam.bench.concepts import bench_local

    phrases = text or ["cat", "red car", "person", "a cell"]
    report = bench_local(
        work_dir, checkpoint=checkpoint, phrases=phrases, images=images, repeats=repeats
    )
    table = report.markdown()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"{report.settings}\n\n{table}\n")
    typer.echo(f"{report.settings}\n{table}\nwrote {out}")


@bench_app.command("everything", short_help="Segment everything: served vs official generator.")
def bench_everything_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    points_per_side: Annotated[int, typer.Option(min=1, help="Grid points per side.")] = 32,
    points_per_batch: Annotated[int, typer.Option(min=1, help="Prompts per decoder run.")] = 64,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per row.")] = 1,
    served: Annotated[bool, typer.Option(help="Add the served row (embedded server).")] = True,
    work_dir: WorkDirOpt = Path(".bench/everything"),
) -> None:
    """Automatic mask generation, one run, same random-init weights, image and parameters:
    the official generator, onnxruntime with our batching, and the served model; speedups
    against the official generator and the server's peak memory."""
    from triton_sam.bench import everything

    argv = [
        f"--model={model}",
        f"--points-per-side={points_per_side}",
        f"--points-per-batch={points_per_batch}",
        f"--repeats={repeats}",
        f"--work={work_dir}",
        *(["--served"] if served else []),
    ]
    everything.main(argv)


@bench_app.command("large", short_help="Large images: open, clicks, precompute vs 1,024².")
def bench_large_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    large: Annotated[int, typer.Option(min=256, help="Side of the large image (pixels).")] = 20_000,
    small: Annotated[int, typer.Option(min=64, help="Side of the small image.")] = 1024,
    clicks: Annotated[int, typer.Option(min=1, help="Timed clicks per row.")] = 30,
    precompute_tiles: Annotated[int, typer.Option(min=1, help="Tiles to precompute.")] = 8,
    url: Annotated[
        str | None,
        typer.Option(help="A running server whose data root `bench` is <work-dir>/data."),
    ] = None,
    work_dir: WorkDirOpt = Path(".bench/large"),
    output: ReportDirOpt = Path("outputs/bench"),
) -> None:
    """Large images on one server in one run: open + first mask, click p50/p95 on a held
    tile against a small image's click, precompute tiles/s against the encoder alone, peak
    memory of the server and the client (JSON, markdown, PNG). The images are synthetic zarr
    arrays written once into <work-dir>/data."""
    from triton_sam.bench import large as bench

    settings = bench.LargeBenchSettings(small, large, clicks, precompute_tiles)
    data = bench.datasets(work_dir / "data", (small, large))
    if url:
        report = bench.run_large_benchmark(url, url, settings, server_pid=None,
                                           model_type=get_model(model).family.family)  # fmt: skip
    else:
        from triton_sam.bench.harness import checkpoints_dir, embedded
        from triton_sam.tools.demo import build_local_repository

        spec, repo, _ = build_local_repository(model, checkpoints_dir(), work_dir)
        with embedded(repo, data_roots={bench.ROOT: str(data)}) as server:
            report = bench.run_large_benchmark(
                server.http_url, server.http_url, settings,
                server_pid=server.pid, model_type=spec.family.family,
            )  # fmt: skip
    echo_report(bench.write_report(report, output))


@bench_app.command("everything-large", short_help="Everything on a large image vs micro-sam.")
def bench_everything_large_cmd(
    model: Annotated[
        str,
        typer.Option("--sam1-model", help="SAM1 variant (micro-sam's generator runs SAM1)."),
    ] = "sam1_vit_b",
    side: Annotated[int, typer.Option(min=256, help="Side of the square image.")] = 8192,
    points_per_side: Annotated[int, typer.Option(min=1, help="Grid points per tile.")] = 32,
    tile: Annotated[int, typer.Option(min=256, help="Tile core (pixels a side).")] = 768,
    halo: Annotated[int, typer.Option(min=0, help="Halo (pixels a side).")] = 128,
    pred_iou_thresh: Annotated[float, typer.Option(help="Both generators' filter.")] = 0.88,
    stability_score_thresh: Annotated[float, typer.Option(help="Both generators' filter.")] = 0.95,
    work_dir: WorkDirOpt = Path(".bench/everything-large"),
    output: ReportDirOpt = Path("outputs/bench"),
) -> None:
    """Segment everything on a side x side synthetic image: the server's tiled jobs, objects
    joined across tiles, against micro-sam's TiledAutomaticMaskGenerator in this process, on
    the same SAM1 weights, tiles and thresholds (needs `make micro-sam`; with random weights
    nothing passes the default filters: lower them to time the whole pipeline)."""
    from triton_sam.bench import large, large_everything
    from triton_sam.bench.harness import checkpoints_dir, embedded
    from triton_sam.bench.micro_sam_ref import reference_predictor
    from triton_sam.client import SAM2TritonClient
    from triton_sam.export import save_random_checkpoint
    from triton_sam.tools.demo import build_local_repository, demo_checkpoint

    spec = get_model(model)
    if spec.family.family != "sam1":
        raise typer.BadParameter(
            "micro-sam's generator runs SAM1 here: a sam1_* model", param_hint="--sam1-model"
        )
    checkpoint = demo_checkpoint(spec, checkpoints_dir(), download=False)
    if checkpoint is None:  # random weights, but the same file for both sides
        work_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = save_random_checkpoint(spec, work_dir / f"{spec.name}.random.pt", seed=0)
    spec, repo, _ = build_local_repository(
        spec, checkpoints_dir(), work_dir, checkpoint=checkpoint, everything=True
    )
    data = large.datasets(work_dir / "data", (side,))
    import zarr

    pixels = zarr.open_array(str(data / f"{side}.zarr"), mode="r")[:]  # micro-sam takes it whole
    predictor = reference_predictor(spec, checkpoint)
    options = {"mapping": {"kind": "tile_minmax"}, "tile": tile, "halo": halo}
    thresholds = large_everything.THRESHOLDS | {
        "pred_iou_thresh": pred_iou_thresh, "stability_score_thresh": stability_score_thresh,
    }  # fmt: skip
    with (
        embedded(repo, data_roots={large.ROOT: str(data)}) as server,
        SAM2TritonClient(server.http_url, model_type="sam1") as client,
        client.open_dataset(f"{large.ROOT}/{side}.zarr", **options) as image,
    ):
        row = large_everything.everything_row(
            image, pixels, predictor, server.http_url, grpc_url=server.grpc_url,
            points_per_side=points_per_side, thresholds=thresholds,
        )  # fmt: skip
    echo_report(large_everything.write_report(row, output))


def _perf_table(rows: list[dict[str, float]]) -> str:
    """perf_analyzer's measurements as a markdown table."""
    lines = [
        "| concurrency | infer/s | p50 ms | p95 ms | p99 ms | queue ms | compute ms |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['concurrency']:.0f} | {r['throughput']:.2f} | {r['p50']:.1f} | "
        f"{r['p95']:.1f} | {r['p99']:.1f} | {r['server_queue']:.1f} | "
        f"{r['server_compute']:.1f} |"
        for r in rows
    ]
    return "\n".join(lines)


@bench_app.command("perf-analyzer", short_help="Triton's perf_analyzer against the served models.")
def perf_analyzer_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    graph: Annotated[str, typer.Option(help="encoder | decoder")] = "decoder",
    url: RunningUrlOpt = None,
    protocol: ProtocolOpt = Protocol.grpc,
    concurrency: LevelsOpt = "1,4,16",
    requests: Annotated[int, typer.Option(min=1, help="Requests per measurement window.")] = 20,
) -> None:
    """Triton's own perf_analyzer against the served models, shapes taken from the spec.

    Install it first with `make perf-analyzer`. Without --url the model is exported and
    served by the embedded tritonserver for the run."""
    from triton_sam.bench.perf_analyzer import run_perf_analyzer

    chosen = levels(concurrency)
    family = get_model(model).family
    with served(url, protocol=protocol, model=model, model_type="", work=Path(".bench")) as s:
        rows, commands = run_perf_analyzer(
            family, graph, s.url.split("://", 1)[-1], protocol=protocol, concurrency=chosen,
            requests_per_level=requests,
        )  # fmt: skip
    for cmd in commands:
        typer.echo(f"$ {cmd}")
    typer.echo(_perf_table(rows))


@bench_app.command("napari", short_help="Click-to-mask in napari vs the Python client.")
def bench_napari_cmd(
    url: Annotated[str, typer.Option(help="A running server (host:port) with sam2_session.")],
    protocol: ProtocolOpt = Protocol.grpc,
    clicks: Annotated[int, typer.Option(min=1, help="Timed clicks per path.")] = 20,
) -> None:
    """The napari plugin's click-to-mask latency against SAM2TritonClient.predict, interleaved
    on the same server (needs a display: run under ``xvfb-run -a`` when headless)."""
    from triton_sam.bench.napari_latency import napari_click_latency

    report = napari_click_latency(url, protocol=protocol.value, clicks=clicks)
    typer.echo(report.table())
