"""The image-affine proxy: an nginx configuration, rendered from one dataclass, and its process.

nginx sits in front of N Triton replicas and picks the replica of every request with a
**consistent hash** of the routing header (``x-sam-image-id``, set by the clients on every
session call, see ``triton_sam.client.routing``). Properties this relies on (nginx's
``ngx_http_upstream_hash_module``):

- ``hash $http_x_sam_image_id consistent`` (ketama): each server owns 160 points per unit of
  weight on a ring; removing one server moves only the keys it owned.
- A server that fails (connection refused, reset before the response header) is marked
  failed for ``fail_timeout``; its keys go to the next server on the ring, the same one for
  every request, so a client's re-embed and its next click meet on the new owner.
- A request without the header (encoder, metadata, health) is balanced round-robin.
- Balancing is per request: nginx terminates the client's HTTP/1.1 keep-alive connection or
  HTTP/2 (gRPC) channel and opens its own upstream connections, so one long-lived gRPC
  channel is not pinned to one replica (an L4 balancer, e.g. a Kubernetes ClusterIP
  Service, would pin it).
- Session calls are idempotent (a probe, an embed under a content id, a click that writes
  its own logits key), so a request whose replica died before answering is re-sent to the
  next one (``*_next_upstream ... non_idempotent``); the new owner answers "not embedded"
  and the client re-embeds through its usual miss path.

**Tenancy (optional bearer tokens).** Off by default: one trusted team shares the server and
every request is in the default tenant (the proxy still drops a client-sent
``triton-sam-tenant`` header, so nobody names a tenant through it). With ``tokens_file`` set:

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
next to the proxy's header).

The same renderer writes the local test proxy, the compose proxy and the in-cluster proxy's
ConfigMap (``deploy/``), so the configuration the tests prove is the one that is deployed.
The local process and its access log are in :mod:`triton_sam.scaleout.proxy`.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from triton_sam.client.routing import ROUTING_HEADER
from triton_sam.errors import InputValidationError
from triton_sam.serving.protocol.tenancy import MAX_TENANT_CHARS, TENANT_HEADER

# nginx exposes request header "x-sam-image-id" as $http_x_sam_image_id.
HASH_VARIABLE = "$http_" + ROUTING_HEADER.replace("-", "_")
# Tab-separated access log, parsed by read_access_log: which replica(s) a request went to
# (comma-separated when nginx retried on another one), their statuses, the client-facing
# status, the gRPC status trailer, the routing key, the request size, the time, the URI
# (parsed by triton_sam.scaleout.proxy.read_access_log).
LOG_FIELDS = (
    "upstream_addr",
    "upstream_status",
    "status",
    "grpc_status",
    "key",
    "request_length",
    "request_time",
    "uri",
)
_LOG_FORMAT = "\\t".join(
    (
        "$upstream_addr",
        "$upstream_status",
        "$status",
        "$upstream_trailer_grpc_status",
        HASH_VARIABLE,
        "$request_length",
        "$request_time",
        "$request_uri",
    )
)

# Tokens: lowercase hex, at least 128 bits (nginx's map ignores case, so only these are safe
# to compare); tenants: short names that are safe in a header and in a file name.
TOKEN_PATTERN = re.compile(r"[0-9a-f]{32,128}")
TENANT_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_TENANT_CHARS - 1}}}")
# nginx variables of the token check.
_TOKEN_VARIABLE = "$sam_bearer_token"
_TENANT_VARIABLE = "$sam_tenant"
# Triton's health endpoints, open without a token.
HTTP_HEALTH = ("/v2/health/live", "/v2/health/ready")
_GRPC_SERVICE = "/inference.GRPCInferenceService/"
GRPC_HEALTH = (_GRPC_SERVICE + "ServerLive", _GRPC_SERVICE + "ServerReady")
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


@dataclass(frozen=True)
class ProxyConfig:
    """What the proxy listens on and where the replicas are.

    Attributes:
        http_backends / grpc_backends: ``host:port`` of each replica's HTTP / gRPC endpoint
            (same order: replica i is entry i of both). Either may be empty.
        http_listen / grpc_listen: ``[host:]port`` the proxy listens on for each protocol.
        fail_timeout_s: how long a replica that failed stays out of the ring before nginx
            tries it again (nginx ``fail_timeout``).
        max_body: largest request body (an embed carries the image: 12 MiB of float32 for
            a 1024x1024 SAM2 input).
        read_timeout_s: how long a request may take on a replica (an encode on CPU).
        worker_processes: nginx workers (they share the failure state through ``zone``).
        access_log: path of the access log in LOG_FIELDS format, or None for none.
        prefix: nginx's prefix directory (pid file, temp files).
        error_log: where nginx writes errors (``stderr`` in a container); None:
            ``<prefix>/error.log``.
        tokens_file: the bearer tokens (``<token> <tenant>;`` lines, see the module
            docstring), as the nginx process sees the path; None: tokens off.
    """

    http_backends: tuple[str, ...] = ()
    grpc_backends: tuple[str, ...] = ()
    http_listen: str = "127.0.0.1:8000"
    grpc_listen: str = "127.0.0.1:8001"
    fail_timeout_s: int = 10
    max_body: str = "64m"
    read_timeout_s: int = 300
    worker_processes: int = 1
    access_log: str | None = None
    prefix: str = "/var/lib/nginx"
    error_log: str | None = None
    tokens_file: str | None = None

    def __post_init__(self) -> None:
        if not self.http_backends and not self.grpc_backends:
            raise InputValidationError("backends", "got none, expected at least one replica")
        for name in ("http_backends", "grpc_backends"):
            for backend in getattr(self, name):
                if not backend or any(c in backend for c in " ;{}\n\t'\""):
                    raise InputValidationError(name, f"got {backend!r}, expected host:port")
        both = self.http_backends and self.grpc_backends
        if both and len(self.http_backends) != len(self.grpc_backends):
            raise InputValidationError(
                "grpc_backends",
                f"got {len(self.grpc_backends)} entries, expected one per HTTP backend "
                f"({len(self.http_backends)})",
            )
        if self.tokens_file is not None and (
            not self.tokens_file or any(c in self.tokens_file for c in " ;{}\n\t'\"$")
        ):
            raise InputValidationError(
                "tokens_file", f"got {self.tokens_file!r}, expected a plain path"
            )
        for name in ("fail_timeout_s", "read_timeout_s", "worker_processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InputValidationError(name, f"got {value!r}, expected an integer >= 1")


def render_nginx_conf(config: ProxyConfig) -> str:
    """The complete ``nginx.conf`` for ``config`` (runs in the foreground: ``daemon off``)."""
    access = (
        f"access_log {config.access_log} sam_routing;" if config.access_log else "access_log off;"
    )
    lines = [
        "# Image-affine proxy for Triton replicas (rendered by triton_sam.scaleout.nginx).",
        "daemon off;",
        f"worker_processes {config.worker_processes};",
        f"pid {config.prefix}/nginx.pid;",
        f"error_log {config.error_log or config.prefix + '/error.log'} warn;",
        "events { worker_connections 1024; }",
        "http {",
        f"  client_body_temp_path {config.prefix}/client_body;",
        f"  proxy_temp_path {config.prefix}/proxy;",
        f"  fastcgi_temp_path {config.prefix}/fastcgi;",
        f"  uwsgi_temp_path {config.prefix}/uwsgi;",
        f"  scgi_temp_path {config.prefix}/scgi;",
        f"  log_format sam_routing '{_LOG_FORMAT}';",
        f"  {access}",
        # an embed carries the image; keep bodies up to 16 MiB in memory, larger on disk
        f"  client_max_body_size {config.max_body};",
        "  client_body_buffer_size 16m;",
    ]
    if config.tokens_file:
        lines += _token_maps(config.tokens_file)
    if config.http_backends:
        lines += _upstream("triton_http", config.http_backends, config)
        http = ["proxy_http_version 1.1;", 'proxy_set_header Connection "";']
        http += ["proxy_set_header Host $host;"]
        lines += _server(config.http_listen, "proxy", "http://triton_http", http, config)
    if config.grpc_backends:
        lines += _upstream("triton_grpc", config.grpc_backends, config)
        # gRPC is HTTP/2; clients speak it in cleartext with prior knowledge (h2c)
        lines += _server(f"{config.grpc_listen} http2", "grpc", "grpc://triton_grpc", [], config)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _token_maps(tokens_file: str) -> list[str]:
    """The bearer token of a request (its ``Authorization`` header, or gRPC metadata, which
    nginx sees as the same HTTP/2 header) and the tenant it maps to ("" for none)."""
    return [
        # a 128-character token is a longer key than nginx's default map buckets hold
        "  map_hash_bucket_size 256;",
        f"  map $http_authorization {_TOKEN_VARIABLE} {{",
        '    default "";',
        '    "~*^bearer +(?<sam_token>[0-9a-f]+) *$" $sam_token;',
        "  }",
        f"  map {_TOKEN_VARIABLE} {_TENANT_VARIABLE} {{",
        '    default "";',
        '    "" "";',
        f"    include {tokens_file};",
        "  }",
    ]


def _server(
    listen: str, module: str, upstream: str, settings: Sequence[str], config: ProxyConfig
) -> list[str]:
    """A server block passing every request to ``upstream`` through nginx's ``module``
    (``proxy`` for HTTP, ``grpc``), after the module's own ``settings``; with tokens on, the
    token check, the health locations open without one and the admin APIs refused."""
    passing = [
        f"      {module}_pass {upstream};",
        *(f"      {line}" for line in settings),
        # the tenant is the proxy's word only: replace whatever the client sent under the
        # name (none with tokens off), and keep the token at the proxy
        f"      {module}_set_header {TENANT_HEADER} "
        + (f"{_TENANT_VARIABLE};" if config.tokens_file else '"";'),
        *([f'      {module}_set_header Authorization "";'] if config.tokens_file else []),
        # session calls are idempotent (module docstring): resend a request whose replica
        # died before answering to the next one on the ring
        f"      {module}_next_upstream error timeout non_idempotent;",
        f"      {module}_next_upstream_tries 3;",
        f"      {module}_connect_timeout 2s;",
        f"      {module}_read_timeout {config.read_timeout_s}s;",
        f"      {module}_send_timeout {config.read_timeout_s}s;",
    ]
    grpc = module == "grpc"
    # nginx counts every message of a gRPC stream against the body limit, so a long-lived
    # stream (sam-link keeps one per channel for the whole Paintera session) died after
    # ~18 encodes under 64 MiB. No total limit on gRPC: each message is bounded upstream by
    # the models' input shapes, which Triton checks before it runs anything.
    head = ["  server {", f"    listen {listen};"]
    head += ["    client_max_body_size 0;"] if grpc else []
    if not config.tokens_file:
        return [*head, "    location / {", *passing, "    }", "  }"]
    refuse_401 = (
        _grpc_status(GRPC_UNAUTHENTICATED, "a valid bearer token is required")
        if grpc
        else _http_error(401, "a valid bearer token is required", bearer=True)
    )
    refuse_403 = (
        _grpc_status(GRPC_PERMISSION_DENIED, "not served through the proxy")
        if grpc
        else _http_error(403, "not served through the proxy")
    )
    health = GRPC_HEALTH if grpc else HTTP_HEALTH
    admin = (
        [rf"^{re.escape(_GRPC_SERVICE)}({'|'.join(GRPC_ADMIN_METHODS)})$"]
        if grpc
        else list(HTTP_ADMIN_PATTERNS)
    )
    lines = list(head)
    for path in health:
        lines += [f"    location = {path} {{", *passing, "    }"]
    for pattern in admin:
        lines += [f'    location ~* "{pattern}" {{', *refuse_403, "    }"]
    lines += [
        "    location / {",
        f'      if ({_TENANT_VARIABLE} = "") {{',
        "        return 401;",
        "      }",
        "      error_page 401 = @sam_unauthenticated;",
        *passing,
        "    }",
        "    location @sam_unauthenticated {",
        *refuse_401,
        "    }",
        "  }",
    ]
    return lines


def _http_error(status: int, message: str, *, bearer: bool = False) -> list[str]:
    """nginx answers ``status`` itself, with a body in Triton's error format."""
    lines = ["      default_type application/json;"]
    if bearer:
        lines.append("      add_header WWW-Authenticate 'Bearer realm=\"triton-sam\"' always;")
    return [*lines, f'      return {status} \'{{"error":"{message}"}}\';']


def _grpc_status(code: int, message: str) -> list[str]:
    """nginx answers a gRPC call itself: a trailers-only response with ``grpc-status``."""
    return [
        "      default_type application/grpc;",
        f"      add_header grpc-status {code} always;",
        f'      add_header grpc-message "{message}" always;',
        "      return 200;",
    ]


def _upstream(name: str, backends: Sequence[str], config: ProxyConfig) -> list[str]:
    return [
        f"  upstream {name} {{",
        # shared failure state: every worker sees a dead replica as soon as one does
        f"    zone {name} 64k;",
        f"    hash {HASH_VARIABLE} consistent;",
        *(f"    server {b} max_fails=1 fail_timeout={config.fail_timeout_s}s;" for b in backends),
        "    keepalive 32;",
        "  }",
    ]


# Where the compose proxy reads the bearer tokens with tokens on (deploy/compose/tokens/).
COMPOSE_TOKENS_FILE = "/etc/nginx/tokens/tokens.map"


def compose_config(
    replicas: int, *, host_pattern: str = "triton-{i}", tokens_file: str | None = None
) -> ProxyConfig:
    """The proxy of ``deploy/compose`` (one Triton container per GPU, ``triton-0`` ...):
    listens on 8000 (HTTP) and 8001 (gRPC) in the proxy container, logs to the container's
    output, keeps its files where the official nginx image lets its workers write;
    ``tokens_file`` (the path in the container, ``COMPOSE_TOKENS_FILE``) turns tokens on."""
    if not isinstance(replicas, int) or replicas < 1:
        raise InputValidationError("replicas", f"got {replicas!r}, expected an integer >= 1")
    hosts = [host_pattern.format(i=i) for i in range(replicas)]
    return ProxyConfig(
        http_backends=tuple(f"{h}:8000" for h in hosts),
        grpc_backends=tuple(f"{h}:8001" for h in hosts),
        http_listen="8000",
        grpc_listen="8001",
        access_log="/dev/stdout",
        prefix="/var/cache/nginx",
        error_log="stderr",
        tokens_file=tokens_file,
    )


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
    owner only, atomically; nginx reads it when it starts or reloads."""
    path = Path(path)
    text = tokens_text(tokens)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# The in-cluster token check (deploy/kubernetes/overlays/tenancy): ingress-nginx asks it about
# every request (``auth-url``) and copies its ``triton-sam-tenant`` answer onto the request it
# passes on (``auth-response-headers``; ``proxy_set_header`` or, for gRPC, ``grpc_set_header``,
# which replace the client's header of that name).
AUTH_PATH = "/auth"
AUTH_PORT = 8080
# ingress-nginx tells the check which request it is about: the URL as the client sent it.
_ORIGINAL_URL = "$http_x_original_url"


def render_auth_conf(
    tokens_file: str, *, listen: str = str(AUTH_PORT), prefix: str = "/var/cache/nginx"
) -> str:
    """The ``nginx.conf`` of the token check behind ingress-nginx's ``auth-url``.

    ``GET /auth`` with the client's headers: 204 with ``triton-sam-tenant: <tenant>`` for a
    valid bearer token, 401 without one, 403 for Triton's admin APIs (judged from the
    ``X-Original-URL`` ingress-nginx sends, as the client spelled it: defence in depth, Triton's
    admin key is the guard). ingress-nginx answers the client with the same status (a gRPC
    client reads 401 as UNAUTHENTICATED, 403 as PERMISSION_DENIED).
    """
    ProxyConfig(http_backends=("check:1",), tokens_file=tokens_file)  # validates the path
    # The URL is raw here (nginx normalises only its own request's path): refuse the
    # spellings nginx would normalise (escapes, dot segments), allow repeated slashes.
    url = r"^[a-z][a-z0-9+.-]*://[^/]*"
    admin = [
        url + r"/+v2/+(repository|systemsharedmemory|cudasharedmemory|logging)(/|\?|$)",
        url + r"/+v2/+(models/+[^/?]+/+(versions/+[^/?]+/+)?)?trace(/|\?|$)",
        url + rf"/+{re.escape(_GRPC_SERVICE[1:])}({'|'.join(GRPC_ADMIN_METHODS)})$",
        url + r"[^?]*%",
        url + r"[^?]*/\.\.?(/|\?|$)",
    ]
    lines = [
        "# Bearer-token check for ingress-nginx's auth-url (triton_sam.scaleout.nginx).",
        "daemon off;",
        "worker_processes 1;",
        f"pid {prefix}/nginx.pid;",
        "error_log stderr warn;",
        "events { worker_connections 1024; }",
        "http {",
        f"  client_body_temp_path {prefix}/client_body;",
        f"  proxy_temp_path {prefix}/proxy;",
        f"  fastcgi_temp_path {prefix}/fastcgi;",
        f"  uwsgi_temp_path {prefix}/uwsgi;",
        f"  scgi_temp_path {prefix}/scgi;",
        "  access_log off;",
        *_token_maps(tokens_file),
        f"  map {_ORIGINAL_URL} $sam_admin {{",
        "    default 0;",
        *(f'    "~*{pattern}" 1;' for pattern in admin),
        "  }",
        "  server {",
        f"    listen {listen};",
        f"    location = {AUTH_PATH} {{",
        "      if ($sam_admin) {",
        "        return 403;",
        "      }",
        f'      if ({_TENANT_VARIABLE} = "") {{',
        "        return 401;",
        "      }",
        f"      add_header {TENANT_HEADER} {_TENANT_VARIABLE} always;",
        "      return 204;",
        "    }",
        "    location / {",
        "      return 404;",
        "    }",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"
