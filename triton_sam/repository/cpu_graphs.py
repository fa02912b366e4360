"""CPU rewrites of exported graphs for the embedded (CPU) twin of a repository.

The production repository holds the graphs as exported (what ``docker compose`` serves on a
GPU). On a CPU host the embedded server may serve a rewritten copy of an encoder instead: with
attention fused (:func:`~triton_sam.export.optimize.fuse_attention`), onnxruntime's CPU
provider runs MLAS flash attention rather than materialising each head's score matrix, which
is what made the SAM2.1-tiny encoder slower than the official predictor's ``set_image`` on
the same cores (measured by ``triton-sam bench users``: fp32 1.03-1.05x torch, fused
0.91-1.04x; same math up to float reassociation, 2e-6 on features, within the fp32 export
tolerance). For the SAM3 tracker the same rewrite also folds ``conv_s0``/``conv_s1`` into the
FPN's 3x3 convs (exact up to rounding; see ``export/optimize.py``).

Copies live beside the twin (``.<twin>.cpu_graphs/<model>/``), never inside a repository
(Triton loads every subdirectory), and are reused while the source files are unchanged
(paths, sizes and mtimes recorded in ``source.json``). A graph that cannot be fused (another
family, an already fused graph, an export whose pattern the optimizer does not know) is served
as exported, with a warning for the last: slower, never refused.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from triton_sam.errors import ExportError, UnsupportedModelError

log = logging.getLogger(__name__)

_STAMP = "source.json"


def cache_dir_for(twin_dir: Path) -> Path:
    """Where the rewritten graphs of ``twin_dir`` live: a hidden sibling directory."""
    return twin_dir.parent / f".{twin_dir.name}.cpu_graphs"


def graph_family(graph: Path) -> tuple[str | None, bool]:
    """The family a graph was exported for (from its ``triton_sam.variant`` metadata; None for
    graphs from elsewhere or an unknown variant) and whether its attention is already fused."""
    import onnx

    from triton_sam.export.optimize import FUSED_METADATA_KEY
    from triton_sam.models.registry import get_model

    meta = {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
    fused = FUSED_METADATA_KEY in meta
    try:
        return get_model(meta.get("triton_sam.variant", "")).family.family, fused
    except UnsupportedModelError:
        return None, fused


def fused_encoder_files(
    name: str, files: dict[str, Path], graph: str, cache: Path
) -> dict[str, Path] | None:
    """The files of model ``name`` with its graph ``graph`` (a key of ``files``) replaced by a
    copy with fused attention kept under ``cache``; None when the graph is served as exported
    (no fusion for its family, already fused, or the optimizer found nothing to fuse)."""
    from triton_sam.export.optimize import fuse_attention, has_attention_fusion

    source = Path(files[graph]).resolve()
    family, fused = graph_family(source)
    if fused or family is None or not has_attention_fusion(family):
        return None
    stamp = {
        rel: [str(Path(src).resolve()), os.stat(src).st_size, os.stat(src).st_mtime_ns]
        for rel, src in sorted(files.items())
    }
    target = cache / name
    if _stamp(target) == stamp:
        return {rel: target / rel for rel in files}
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}.fusing-", dir=cache) as tmp:
        staged = Path(tmp) / "graphs"
        for rel, src in files.items():  # the graph and its .onnx_data sidecar, if any
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(src).resolve(), staged / rel)
        try:
            counts = fuse_attention(staged / graph, family)
        except ExportError as e:
            log.warning("%s: serving the encoder as exported (slower on CPU): %s", name, e)
            return None
        (staged / _STAMP).write_text(json.dumps(stamp))
        # Swap the finished copy in; a crash before this leaves only the temporary directory.
        if target.exists():
            shutil.rmtree(target)
        os.replace(staged, target)
    log.info("%s: encoder attention fused for the CPU twin (%s)", name, counts)
    return {rel: target / rel for rel in files}


def _stamp(target: Path) -> object:
    try:
        return json.loads((target / _STAMP).read_text())
    except (OSError, ValueError):
        return None
