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

The same renderer writes the local test proxy, the compose proxy and the in-cluster proxy's
ConfigMap (``deploy/``), so the configuration the tests prove is the one that is deployed.
The local process and its access log are in :mod:`triton_sam.scaleout.proxy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from triton_sam.client.routing import ROUTING_HEADER
from triton_sam.errors import InputValidationError

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
    (``proxy`` for HTTP, ``grpc``), after the module's own ``settings``."""
    return [
        "  server {",
        f"    listen {listen};",
        "    location / {",
        f"      {module}_pass {upstream};",
        *(f"      {line}" for line in settings),
        # session calls are idempotent (module docstring): resend a request whose replica
        # died before answering to the next one on the ring
        f"      {module}_next_upstream error timeout non_idempotent;",
        f"      {module}_next_upstream_tries 3;",
        f"      {module}_connect_timeout 2s;",
        f"      {module}_read_timeout {config.read_timeout_s}s;",
        f"      {module}_send_timeout {config.read_timeout_s}s;",
        "    }",
        "  }",
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


def compose_config(replicas: int, *, host_pattern: str = "triton-{i}") -> ProxyConfig:
    """The proxy of ``deploy/compose`` (one Triton container per GPU, ``triton-0`` ...):
    listens on 8000 (HTTP) and 8001 (gRPC) in the proxy container, logs to the container's
    output, keeps its files where the official nginx image lets its workers write."""
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
    )
