"""Checkpoints and pre-exported graphs from the Hugging Face Hub (SAM3: ``facebook/sam3``).

``huggingface_hub`` does the transfer: token from ``HF_TOKEN`` or ``hf auth login``, resumable
downloads, per-file integrity checks (sha256 of LFS files against the Hub's metadata), and
progress bars. Hub errors are translated here, once, into the package's own errors, naming
what to do: accept the licence and log in for a gated repository, go online (or drop
``HF_HUB_OFFLINE``) when nothing is cached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from triton_sam.errors import DownloadError
from triton_sam.models.spec import Checkpoint

# What a transformers model directory needs (config, weights, processor configs).
MODEL_FILE_PATTERNS = ("*.json", "*.safetensors", "*.txt")


def download_hf_checkpoint(
    ckpt: Checkpoint, checkpoints_dir: Path, *, progress: bool = True
) -> Path:
    """Download (or reuse) the snapshot of ``ckpt.hf_repo`` into ``checkpoints_dir/filename``.

    Returns:
        The model directory (``config.json`` + ``*.safetensors``).

    Raises:
        DownloadError: gated repository without access (401/403), unknown repository, or no
            network and nothing cached; the message says how to fix it.
    """
    if not ckpt.hf_repo:
        raise DownloadError(f"checkpoint {ckpt.filename}: no hf_repo configured")
    from huggingface_hub import snapshot_download

    dest = Path(checkpoints_dir) / ckpt.filename
    with _translated(ckpt.hf_repo), _progress(progress):
        snapshot_download(ckpt.hf_repo, local_dir=dest, allow_patterns=list(MODEL_FILE_PATTERNS))
    return dest


def download_hf_files(
    repo_id: str, filenames: Sequence[str], dest_dir: Path, *, progress: bool = True
) -> list[Path]:
    """Download files of a Hub repository into ``dest_dir`` (keeping their relative paths).

    Raises:
        DownloadError: as :func:`download_hf_checkpoint`, or a file missing from the repository.
    """
    from huggingface_hub import hf_hub_download

    paths = []
    with _translated(repo_id), _progress(progress):
        for name in filenames:
            paths.append(Path(hf_hub_download(repo_id, name, local_dir=dest_dir)))
    return paths


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    if not enabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            enable_progress_bars()


@contextlib.contextmanager
def _translated(repo_id: str) -> Iterator[None]:
    """Turn huggingface_hub's errors into DownloadError with the next step to take."""
    from huggingface_hub import errors

    login = (
        f"accept the licence at https://huggingface.co/{repo_id}, then run `hf auth login` "
        "or set HF_TOKEN"
    )
    try:
        yield
    except errors.GatedRepoError as e:
        raise DownloadError(f"{repo_id}: gated repository, access denied; {login}") from e
    except errors.RepositoryNotFoundError as e:  # also what the Hub answers 401 without a token
        raise DownloadError(
            f"{repo_id}: repository not found or not accessible (HTTP 401/404); {login}"
        ) from e
    except errors.LocalEntryNotFoundError as e:  # before EntryNotFoundError, its base
        raise DownloadError(
            f"{repo_id}: offline and not in the local cache (no network, or HF_HUB_OFFLINE=1); "
            "connect and retry, or pass a local checkpoint directory"
        ) from e
    except (errors.EntryNotFoundError, errors.RevisionNotFoundError) as e:
        raise DownloadError(f"{repo_id}: file or revision not found: {e}") from e
    except errors.HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise DownloadError(f"{repo_id}: HTTP {status}, not authorised; {login}") from e
        raise DownloadError(f"{repo_id}: download failed (HTTP {status}): {e}") from e
    except OSError as e:  # network down, disk full, ...
        raise DownloadError(f"{repo_id}: download failed: {e}") from e
