"""Where a Triton server listens and how to reach it: a user URL as an :class:`Endpoint`, and
the client-side TLS options (no I/O)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from triton_sam.errors import InputValidationError

Protocol = Literal["http", "grpc"]
DEFAULT_PORTS: dict[str, int] = {"http": 8000, "grpc": 8001}
# A gRPC scheme names the protocol: ``grpc://host:8001`` talks gRPC whatever ``protocol`` says
# (an ``http(s)://`` URL keeps the ``protocol`` argument: ``https://`` asks for TLS on both).
_GRPC_SCHEMES = ("grpc://", "grpcs://")


@dataclass(frozen=True)
class Endpoint:
    """Where a Triton server listens.

    Attributes:
        address: ``host:port`` as tritonclient expects it (no scheme).
        protocol: ``"http"`` or ``"grpc"``.
        ssl: True for ``https://`` (or ``grpcs://``) URLs.
    """

    address: str
    protocol: Protocol
    ssl: bool


def bearer_headers(token: str | None) -> dict[str, str]:
    """The header a token proxy checks (``Authorization: Bearer <token>``), or none.

    The name is lower case: gRPC metadata keys must be (HTTP header names are compared
    without case). The token is a secret: it travels in this header only, never in a
    message, a log line or a ``repr``.

    Raises:
        InputValidationError: (field ``token``) a token that is not one printable word.
    """
    if token is None:
        return {}
    from triton_sam.errors import InputValidationError

    if not isinstance(token, str) or not token.isprintable() or not token or " " in token:
        raise InputValidationError("token", "expected one printable word (the proxy's token)")
    return {"authorization": f"Bearer {token}"}


def resolve_endpoint(url: str | None, protocol: str) -> Endpoint:
    """Turn a user URL (or ``$TRITON_URL``, or the default port) into an Endpoint.

    ``https://host:port`` (or ``grpcs://``) enables TLS; ``grpc://`` / ``grpcs://`` select
    gRPC; a bare ``host`` gets the protocol's default port.

    Raises:
        InputValidationError: unknown protocol or malformed URL.
    """
    if protocol not in DEFAULT_PORTS:
        raise InputValidationError("protocol", f"got {protocol!r}, expected 'http' or 'grpc'")
    url = url or os.environ.get("TRITON_URL") or f"localhost:{DEFAULT_PORTS[protocol]}"
    if url.startswith(_GRPC_SCHEMES):
        protocol = "grpc"
    ssl = url.startswith(("https://", "grpcs://"))
    address = url.split("://", 1)[-1].rstrip("/")
    if not address or "/" in address or " " in address:
        raise InputValidationError("url", f"got {url!r}, expected host[:port] or https://host:port")
    if ":" not in address.rsplit("]", 1)[-1]:
        address = f"{address}:{DEFAULT_PORTS[protocol]}"
    return Endpoint(address=address, protocol=protocol, ssl=ssl)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TlsOptions:
    """Client-side TLS for a server behind TLS (``https://`` / ``grpcs://`` URLs).

    Attributes:
        root_certificates: PEM file of the CA that signed the server's certificate (None:
            the system's trust store).
        private_key / certificate_chain: PEM files of a client certificate, for servers
            that require mutual TLS (``--grpc-use-ssl-mutual``).
        insecure: HTTP only: skip verifying the server's certificate (testing only).
    """

    root_certificates: str | None = None
    private_key: str | None = None
    certificate_chain: str | None = None
    insecure: bool = False

    def http_options(self) -> dict[str, Any]:
        """``ssl_options`` / ``insecure`` for ``tritonclient.http`` (geventhttpclient)."""
        files = {
            "ca_certs": self.root_certificates,
            "certfile": self.certificate_chain,
            "keyfile": self.private_key,
        }
        return {
            "ssl_options": {k: v for k, v in files.items() if v} or None,
            "insecure": self.insecure,
        }

    def grpc_options(self) -> dict[str, Any]:
        """Keyword arguments for ``tritonclient.grpc`` (sync and aio): file paths."""
        return {
            "root_certificates": self.root_certificates,
            "private_key": self.private_key,
            "certificate_chain": self.certificate_chain,
        }

    def ssl_context(self) -> Any:
        """An ``ssl.SSLContext`` for ``tritonclient.http.aio`` (aiohttp)."""
        import ssl

        context = ssl.create_default_context(cafile=self.root_certificates)
        if self.certificate_chain:
            context.load_cert_chain(self.certificate_chain, self.private_key)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context
