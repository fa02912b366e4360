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

**Tenancy (optional bearer tokens)**, off by default: with ``tokens_file`` set, the proxy
answers a request without a valid bearer token itself (HTTP 401, gRPC UNAUTHENTICATED), passes
every other one on with the tenant of its token in ``triton-sam-tenant``, and never serves
Triton's admin APIs. What is checked, and the tokens file, are in
:mod:`triton_sam.scaleout.access` (its names are importable from here too).

The same renderer writes the local test proxy, the compose proxy and the in-cluster proxy's
ConfigMap (``deploy/``), so the configuration the tests prove is the one that is deployed.
The local process and its access log are in :mod:`triton_sam.scaleout.proxy`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from triton_sam.client.routing import ROUTING_HEADER
from triton_sam.errors import InputValidationError
from triton_sam.scaleout.access import (
    GRPC_ADMIN_METHODS,
    GRPC_HEALTH,
    GRPC_PERMISSION_DENIED,
    GRPC_SERVICE,
    GRPC_UNAUTHENTICATED,
    HTTP_ADMIN_PATTERNS,
    HTTP_HEALTH,
    TENANT_VARIABLE,
    check_tokens_path,
    token_maps,
)
from triton_sam.scaleout.access import TENANT_PATTERN as TENANT_PATTERN
from triton_sam.scaleout.access import TOKEN_PATTERN as TOKEN_PATTERN
from triton_sam.scaleout.access import new_token as new_token
from triton_sam.scaleout.access import read_tokens_file as read_tokens_file
from triton_sam.scaleout.access import tokens_text as tokens_text
from triton_sam.scaleout.access import write_tokens_file as write_tokens_file
from triton_sam.serving.protocol.tenancy import TENANT_HEADER

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
        if self.tokens_file is not None:
            check_tokens_path(self.tokens_file)
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
        *_head(
            config.prefix,
            workers=config.worker_processes,
            error_log=config.error_log or config.prefix + "/error.log",
        ),
        f"  log_format sam_routing '{_LOG_FORMAT}';",
        f"  {access}",
        # an embed carries the image; keep bodies up to 16 MiB in memory, larger on disk
        f"  client_max_body_size {config.max_body};",
        "  client_body_buffer_size 16m;",
    ]
    if config.tokens_file:
        lines += token_maps(config.tokens_file)
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
        + (f"{TENANT_VARIABLE};" if config.tokens_file else '"";'),
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
        [rf"^{re.escape(GRPC_SERVICE)}({'|'.join(GRPC_ADMIN_METHODS)})$"]
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
        f'      if ({TENANT_VARIABLE} = "") {{',
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


def _head(prefix: str, *, workers: int, error_log: str) -> list[str]:
    """The start of an nginx.conf up to ``http {``'s temp paths: foreground, files under
    ``prefix`` (where the process may write: the official image's workers, a test's tmp)."""
    return [
        "daemon off;",
        f"worker_processes {workers};",
        f"pid {prefix}/nginx.pid;",
        f"error_log {error_log} warn;",
        "events { worker_connections 1024; }",
        "http {",
        *(f"  {kind}_temp_path {prefix}/{kind};" for kind in _TEMP_PATHS),
    ]


_TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


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
    check_tokens_path(tokens_file)
    # The URL is raw here (nginx normalises only its own request's path): refuse the
    # spellings nginx would normalise (escapes, dot segments), allow repeated slashes.
    url = r"^[a-z][a-z0-9+.-]*://[^/]*"
    admin = [
        url + r"/+v2/+(repository|systemsharedmemory|cudasharedmemory|logging)(/|\?|$)",
        url + r"/+v2/+(models/+[^/?]+/+(versions/+[^/?]+/+)?)?trace(/|\?|$)",
        url + rf"/+{re.escape(GRPC_SERVICE[1:])}({'|'.join(GRPC_ADMIN_METHODS)})$",
        url + r"[^?]*%",
        url + r"[^?]*/\.\.?(/|\?|$)",
    ]
    lines = [
        "# Bearer-token check for ingress-nginx's auth-url (triton_sam.scaleout.nginx).",
        *_head(prefix, workers=1, error_log="stderr"),
        "  access_log off;",
        *token_maps(tokens_file),
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
        f'      if ({TENANT_VARIABLE} = "") {{',
        "        return 401;",
        "      }",
        f"      add_header {TENANT_HEADER} {TENANT_VARIABLE} always;",
        "      return 204;",
        "    }",
        "    location / {",
        "      return 404;",
        "    }",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"
