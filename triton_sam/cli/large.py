"""Large images from the command line: ``precompute`` (embed a dataset's tiles ahead of the
clicks), ``segment-large`` (one click on a dataset, its mask as a crop and offset) and
``everything-large`` (every object, tiled, as an OME-Zarr label image). The work is
:class:`~triton_sam.client.large_image.LargeImage`'s; these parse, print and write.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from triton_sam.cli.app import app
from triton_sam.cli.options import Protocol, ProtocolOpt, ServerUrlOpt
from triton_sam.errors import InputValidationError

DatasetArg = Annotated[
    str, typer.Argument(help="'<root>/<path>' under one of the server's data roots.")
]
KeyOpt = Annotated[
    str | None, typer.Option(help="Array in a zarr/N5 group, or OME-Zarr level ('0').")
]
ZOpt = Annotated[int | None, typer.Option(help="Slice of a volume.")]
FamilyOpt = Annotated[str, typer.Option(help="Family of --url's models: sam2 | sam1.")]
SideOpt = Annotated[int | None, typer.Option(help="Pixels a side (default: the server's).")]
_OUT_SUFFIXES = (".json", ".png", ".tif", ".tiff")


def _numbers(text: str, option: str, count: int, kind: type = float) -> list[Any]:
    """``count`` comma-separated numbers (``--point 120,45``), or an error naming ``option``
    (not :func:`~triton_sam.cli.options.csv`: coordinates repeat, ``0,0``)."""
    try:
        values = [kind(w) for w in text.split(",")]
    except ValueError:
        values = []
    if len(values) != count:
        raise InputValidationError(
            option, f"got {text!r}, expected {count} comma-separated numbers"
        )
    return values


def _client(url: str | None, protocol: Protocol, model_type: str) -> Any:
    from triton_sam.client.sync import SAM2TritonClient

    return SAM2TritonClient(url, model_type=model_type, protocol=protocol.value)


@contextlib.contextmanager
def _first_ctrl_c_cancels(cancel: threading.Event) -> Iterator[None]:
    """The first Ctrl-C sets ``cancel`` (the batch in flight finishes, then the command
    stops); a second one interrupts at once."""

    def handler(signum: int, frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        typer.echo("\ncancelling after the batch in flight (Ctrl-C again: now)", err=True)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@app.command("precompute", short_help="Embed a large image's tiles ahead of the clicks.")
def precompute_cmd(
    dataset: DatasetArg,
    key: KeyOpt = None,
    region: Annotated[
        str | None, typer.Option(help="row0,col0,row1,col1 pixels (default: all).")
    ] = None,
    z: ZOpt = None,
    tile: SideOpt = None,
    halo: SideOpt = None,
    url: ServerUrlOpt = None,
    protocol: ProtocolOpt = Protocol.http,
    model_type: FamilyOpt = "sam2",
) -> None:
    """Embed every tile of DATASET touching --region, with a progress bar. Resumes: tiles
    the server holds are skipped, so run it again after an interruption. Ctrl-C stops after
    the batch in flight; what was embedded stays held."""
    box = None if region is None else tuple(_numbers(region, "--region", 4, int))
    cancel = threading.Event()
    with (
        _client(url, protocol, model_type) as client,
        client.open_dataset(dataset, key=key, tile=tile, halo=halo) as image,
        _first_ctrl_c_cancels(cancel),
    ):
        result = image.precompute(region=box, z=z, cancel=cancel)
    typer.echo(
        f"{dataset}: {result.tiles} tiles, {result.embedded} embedded now, "
        f"{result.held} held already"
        + (f"; cancelled, {result.remaining} left: run again to resume" if result.cancelled else "")
    )


@app.command("segment-large", short_help="Click on a large image; write the mask's crop.")
def segment_large_cmd(
    dataset: DatasetArg,
    point: Annotated[list[str], typer.Option(help="X,Y full-image pixels; repeat for several.")],
    out: Annotated[
        Path, typer.Option(help="mask.json (fields), or .png/.tif (crop + .json beside it).")
    ],
    label: Annotated[
        list[int] | None, typer.Option(help="1 (object) or 0 (background) per --point.")
    ] = None,
    key: KeyOpt = None,
    z: ZOpt = None,
    mode: Annotated[str, typer.Option(help="auto | tile | window.")] = "auto",
    url: ServerUrlOpt = None,
    protocol: ProtocolOpt = Protocol.http,
    model_type: FamilyOpt = "sam2",
) -> None:
    """Segment the object under the clicks on DATASET at full resolution; write the mask as
    its crop and offset (the crop's top-left pixel in the image)."""
    if out.suffix.lower() not in _OUT_SUFFIXES:
        raise InputValidationError("--out", f"got {out.name!r}, expected {_OUT_SUFFIXES}")
    points = [_numbers(p, "--point", 2) for p in point]
    labels = label or [1] * len(points)
    with _client(url, protocol, model_type) as client, client.open_dataset(dataset, key=key) as im:
        masks = im.predict(point_coords=points, point_labels=labels, mode=mode, z=z)
        answer = im.last_answer
    if not masks or masks[0].area == 0:
        typer.echo("no mask: the model found nothing under the clicks")
        raise typer.Exit(1)
    mask = masks[0]
    written = _write(mask, out)
    typer.echo(
        f"mask of {mask.area} px, crop {mask.size[0]}x{mask.size[1]} at (row, col) "
        f"{mask.offset}, score {mask.score:.2f}, {answer.mode} mode"
        f"{', cut at its block edge' if mask.cut else ''} -> {', '.join(map(str, written))}"
    )


@app.command("everything-large", short_help="Segment everything on a large image, tiled.")
def everything_large_cmd(
    dataset: DatasetArg,
    out: Annotated[Path, typer.Option(help="The OME-Zarr label image to write (.ome.zarr).")],
    coco: Annotated[Path | None, typer.Option(help="Also the COCO RLE records (.json).")] = None,
    key: KeyOpt = None,
    z: ZOpt = None,
    points_per_side: Annotated[int, typer.Option(min=1, help="Grid points per tile side.")] = 32,
    url: ServerUrlOpt = None,
    grpc_url: Annotated[str | None, typer.Option(help="The server's gRPC address.")] = None,
    protocol: ProtocolOpt = Protocol.http,
    model_type: FamilyOpt = "sam2",
) -> None:
    """Every object of DATASET: one segment-everything job per tile on the server, objects
    across tiles joined into one; a label image napari and Fiji open, written chunk by
    chunk. Ctrl-C stops after the tile in work (nothing is written)."""
    from tqdm import tqdm

    cancel = threading.Event()
    with (
        _client(url, protocol, model_type) as client,
        client.open_dataset(dataset, key=key) as image,
        _first_ctrl_c_cancels(cancel),
        tqdm(total=image.grid[0] * image.grid[1], unit="tile", desc="everything") as bar,
    ):
        result = image.segment_everything(
            z=z,
            grpc_url=grpc_url,
            cancel=cancel,
            progress=lambda done, total: bar.update(done - bar.n),
            points_per_side=points_per_side,
        )
    result.write_ome_zarr(out)
    written = [out] + ([result.write_coco(coco)] if coco is not None else [])
    typer.echo(
        f"{len(result)} instances from {result.tiles} tiles -> {', '.join(map(str, written))}"
    )


def _write(mask: Any, out: Path) -> list[Path]:
    """``out`` as JSON (the SparseMask's fields), or the crop as an 8-bit image (255 = mask)
    with those fields in a ``.json`` beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = json.dumps(mask.to_json(), indent=1)
    if out.suffix.lower() == ".json":
        out.write_text(fields)
        return [out]
    from PIL import Image

    Image.fromarray(mask.crop().astype("uint8") * 255).save(out)
    sidecar = out.with_suffix(".json")
    sidecar.write_text(fields)
    return [out, sidecar]
