"""Checkpoint files' sha256 integrity: published hashes, prefixes and trust-on-first-use records.

Integrity rules, strongest first:

1. ``Checkpoint.sha256`` (a published full hash): the file must match it.
2. ``Checkpoint.sha256_prefix``: the file's hash must start with it. (The hex in SAM1 file
   names is an MD5 prefix, not a sha256 one; SAM1 configs give the full sha256.)
3. No published full hash: the hash seen at first use is recorded next to the file in
   ``<file>.sha256`` (``sha256sum`` format, trust on first use) and every later check
   compares against that record.

These rules apply to downloads and to the default path under the checkpoints directory. A
file the user names explicitly (``--checkpoint FILE``) may be a fine-tuned checkpoint (MedSAM,
micro-sam, a lab's own): it is not held to the published hash. Its sha256 is logged and
recorded in the exported graphs' metadata, and the exporter checks it *structurally* (its
keys and shapes against the variant's architecture, see ``triton_sam.export.weights``).

Downloads stream into ``<file>.part``, resume it with an HTTP Range request, and move it to
``<file>`` with one ``os.replace`` only after it verified: a half or corrupt file never sits
at the final path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path

from triton_sam.errors import CheckpointError, ConfigError, IntegrityError
from triton_sam.models.spec import Checkpoint

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 1 << 20
SIDECAR_SUFFIX = ".sha256"
_HEX64 = re.compile(r"[0-9a-f]{64}")
# What to say when no checkpoint can be had (resolving one, or downloading it).
_RANDOM_INIT_HINT = "or run the demo/export with random weights (`--random-init`)"


def checkpoint_path(ckpt: Checkpoint, dest_dir: Path) -> Path:
    """Return where ``ckpt`` lives under ``dest_dir`` (``dest_dir / ckpt.filename``).

    Raises:
        ConfigError: ``checkpoint.filename`` is not a bare file name (it would escape
            ``dest_dir``).
    """
    name = ckpt.filename
    if not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise ConfigError(
            f"checkpoint.filename: {name!r} is not a bare file name; "
            "give the file name only, e.g. 'sam2.1_hiera_tiny.pt'"
        )
    return Path(dest_dir) / name


def sidecar_path(path: Path) -> Path:
    """Return the trust-on-first-use record of ``path``: ``<path>.sha256``."""
    return path.with_name(path.name + SIDECAR_SUFFIX)


def sha256_file(path: Path, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> str:
    """Return the lowercase hex sha256 of a file, read in chunks (checkpoints reach GBs).

    Raises:
        OSError: the file cannot be read.
    """
    return _hash_prefix(path, None, chunk_bytes).hexdigest()


def verify_checkpoint(ckpt: Checkpoint, path: Path, *, record: bool = True) -> str:
    """Check ``path`` against the published hash, prefix or recorded hash of ``ckpt``.

    Args:
        ckpt: the checkpoint whose integrity data applies.
        path: the file to check (the downloaded one, or any user-supplied copy).
        record: when no full hash is published and ``<path>.sha256`` does not exist yet,
            write it (trust on first use). False checks without writing anything.

    Returns:
        The file's sha256 as lowercase hex.

    Raises:
        CheckpointError: the file is missing, or its ``.sha256`` record is unreadable.
        IntegrityError: the hash differs from the expected one (message has both).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint: {path} does not exist or is not a file; download it "
            f"(`triton-sam download <model>`) or pass the path of an existing checkpoint"
        )
    digest = sha256_file(path)
    recorded = _read_sidecar(path)
    _check_digest(
        ckpt,
        digest,
        recorded,
        subject=str(path),
        advice=f"delete {path} and download it again (`triton-sam download <model>`)",
    )
    if record and ckpt.sha256 is None and recorded is None:
        try:
            _record(path, digest)
        except OSError as e:  # a read-only checkpoints dir must not block using the file
            log.warning("could not record the sha256 of %s: %s", path, e)
    return digest


def _check_digest(
    ckpt: Checkpoint, digest: str, recorded: str | None, *, subject: str, advice: str
) -> None:
    """Raise IntegrityError unless ``digest`` satisfies every expectation of ``ckpt``."""
    full, prefix = _published(ckpt)
    if full is not None and digest != full:
        raise IntegrityError(
            f"checkpoint.sha256: sha256 of {subject} is {digest}, expected the published "
            f"{full}; {advice}"
        )
    if prefix is not None and not digest.startswith(prefix):
        raise IntegrityError(
            f"checkpoint.sha256_prefix: sha256 of {subject} is {digest}, expected it to start "
            f"with the published prefix {prefix}; {advice}"
        )
    if full is None and recorded is not None and digest != recorded:
        raise IntegrityError(
            f"checkpoint: sha256 of {subject} is {digest}, expected {recorded} as recorded at "
            f"first download in {SIDECAR_SUFFIX} next to {ckpt.filename}; {advice}. If the file "
            "was re-published upstream on purpose, delete the .sha256 record to trust the new one"
        )


def _published(ckpt: Checkpoint) -> tuple[str | None, str | None]:
    """Return the published (full, prefix) hashes, lowercased and validated as hex."""
    full = ckpt.sha256.strip().lower() if ckpt.sha256 else None
    if full is not None and not _HEX64.fullmatch(full):
        raise ConfigError(f"checkpoint.sha256: {ckpt.sha256!r} is not 64 hex digits")
    prefix = ckpt.sha256_prefix.strip().lower() if ckpt.sha256_prefix else None
    if prefix is not None and not re.fullmatch(r"[0-9a-f]{1,64}", prefix):
        raise ConfigError(f"checkpoint.sha256_prefix: {ckpt.sha256_prefix!r} is not hex digits")
    return full, prefix


def _read_sidecar(path: Path) -> str | None:
    """Return the hash recorded in ``<path>.sha256``, or None when there is no record."""
    sidecar = sidecar_path(path)
    if not sidecar.is_file():
        return None
    fields = sidecar.read_text(encoding="utf-8", errors="replace").split()
    digest = fields[0].lower() if fields else ""
    if not _HEX64.fullmatch(digest):
        raise CheckpointError(
            f"checkpoint: {sidecar} does not hold a sha256 record; delete it so that the "
            "hash is recorded again at the next verified use"
        )
    return digest


def _record(path: Path, digest: str) -> None:
    """Write ``<path>.sha256`` atomically, in ``sha256sum -c`` format (trust on first use)."""
    sidecar = sidecar_path(path)
    log.warning(
        "no full sha256 is published for %s: recording %s in %s (trust on first use)",
        path.name,
        digest,
        sidecar,
    )
    fd, tmp = tempfile.mkstemp(prefix=sidecar.name, suffix=".tmp", dir=sidecar.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{digest}  {path.name}\n")
        os.replace(tmp, sidecar)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _hash_prefix(path: Path, nbytes: int | None, chunk_bytes: int) -> hashlib._Hash:
    """Return a sha256 object fed with the first ``nbytes`` of ``path`` (all when None)."""
    hasher = hashlib.sha256()
    remaining = nbytes
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            size = chunk_bytes if remaining is None else min(chunk_bytes, remaining)
            chunk = f.read(size)
            if not chunk:
                break
            hasher.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return hasher
