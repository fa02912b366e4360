"""Checkpoint files: resumable download and sha256 integrity.

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
import time
from pathlib import Path

import requests
from tqdm import tqdm

from triton_sam.errors import CheckpointError, ConfigError, DownloadError, IntegrityError
from triton_sam.models.spec import Checkpoint, ModelSpec

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 1 << 20
SIDECAR_SUFFIX = ".sha256"
PART_SUFFIX = ".part"
# Seconds before the first resume attempt after an interrupted transfer; doubles each time.
_RETRY_BACKOFF_S = 1.0
_HEX64 = re.compile(r"[0-9a-f]{64}")
_RANDOM_INIT_HINT = "or run the demo/export with random weights (`--random-init`)"


class _Interrupted(Exception):
    """The transfer stopped early; the ``.part`` file (if any) can be resumed."""


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


def download_checkpoint(
    ckpt: Checkpoint,
    dest_dir: Path,
    *,
    progress: bool = True,
    timeout_s: float = 30.0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    retries: int = 3,
) -> Path:
    """Download ``ckpt`` into ``dest_dir`` unless a valid copy is already there.

    An existing ``<file>.part`` is resumed with an HTTP Range request; a transfer that stops
    midway is resumed up to ``retries`` times. The finished file is verified (see the module
    docstring) before it is moved to its final path.

    Args:
        ckpt: URL, file name and integrity data.
        dest_dir: checkpoints directory (created if needed).
        progress: show a progress bar (only on a terminal).
        timeout_s: connect timeout, and the longest wait for the next bytes.
        chunk_bytes: read/write chunk size.
        retries: how many times an interrupted transfer is resumed before giving up.

    Returns:
        The verified checkpoint path, ``dest_dir / ckpt.filename``.

    Raises:
        DownloadError: the URL cannot be reached, answers an HTTP error, or the transfer
            keeps breaking (the ``.part`` is kept for the next run to resume).
        IntegrityError: the downloaded file fails verification (it is deleted).
        CheckpointError: the file cannot be written.
    """
    final = checkpoint_path(ckpt, dest_dir)
    if final.is_file():
        try:
            verify_checkpoint(ckpt, final)
            log.info("checkpoint %s already present and verified", final)
            return final
        except IntegrityError as e:
            # A bad file at the final path would fail every later use; replace it.
            log.warning("%s; deleting it and downloading again", e)
            final.unlink()
    final.parent.mkdir(parents=True, exist_ok=True)
    part = final.with_name(final.name + PART_SUFFIX)
    digest = _download(ckpt.url, part, final, progress, timeout_s, chunk_bytes, retries)
    recorded = _read_sidecar(final)
    try:
        _check_digest(
            ckpt,
            digest,
            recorded,
            subject=f"the file downloaded from {ckpt.url}",
            advice="the download was deleted; run the download again, and if this persists "
            "the server's file differs from the expected one",
        )
    except IntegrityError:
        part.unlink(missing_ok=True)
        raise
    if ckpt.sha256 is None and recorded is None:
        _record(final, digest)
    os.replace(part, final)
    log.info("checkpoint %s downloaded and verified (sha256 %s)", final, digest)
    return final


# --- integrity -------------------------------------------------------------------------


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


# --- transfer --------------------------------------------------------------------------


def _download(
    url: str,
    part: Path,
    final: Path,
    progress: bool,
    timeout_s: float,
    chunk_bytes: int,
    retries: int,
) -> str:
    """Fetch ``url`` into ``part``, resuming after interruptions; return its sha256."""
    attempt = 0
    while True:
        try:
            return _fetch(url, part, final, progress, timeout_s, chunk_bytes)
        except _Interrupted as e:
            if attempt >= retries:
                kept = part.stat().st_size if part.is_file() else 0
                raise DownloadError(
                    f"checkpoint.url: download of {url} was interrupted ({e}); the {kept} bytes "
                    f"received are kept in {part}: run the same download again to resume, or "
                    f"download the file on a connected machine and place it at {final}"
                ) from e
            wait_s = _RETRY_BACKOFF_S * 2**attempt
            attempt += 1
            log.warning("download interrupted (%s); resuming in %.1f s", e, wait_s)
            time.sleep(wait_s)


def _fetch(
    url: str, part: Path, final: Path, progress: bool, timeout_s: float, chunk_bytes: int
) -> str:
    """One request: append the rest of ``url`` to ``part`` (or restart it); return its sha256.

    Raises:
        _Interrupted: the body stopped early, or the server's range answer is unusable.
    """
    offset = part.stat().st_size if part.is_file() else 0
    # identity: with gzip, byte ranges would count compressed bytes.
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    with _get(url, headers, timeout_s, final, part) as response:
        if response.status_code == 416 and offset:
            return _complete_part(response, part, offset, chunk_bytes)
        if response.status_code == 206 and offset:
            start, total = _content_range(response)
            if start != offset:
                part.unlink()
                raise _Interrupted(f"server sent bytes from {start}, not {offset}; restarting")
        elif response.status_code == 200:
            if offset:
                log.info("%s ignores Range requests: restarting from zero", url)
            offset = 0
            total = _int_header(response, "Content-Length")
        else:
            raise DownloadError(
                f"checkpoint.url: {url} answered HTTP {response.status_code} "
                f"{response.reason}; check the URL in the model config, or download the file "
                f"on a connected machine and place it at {final}, {_RANDOM_INIT_HINT}"
            )
        return _stream(response, part, offset, total, final.name, progress, chunk_bytes)


def _get(
    url: str, headers: dict[str, str], timeout_s: float, final: Path, part: Path
) -> requests.Response:
    """Send the GET; turn "cannot connect" into a DownloadError that says what to do."""
    try:
        return requests.get(url, headers=headers, stream=True, timeout=(timeout_s, timeout_s))
    except (requests.ConnectionError, requests.Timeout) as e:
        resume = (
            f" The {part.stat().st_size} bytes already received are kept in {part}; the next "
            "download resumes from there."
            if part.is_file()
            else ""
        )
        raise DownloadError(
            f"checkpoint.url: could not reach {url} ({_reason(e)}); this machine may be "
            f"offline. Download the file on a connected machine and place it at {final} "
            f"(it is sha256-checked on first use), {_RANDOM_INIT_HINT}.{resume}"
        ) from e
    except requests.RequestException as e:
        raise DownloadError(f"checkpoint.url: cannot request {url!r}: {e}") from e


def _stream(
    response: requests.Response,
    part: Path,
    offset: int,
    total: int | None,
    label: str,
    progress: bool,
    chunk_bytes: int,
) -> str:
    """Write the body after ``offset`` bytes of ``part``; return the sha256 of the whole."""
    hasher = _hash_prefix(part, offset, chunk_bytes) if offset else hashlib.sha256()
    bar = tqdm(
        total=total,
        initial=offset,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=label,
        disable=None if progress else True,  # None: tqdm hides itself when not on a TTY
    )
    try:
        with bar, open(part, "ab" if offset else "wb") as f:
            try:
                for chunk in response.iter_content(chunk_size=chunk_bytes):
                    f.write(chunk)
                    hasher.update(chunk)
                    bar.update(len(chunk))
            except requests.RequestException as e:
                raise _Interrupted(_reason(e)) from e
            f.flush()
            os.fsync(f.fileno())  # the os.replace that follows must not publish lost bytes
    except OSError as e:
        raise CheckpointError(
            f"checkpoint: cannot write {part}: {e}; free space or fix "
            "permissions, then run the download again"
        ) from e
    size = part.stat().st_size
    if total is not None and size != total:
        raise _Interrupted(f"received {size} of {total} bytes")
    return hasher.hexdigest()


def _complete_part(response: requests.Response, part: Path, offset: int, chunk_bytes: int) -> str:
    """416 to ``bytes=<offset>-``: the part should already be whole; return its sha256."""
    match = re.fullmatch(r"bytes \*/(\d+)", response.headers.get("Content-Range", "").strip())
    if match and int(match.group(1)) != offset:
        # Larger than the file: not ours to trust (matters for trust-on-first-use).
        part.unlink()
        raise _Interrupted(f"partial file has {offset} bytes, server has {match.group(1)}")
    return _hash_prefix(part, None, chunk_bytes).hexdigest()


def _content_range(response: requests.Response) -> tuple[int, int | None]:
    """Parse ``Content-Range: bytes <start>-<end>/<total|*>`` into (start, total)."""
    header = response.headers.get("Content-Range", "")
    match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", header.strip())
    if match is None:
        raise _Interrupted(f"unusable Content-Range {header!r}")
    total = match.group(3)
    return int(match.group(1)), None if total == "*" else int(total)


def _int_header(response: requests.Response, name: str) -> int | None:
    value = response.headers.get(name, "")
    return int(value) if value.isdigit() else None


def _reason(e: BaseException) -> str:
    """The innermost readable message of a requests error, without urllib3's wrappers."""
    cause: BaseException = e
    # requests wraps urllib3 (MaxRetryError.reason, ProtocolError(msg, cause)): unwrap.
    while cause.args and isinstance(cause.args[0], BaseException):
        cause = cause.args[0]
    reason = getattr(cause, "reason", None)
    if isinstance(reason, BaseException):
        cause = reason
    text = cause.args[0] if cause.args and isinstance(cause.args[0], str) else str(cause)
    return re.sub(r"<[^>]*>:\s*", "", text)
