"""Who gets through the proxy: bearer tokens, the tenant each stands for, and the routes
served without one (health) or never (Triton's admin APIs).

Tenancy is off by default: one trusted team shares the server and every request is in the
default tenant (the proxy still drops a client-sent ``triton-sam-tenant`` header, so nobody
names a tenant through it). With a tokens file (``ProxyConfig.tokens_file``):

- the file maps tokens to tenant names in nginx ``map`` syntax, one ``<token> <tenant>;`` a
  line (:func:`write_tokens_file` writes it, owner-only). nginx cannot hash a request's token
  before looking it up (no digest in its stock modules), so the tokens are stored as they
  are, in a file only the proxy reads; nginx's ``map`` compares strings ignoring case, so
  tokens are lowercase hex (:func:`new_token`: 256 random bits);
- a request without a valid ``Authorization: Bearer <token>`` (HTTP header or gRPC metadata)
  is answered by nginx itself: HTTP 401 with a JSON ``error``, gRPC status 16
  UNAUTHENTICATED; the health endpoints stay open (orchestrators probe them without one);
- every request passed on carries ``triton-sam-tenant: <tenant>`` (``proxy_set_header`` /
  ``grpc_set_header``, which replace whatever the client sent under that name, in any case)
  and no ``Authorization`` (the token stays at the proxy);
- Triton's admin APIs (model repository, shared memory, trace, logging) are not served through
  the proxy at all (HTTP 403, gRPC 7 PERMISSION_DENIED), on top of Triton's own admin key.

Triton forwards the header to the models (``--http-header-forward-pattern`` /
``--grpc-header-forward-pattern``, ``serving.protocol.tenancy``), which keep each tenant's
state apart and refuse a request that carries the tenant twice (a forged body parameter
next to the proxy's header). The nginx text that enforces all this is rendered by
:mod:`triton_sam.scaleout.nginx`.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from triton_sam.errors import InputValidationError

# The header the proxy sets (and a service speaking for tenants sends, as the proxy does).
from triton_sam.serving.protocol.tenancy import DEFAULT_TENANT as DEFAULT_TENANT
from triton_sam.serving.protocol.tenancy import MAX_TENANT_CHARS
from triton_sam.serving.protocol.tenancy import TENANT_HEADER as TENANT_HEADER

# Tokens: lowercase hex, at least 128 bits (nginx's map ignores case, so only these are safe
# to compare); tenants: short names that are safe in a header and in a file name.
TOKEN_PATTERN = re.compile(r"[0-9a-f]{32,128}")
TENANT_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_TENANT_CHARS - 1}}}")
# nginx variables of the token check.
TOKEN_VARIABLE = "$sam_bearer_token"
TENANT_VARIABLE = "$sam_tenant"
# Triton's health endpoints, open without a token.
HTTP_HEALTH = ("/v2/health/live", "/v2/health/ready")
GRPC_SERVICE = "/inference.GRPCInferenceService/"
GRPC_HEALTH = (GRPC_SERVICE + "ServerLive", GRPC_SERVICE + "ServerReady")
# Triton's restricted APIs (model repository, shared memory, trace, logging): with tokens on,
# the proxy serves none of them. HTTP paths as Triton routes them (any case, nginx decodes and
# normalises the URI before matching), gRPC methods of inference.GRPCInferenceService.
HTTP_ADMIN_PATTERNS = (
    r"^/v2/(repository|systemsharedmemory|cudasharedmemory|logging)(/|$)",
    r"^/v2/(models/[^/]+/(versions/[^/]+/)?)?trace(/|$)",
)
GRPC_ADMIN_METHODS = (
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
    "TraceSetting",
    "LogSettings",
)
GRPC_UNAUTHENTICATED = 16
GRPC_PERMISSION_DENIED = 7
# The folder write_tokens_file creates for a tokens file: only its owner may list or enter it.
TOKENS_FOLDER_MODE = 0o700
TOKENS_FILE_MODE = 0o600


def check_tokens_path(tokens_file: str) -> None:
    """Refuse a tokens path that would change the configuration it is written into.

    Raises:
        InputValidationError: an empty path, or one with a space, quote, ``;``, brace or ``$``.
    """
    if not tokens_file or any(c in tokens_file for c in " ;{}\n\t'\"$"):
        raise InputValidationError("tokens_file", f"got {tokens_file!r}, expected a plain path")


def token_maps(tokens_file: str) -> list[str]:
    """The nginx ``map`` blocks (in ``http {}``) that give the bearer token of a request (its
    ``Authorization`` header, or gRPC metadata, which nginx sees as the same HTTP/2 header) and
    the tenant it maps to (``""`` for none) in :data:`TENANT_VARIABLE`."""
    return [
        # a 128-character token is a longer key than nginx's default map buckets hold
        "  map_hash_bucket_size 256;",
        f"  map $http_authorization {TOKEN_VARIABLE} {{",
        '    default "";',
        '    "~*^bearer +(?<sam_token>[0-9a-f]+) *$" $sam_token;',
        "  }",
        f"  map {TOKEN_VARIABLE} {TENANT_VARIABLE} {{",
        '    default "";',
        '    "" "";',
        f"    include {tokens_file};",
        "  }",
    ]


def new_token() -> str:
    """A fresh bearer token: 256 random bits as lowercase hex."""
    return secrets.token_hex(32)


def tokens_text(tokens: Mapping[str, str]) -> str:
    """The tokens file of ``tokens`` (token -> tenant): nginx ``map`` lines.

    Raises:
        InputValidationError: a token that is not 32-128 lowercase hex digits, or a tenant name
            outside ``TENANT_PATTERN``.
    """
    lines = ["# bearer token -> tenant (triton_sam.scaleout.nginx); keep this file secret"]
    for token, tenant in tokens.items():
        if not isinstance(token, str) or not TOKEN_PATTERN.fullmatch(token):
            raise InputValidationError(
                "tokens", "a token is not 32-128 lowercase hex digits (new_token() makes one)"
            )
        if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
            raise InputValidationError(
                "tokens",
                f"tenant {tenant!r}: expected letters, digits, '_', '.', '-' (at most "
                f"{MAX_TENANT_CHARS}, starting with a letter or digit)",
            )
        lines.append(f"{token} {tenant};")
    return "\n".join(lines) + "\n"


def read_tokens_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """The tokens of a file :func:`write_tokens_file` wrote (token -> tenant).

    Raises:
        InputValidationError: a line that is not ``<token> <tenant>;``, or a bad token/tenant.
    """
    tokens = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.removesuffix(";").split()
        if not line.endswith(";") or len(parts) != 2:
            raise InputValidationError("tokens", f"{path}:{number}: expected '<token> <tenant>;'")
        tokens[parts[0]] = parts[1]
    tokens_text(tokens)  # validates
    return tokens


def write_tokens_file(path: str | os.PathLike[str], tokens: Mapping[str, str]) -> Path:
    """Write ``tokens`` (token -> tenant) for ``ProxyConfig.tokens_file``, readable by its
    owner only (0o600), atomically; nginx reads it when it starts or reloads.

    A missing folder is created owner-only (0o700, its missing parents as the umask makes
    them): the file is a secret, and so is the list of what sits beside it.

    Raises:
        InputValidationError: a bad token or tenant (nothing is written), or a folder that
            cannot be made (the message names it and the reason).
    """
    path = Path(path)
    text = tokens_text(tokens)
    _make_folder(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, TOKENS_FILE_MODE)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _make_folder(folder: Path) -> None:
    if folder.is_dir():
        return
    try:
        folder.mkdir(mode=TOKENS_FOLDER_MODE, parents=True)
    except FileExistsError:
        if not folder.is_dir():  # a file where the folder should be
            raise InputValidationError(
                "path", f"{folder} is a file, expected the folder of the tokens file"
            ) from None
        return  # made meanwhile by someone else: theirs, left as it is
    except OSError as e:
        raise InputValidationError(
            "path", f"cannot create the folder {folder} of the tokens file: {e.strerror}"
        ) from e
    # mkdir's mode passes through the umask, which may only take bits away: set it as meant
    folder.chmod(TOKENS_FOLDER_MODE)
