"""What a user runs besides serving: ``segment`` (SAM3 concepts), ``everything`` (the automatic
mask generator) and ``demo`` (end to end on this machine). The work is in
:mod:`triton_sam.tools`; these commands parse options and print.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from tqdm import tqdm

from triton_sam.cli.app import app
from triton_sam.cli.options import (
    DEFAULT_MODEL,
    ImageOpt,
    Protocol,
    ProtocolOpt,
    ServerUrlOpt,
    VariantOpt,
    size,
)
from triton_sam.errors import InputValidationError
from triton_sam.tools.everything import segment_everything
from triton_sam.tools.segment import segment_image


@app.command("segment", short_help="Segment every instance of a phrase (SAM3 concept model).")
def segment_cmd(
    image: Annotated[Path, typer.Argument(help="Image to segment.")],
    text: Annotated[
        list[str], typer.Option("--text", "-t", help="Noun phrase; repeat for several.")
    ],
    out: Annotated[
        Path, typer.Option(help="Overlay PNG to write; the COCO JSON goes beside it (.json).")
    ] = Path("outputs/segment.png"),
    url: ServerUrlOpt = None,
    protocol: ProtocolOpt = Protocol.http,
    threshold: Annotated[float, typer.Option(help="Score threshold (Sam3Processor's).")] = 0.3,
    max_instances: Annotated[
        int | None, typer.Option(help="At most this many instances per phrase.")
    ] = None,
) -> None:
    """Segment every instance of each phrase (SAM3 concept model): overlay PNG + COCO JSON."""
    result = segment_image(
        image, text, out, url=url, protocol=protocol, threshold=threshold,
        max_instances=max_instances,
    )  # fmt: skip
    prediction = result.prediction
    for i, phrase in enumerate(prediction.phrases):
        count = int((prediction.phrase_index == i).sum())
        typer.echo(f"{phrase!r}: {count} instances (presence {prediction.presence[i]:.2f})")
    typer.echo(f"timings: {result.timings_ms}; predict request {size(result.request_bytes)}")
    typer.echo(f"wrote {result.overlay} and {result.coco}")


def _everything_params(params: str | None, named: dict[str, Any]) -> dict[str, Any]:
    """``--params`` (a JSON object) updated with the named options that were given."""
    try:
        given = json.loads(params) if params else {}
    except json.JSONDecodeError as e:
        raise InputValidationError("params", f"not JSON: {e}") from e
    if not isinstance(given, dict):
        raise InputValidationError("params", "expected a JSON object")
    return given | {k: v for k, v in named.items() if v is not None}


class _Bars:
    """One progress bar per image, opened at the server's first answer for it."""

    def __init__(self) -> None:
        self.bars: list[Any] = []

    def __call__(self, image: Path) -> Callable[[int, int], None]:
        def update(done: int, total: int) -> None:
            if not self.bars or self.bars[-1].desc != image.name:
                self.bars.append(tqdm(desc=image.name, unit="batch", total=total))
            self.bars[-1].n = done
            self.bars[-1].refresh()

        return update

    def close(self) -> None:
        for bar in self.bars:
            bar.close()


@app.command("everything", short_help="Segment everything in images (automatic mask generator).")
def everything_cmd(
    images: Annotated[list[Path], typer.Argument(help="Images to segment.")],
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("outputs/everything"),
    url: Annotated[
        str | None, typer.Option(help="Server's gRPC address (default $TRITON_URL).")
    ] = None,
    model_type: Annotated[str, typer.Option(help="sam2 (SAM2.1) | sam1.")] = "sam2",
    points_per_side: Annotated[int | None, typer.Option(help="Grid points per side.")] = None,
    points_per_batch: Annotated[int | None, typer.Option(help="Points per decoder run.")] = None,
    pred_iou_thresh: Annotated[float | None, typer.Option(help="Predicted IoU cut.")] = None,
    stability_score_thresh: Annotated[float | None, typer.Option(help="Stability cut.")] = None,
    crop_n_layers: Annotated[int | None, typer.Option(help="Crop layers (0: none).")] = None,
    params: Annotated[
        str | None, typer.Option(help="Other parameters as JSON, e.g. '{\"box_nms_thresh\": 0.6}'.")
    ] = None,
) -> None:
    """Every instance in each image, as the official automatic mask generator finds them:
    <out>/<stem>.png (overlay) and <out>/<stem>.json (coco_rle records). Ctrl-C cancels the
    job on the server."""
    given = _everything_params(
        params,
        {
            "points_per_side": points_per_side,
            "points_per_batch": points_per_batch,
            "pred_iou_thresh": pred_iou_thresh,
            "stability_score_thresh": stability_score_thresh,
            "crop_n_layers": crop_n_layers,
        },
    )
    bars = _Bars()
    try:
        written = segment_everything(
            images, out, url=url, model_type=model_type, params=given, progress=bars
        )
    finally:
        bars.close()
    for files in written:
        typer.echo(
            f"{files.image.name}: {len(files.result)} instances in {files.seconds:.1f} s -> "
            f"{files.overlay}, {files.annotations}"
        )


@app.command("demo", short_help="End to end here: export, serve, a click and a box, a PNG.")
def demo_cmd(
    model: VariantOpt = DEFAULT_MODEL,
    protocol: ProtocolOpt = Protocol.http,
    image: ImageOpt = None,
    output: Annotated[Path, typer.Option(help="Overlay PNG.")] = Path("outputs/demo_overlay.png"),
    download: Annotated[
        bool,
        typer.Option(
            help="Download the checkpoint when it is not in checkpoints/ (verified, "
            "resumable). Offline, or with --no-download, the demo uses random weights."
        ),
    ] = True,
) -> None:
    """End to end on this machine: export, embedded Triton, a click and a box, an overlay PNG.

    Real weights when it can get them (checkpoints/, else a download); random weights,
    loudly, when it cannot.
    """
    from triton_sam.tools.demo import run_demo

    report = run_demo(
        model=model, protocol=protocol, image_path=image, output=output, download=download
    )
    typer.echo(
        f"\n== demo: {report.model} ({'RANDOM weights' if report.random_weights else 'checkpoint'})"
    )
    for stage, s in report.stages_s.items():
        typer.echo(f"  {stage:28s} {s:8.2f} s")
    for stage, ms in report.latency_ms.items():
        typer.echo(f"  {stage:28s} {ms:8.1f} ms")
    for what, n in report.request_bytes.items():
        typer.echo(f"  bytes sent {what:17s} {size(n):>12s}")
    for name, n in report.onnx_bytes.items():
        typer.echo(f"  onnx {name:23s} {n / 2**20:8.1f} MiB")
    typer.echo(f"  overlay: {report.overlay}")
