"""Tenants: who a request belongs to, as the shipped proxy vouches (standard library only).

With bearer tokens on (the nginx proxy of :mod:`triton_sam.scaleout.nginx`, compose's proxy,
the Kubernetes ingress), the proxy maps each valid token to a tenant name and sets the HTTP
header / gRPC metadata :data:`TENANT_HEADER` on every request it passes on, replacing any
value the client sent. Triton forwards that header to the models as a request parameter
(``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern`` =
:data:`FORWARD_PATTERN`), and every server-side model keeps its state (cached features, kept
logits, tracking sessions) in the tenant's own namespace.

Why a duplicate is refused: Triton also accepts parameters in the request body, and keeps both
when a body parameter and a forwarded header share a name (measured on 2.51: HTTP keeps the
header's spelling, ``Triton-Sam-Tenant``, next to the body's; gRPC keeps both keys). Behind the
proxy the header is always present, so a second value can only be a client's forgery.

Without the proxy (one trusted team, tokens off) no header arrives and every request is in
the default tenant ``""``. Triton's ports must then not be reachable from other teams: a
client that reaches Triton directly can name any tenant (the README's security model).
"""

from __future__ import annotations

import json

from . import ERR_INVALID_INPUT, ProtocolError

TENANT_HEADER = "triton-sam-tenant"
# Triton's header-forwarding regex. Measured on 2.51: it matches HTTP header names whatever
# their case, and forwards the name as the client spelled it (hence the lower() below).
FORWARD_PATTERN = "^triton-sam-tenant$"
DEFAULT_TENANT = ""
MAX_TENANT_CHARS = 64


def tenant_from_parameters(parameters_json: str | None) -> str:
    """The tenant of a request, from its parameters (the python backend's
    ``request.parameters()``, a JSON object in text).

    Returns:
        The tenant name, or :data:`DEFAULT_TENANT` when the request carries none.

    Raises:
        ProtocolError: ``InvalidInput`` naming ``triton-sam-tenant`` when the tenant is given
            twice (a forgery next to the proxy's header), is not text, or is too long.
    """
    if not parameters_json:
        return DEFAULT_TENANT
    pairs = json.loads(parameters_json, object_pairs_hook=list)
    values = [value for key, value in pairs if key.lower() == TENANT_HEADER]
    if not values:
        return DEFAULT_TENANT
    if len(values) > 1:
        raise ProtocolError(
            ERR_INVALID_INPUT,
            f"{TENANT_HEADER}: given {len(values)} times; the tenant is set by the proxy "
            "from the bearer token, a request must not carry it",
            TENANT_HEADER,
        )
    value = values[0]
    if not isinstance(value, str) or len(value) > MAX_TENANT_CHARS:
        raise ProtocolError(
            ERR_INVALID_INPUT,
            f"{TENANT_HEADER}: expected text of at most {MAX_TENANT_CHARS} characters",
            TENANT_HEADER,
        )
    return value


def request_tenant(request) -> str:
    """:func:`tenant_from_parameters` of a python-backend request."""
    return tenant_from_parameters(request.parameters())
