"""The admin key: the secret that unlocks Triton's model-repository, shared-memory, trace and
logging APIs on every server we start (standard library only).

Inference, health, metadata, model configuration and statistics stay open; the four control
APIs answer 403 (HTTP) / UNAVAILABLE (gRPC) unless the request carries the key in the header
:data:`HTTP_HEADER` (gRPC: the metadata key :data:`GRPC_HEADER`). The key is generated per
install (:func:`load_or_create`), kept in a file only its owner can read, and never has a
published default: a server without one is never started.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from triton_sam.errors import InputValidationError

ENV_VAR = "TRITON_ADMIN_KEY"
HTTP_HEADER = "triton-admin-key"
# Triton's gRPC restriction reads this metadata key (its protocol prefix + the HTTP header).
GRPC_HEADER = "triton-grpc-protocol-" + HTTP_HEADER
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")
# 32 random bytes, URL-safe base64: 256 bits, characters Triton's flag parser and HTTP
# headers take as they are.
KEY_BYTES = 32
MIN_KEY_CHARS = 32  # e.g. `openssl rand -hex 16` (128 bits) and longer
_KEY_CHARS = re.compile(r"[A-Za-z0-9._~-]+")
# Published in earlier versions of the compose file: known to everyone, so never accepted.
PUBLISHED_KEYS = frozenset({"change-me"})
GENERATE_HINT = "generate one with `triton-sam admin-key --env-file .env`"


@dataclass(frozen=True)
class AdminKey:
    """A key and where it came from (``source`` is safe to print; ``value`` never is)."""

    value: str
    source: str

    def __repr__(self) -> str:  # keep the secret out of logs and tracebacks
        return f"AdminKey(source={self.source!r})"


def generate_key() -> str:
    """A fresh key of :data:`KEY_BYTES` random bytes."""
    return secrets.token_urlsafe(KEY_BYTES)


def check_key(value: str, field: str = ENV_VAR) -> str:
    """``value`` if it is acceptable as an admin key.

    Raises:
        InputValidationError: a published default, shorter than :data:`MIN_KEY_CHARS`, or
            characters outside ``A-Z a-z 0-9 . _ ~ -`` (the message never repeats the key).
    """
    if value in PUBLISHED_KEYS:
        raise InputValidationError(field, f"a published default key; {GENERATE_HINT}")
    if len(value) < MIN_KEY_CHARS:
        raise InputValidationError(
            field, f"{len(value)} characters, expected >= {MIN_KEY_CHARS}; {GENERATE_HINT}"
        )
    if not _KEY_CHARS.fullmatch(value):
        raise InputValidationError(
            field, f"expected only the characters A-Z a-z 0-9 . _ ~ -; {GENERATE_HINT}"
        )
    return value


def default_key_path() -> Path:
    """``$XDG_CONFIG_HOME/triton-sam/admin-key`` (``~/.config/...`` when the variable is unset)."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "triton-sam" / "admin-key"


def load_or_create(path: str | os.PathLike[str] | None = None) -> AdminKey:
    """The install's admin key: ``$TRITON_ADMIN_KEY`` when set, else the key file, created
    with a fresh key on first use.

    The file (default :func:`default_key_path`) is created owner-only (0600, its directory
    0700) and refused when others can read or write it, or another user owns it.

    Raises:
        InputValidationError: the variable or the file holds an unacceptable key, or the file
            is not owner-only.
    """
    if os.environ.get(ENV_VAR):
        return AdminKey(check_key(os.environ[ENV_VAR]), f"${ENV_VAR}")
    path = Path(path) if path is not None else default_key_path()
    if not path.exists():
        write_key_file(path, generate_key())
    _check_private(path)
    return AdminKey(check_key(path.read_text().strip(), str(path)), str(path))


def write_key_file(path: str | os.PathLike[str], key: str) -> Path:
    """Write ``key`` to ``path`` owner-only (0600; a new parent directory 0700), atomically
    replacing any older key (rotation)."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write_private(path, check_key(key, str(path)))
    return path


def write_env_file(path: str | os.PathLike[str], key: str) -> Path:
    """Set ``TRITON_ADMIN_KEY=<key>`` in the dotenv file ``path`` (what ``docker compose``
    reads), keeping its other lines; the file is rewritten owner-only (0600)."""
    path = Path(path)
    kept = []
    if path.exists():
        kept = [x for x in path.read_text().splitlines() if not x.startswith(f"{ENV_VAR}=")]
    _write_private(path, "\n".join([*kept, f"{ENV_VAR}={check_key(key)}"]) + "\n")
    return path


def restriction_args(key: str) -> list[str]:
    """The ``tritonserver`` flags restricting :data:`RESTRICTED_APIS` to ``key``, on HTTP and
    gRPC (the gRPC option is ``--grpc-restricted-protocol``: there is no ``-api`` spelling)."""
    value = f"{','.join(RESTRICTED_APIS)}:{HTTP_HEADER}={check_key(key)}"
    return [f"--http-restricted-api={value}", f"--grpc-restricted-protocol={value}"]


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_private(path: Path) -> None:
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InputValidationError(
            str(path),
            f"mode {stat.filemode(info.st_mode)} owned by uid {info.st_uid}; expected a file "
            f"only you can read (chmod 600 {path}), or a new one: delete it and restart",
        )
