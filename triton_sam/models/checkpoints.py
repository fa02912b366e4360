"""Checkpoint files: which file to export, and what it is.

A checkpoint is resolved without the network (:func:`resolve_checkpoint`), downloaded
(:mod:`~triton_sam.models.download`, resumable) and checked against its published or
recorded sha256 (:mod:`~triton_sam.models.integrity`, whose docstring gives the rules). A
file the user names explicitly (``--checkpoint FILE``) may be a fine-tuned checkpoint
(MedSAM, micro-sam, a lab's own): it is not held to the published hash; its sha256 is
logged and recorded in the exported graphs' metadata (:func:`provenance`), and the exporter
checks it *structurally* (its keys and shapes against the variant's architecture, see
``triton_sam.export.weights``). The names of the other two modules are importable from here.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from triton_sam.errors import CheckpointError
from triton_sam.models.download import PART_SUFFIX, download_checkpoint  # noqa: F401
from triton_sam.models.integrity import (  # noqa: F401 - re-exported: their old home
    _RANDOM_INIT_HINT,
    DEFAULT_CHUNK_BYTES,
    SIDECAR_SUFFIX,
    _published,
    _read_sidecar,
    checkpoint_path,
    sha256_file,
    sidecar_path,
    verify_checkpoint,
)
from triton_sam.models.spec import Checkpoint, ModelSpec

log = logging.getLogger(__name__)


def resolve_checkpoint(
    spec_or_ckpt: ModelSpec | Checkpoint, path: Path | None, dest_dir: Path
) -> Path:
    """Return a checkpoint to export, without touching the network.

    Args:
        spec_or_ckpt: the variant, or its checkpoint entry.
        path: a user-supplied checkpoint (file, or model directory for Hugging Face
            checkpoints), or None for the downloaded one under ``dest_dir``. A user file that
            is not the default path is accepted as it is (it may be fine-tuned): its sha256
            is logged, and whether it is the published file; the exporter then checks its
            structure. The default path is verified like a download.
        dest_dir: the checkpoints directory used by :func:`download_checkpoint`.

    Returns:
        The checkpoint path.

    Raises:
        CheckpointError: the file does not exist (the message says how to get it).
        IntegrityError: the default-path file fails its integrity check.
    """
    ckpt = spec_or_ckpt.checkpoint if isinstance(spec_or_ckpt, ModelSpec) else spec_or_ckpt
    default = checkpoint_path(ckpt, dest_dir)
    if path is not None and not _same_file(Path(path), default):
        path = Path(path)
        if not path.exists():
            raise CheckpointError(
                f"checkpoint: {path} does not exist; pass the path of your checkpoint file, "
                f"or leave --checkpoint out to use the published one at {default}"
            )
        describe_user_checkpoint(ckpt, path)
        return path
    if not default.is_file():
        raise CheckpointError(
            f"checkpoint: no checkpoint at {default}; run `triton-sam download <model>`, or "
            f"download {ckpt.url} on a connected machine and place it at {default}, "
            f"{_RANDOM_INIT_HINT}"
        )
    verify_checkpoint(ckpt, default)
    return default


def describe_user_checkpoint(ckpt: Checkpoint, path: Path) -> tuple[str, bool]:
    """Log the sha256 of a user-supplied checkpoint and whether it is the published file.

    Returns:
        ``(sha256, published)``; ``published`` is True only when a full published hash exists
        and matches.
    """
    digest = checkpoint_sha256(path)
    full, _ = _published(ckpt)
    published = full is not None and digest == full
    if published:
        log.info("checkpoint %s is the published %s (sha256 %s)", path, ckpt.filename, digest)
    else:
        log.warning(
            "checkpoint %s (sha256 %s) is not the published %s: exporting it as a fine-tuned "
            "checkpoint; its keys and shapes are checked against the variant",
            path,
            digest,
            ckpt.filename,
        )
    return digest, published


def checkpoint_sha256(path: Path) -> str:
    """The sha256 of a checkpoint file, or of a model directory's files.

    A directory (a Hugging Face ``save_pretrained`` checkpoint) hashes ``sha256sum``-style
    lines ``<file sha256>  <relative path>`` of its files in sorted order, so the digest
    changes when any file's content or name does.
    """
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    lines = [
        f"{sha256_file(f)}  {f.relative_to(path).as_posix()}\n"
        for f in sorted(p for p in path.rglob("*") if p.is_file())
    ]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def provenance(ckpt: Checkpoint, path: Path, dest_dir: Path) -> dict[str, str]:
    """What a checkpoint is, for the exported graphs' metadata (``triton_sam.*`` keys).

    ``checkpoint_origin`` is ``published`` (the published sha256 matches), ``recorded`` (the
    default-path download, matching the hash recorded at first download) or ``user`` (a file
    the user supplied: fine-tuned, or not verifiable against a published hash).
    """
    digest = checkpoint_sha256(path)
    full, _ = _published(ckpt)
    default = checkpoint_path(ckpt, dest_dir)
    if full is not None and digest == full:
        origin = "published"
    elif full is None and _same_file(Path(path), default) and _read_sidecar(default) == digest:
        origin = "recorded"
    else:
        origin = "user"
    return {
        "triton_sam.checkpoint": Path(path).name,
        "triton_sam.checkpoint_sha256": digest,
        "triton_sam.checkpoint_origin": origin,
    }


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False
