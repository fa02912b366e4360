"""Import a pre-exported ONNX encoder/decoder pair (e.g. onnx-community/sam3-tracker-ONNX).

The graphs are taken as they are (no re-export, no weight rewrite), but for one addition: the
decoder's prompt points get the bound every exported decoder has
(``export.bound_prompt_points``, written into the repository's copy, never into the source);
what Triton needs is
read from them: tensor names, dtypes and shapes (dim 0 is the batch; other symbolic dims
become -1, exactly where the graph declares them symbolic, which is what Triton's
onnxruntime backend requires of outputs). They are checked against a registered family's
contract, by name, so the client knows how to talk to them; then both models are written
like an export, with their external-data sidecars, for either repository target.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from triton_sam.errors import RepositoryError
from triton_sam.models.spec import FamilySpec, TensorSpec
from triton_sam.repository.artifacts import write_pair
from triton_sam.repository.config import RepositoryOptions


def graph_tensors(path: str | os.PathLike[str]) -> tuple[tuple[TensorSpec, ...], ...]:
    """(inputs, outputs) of an ONNX graph as TensorSpecs, without loading its weights.

    Shapes drop dim 0 (the batch); symbolic or unknown dims become -1.

    Raises:
        RepositoryError: unreadable graph, or a tensor without a shape or a batch dim.
    """
    import onnx

    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError, OSError...
        raise RepositoryError(f"{path}: not a readable ONNX model: {e}") from e
    return _specs(model.graph.input, path), _specs(model.graph.output, path)


def batch_dim(path: str | os.PathLike[str]) -> int | None:
    """Dim 0 of the graph's first input: None when symbolic, else its fixed size."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    return dim.dim_value if dim.HasField("dim_value") else None


def _specs(values: object, path: Path) -> tuple[TensorSpec, ...]:
    from onnx.helper import tensor_dtype_to_np_dtype

    specs = []
    for value in values:
        tensor = value.type.tensor_type
        dims = list(tensor.shape.dim)
        if not tensor.HasField("shape") or not dims:
            raise RepositoryError(f"{path}: tensor {value.name!r} has no batched shape")
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims[1:])
        dtype = tensor_dtype_to_np_dtype(tensor.elem_type).name
        specs.append(TensorSpec(value.name, dtype, shape))
    return tuple(specs)


def family_from_graphs(
    family: FamilySpec,
    encoder_onnx: str | os.PathLike[str],
    decoder_onnx: str | os.PathLike[str],
) -> FamilySpec:
    """``family`` with its tensor contract replaced by what the two graphs declare.

    Raises:
        RepositoryError: the graphs' tensor names differ from the family's (lists them).
    """
    enc_in, enc_out = graph_tensors(encoder_onnx)
    dec_in, dec_out = graph_tensors(decoder_onnx)
    problems = []
    for label, declared, expected in (
        ("encoder inputs", enc_in, family.encoder_inputs),
        ("encoder outputs", enc_out, family.encoder_outputs),
        ("decoder inputs", dec_in, family.decoder_inputs),
        ("decoder outputs", dec_out, family.decoder_outputs),
    ):
        got, want = {t.name for t in declared}, {t.name for t in expected}
        if got != want:
            problems.append(f"{label}: got {sorted(got)}, expected {sorted(want)}")
    if problems:
        raise RepositoryError(
            f"{encoder_onnx} / {decoder_onnx} do not have the {family.family!r} tensor "
            f"contract: {'; '.join(problems)}"
        )
    return dataclasses.replace(
        family,
        encoder_inputs=enc_in,
        encoder_outputs=enc_out,
        decoder_inputs=dec_in,
        decoder_outputs=dec_out,
    )


def import_onnx_pair(
    repo_dir: str | os.PathLike[str],
    family: FamilySpec,
    *,
    encoder_onnx: str | os.PathLike[str],
    decoder_onnx: str | os.PathLike[str],
    options: RepositoryOptions,
    encoder_name: str | None = None,
    decoder_name: str | None = None,
) -> tuple[str, str]:
    """Write a pre-exported pair into ``repo_dir`` as ``family``'s encoder and decoder models.

    Graphs with a fixed batch dim get ``max_batch_size: 1`` in the ``python`` target (the
    runner feeds them one request at a time) and are refused for the ``onnxruntime`` target,
    whose backend cannot load them with batching on.

    Returns:
        The two Triton model names, encoder first.

    Raises:
        RepositoryError: missing files, graphs that do not match ``family``, or (target
            ``onnxruntime``) a graph its backend would refuse with this config (see
            ``repository.onnx_check``), before anything is written.
    """
    for path in (encoder_onnx, decoder_onnx):
        if not Path(path).is_file():
            raise RepositoryError(f"{path}: file not found")
    fam = family_from_graphs(family, encoder_onnx, decoder_onnx)
    for graph, path in (("encoder", encoder_onnx), ("decoder", decoder_onnx)):
        fixed = batch_dim(path)
        if fixed is None:
            continue
        if options.target == "onnxruntime":
            # The backend requires a variable first dim whenever max_batch_size > 0, and
            # our configs always batch (the dynamic batcher is what drops cancelled requests).
            raise RepositoryError(
                f"{path}: its batch dim is fixed to {fixed}; Triton's onnxruntime backend "
                "only batches graphs whose first dim is variable, so this config would not "
                "load. Import it with --target python (the runner takes it with "
                "max_batch_size 1), or export the graph with a dynamic batch dim"
            )
        options = dataclasses.replace(options, **{f"{graph}_max_batch_size": 1})
    with tempfile.TemporaryDirectory(prefix="triton_sam_import_") as tmp:
        return write_pair(
            repo_dir,
            fam,
            encoder_onnx=encoder_onnx,
            decoder_onnx=_bounded_copy(Path(decoder_onnx), fam, Path(tmp)),
            options=options,
            encoder_name=encoder_name,
            decoder_name=decoder_name,
        )


def _bounded_copy(decoder_onnx: Path, family: FamilySpec, workdir: Path) -> Path:
    """A copy of the decoder graph in ``workdir`` whose prompt points are bounded per item and
    per batch, as an exported decoder's are (a request sent straight to the decoder could
    otherwise carry any number of them); its weight sidecars are linked, not copied."""
    from triton_sam.export import bound_prompt_points
    from triton_sam.export.onnx_utils import external_data_files

    copy = workdir / decoder_onnx.name
    shutil.copyfile(decoder_onnx, copy)
    for sidecar in external_data_files(decoder_onnx):
        link = workdir / sidecar.relative_to(decoder_onnx.parent)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(sidecar.resolve())
    bound_prompt_points(copy, family.decoder_inputs)
    return copy


def find_pair(directory: str | os.PathLike[str], encoder: str, decoder: str) -> tuple[Path, Path]:
    """Locate ``encoder`` and ``decoder`` in ``directory`` or its ``onnx/`` subfolder (the Hub
    layout).

    Raises:
        RepositoryError: either file is missing; the message names where it looked.
    """
    root = Path(directory)
    for folder in (root, root / "onnx"):
        if (folder / encoder).is_file() and (folder / decoder).is_file():
            return folder / encoder, folder / decoder
    raise RepositoryError(
        f"{root}: no {encoder} + {decoder} here or in {root / 'onnx'}; "
        "download them with `triton-sam download-onnx`"
    )
