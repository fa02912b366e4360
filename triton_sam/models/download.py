"""Checkpoint downloads: streamed into ``<file>.part``, resumed with HTTP Range requests after
an interruption, and moved to ``<file>`` with one ``os.replace`` only after the file verified
(:mod:`~triton_sam.models.integrity`): a half or corrupt file never sits at the final path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from pathlib import Path

import requests
from tqdm import tqdm

from triton_sam.errors import CheckpointError, DownloadError, IntegrityError
from triton_sam.models.integrity import (
    _RANDOM_INIT_HINT,
    DEFAULT_CHUNK_BYTES,
    _check_digest,
    _hash_prefix,
    _read_sidecar,
    _record,
    checkpoint_path,
    verify_checkpoint,
)
from triton_sam.models.spec import Checkpoint

log = logging.getLogger(__name__)

PART_SUFFIX = ".part"
# Seconds before the first resume attempt after an interrupted transfer; doubles each time.
_RETRY_BACKOFF_S = 1.0


class _Interrupted(Exception):
    """The transfer stopped early; the ``.part`` file (if any) can be resumed."""


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
