"""Who is calling the backend: Label Studio's credentials -> a tenant (pure).

The backend holds tokens the way the proxy does (:mod:`triton_sam.scaleout.access`: a tokens
file of ``<token> <tenant>;`` lines, each token 32-128 lowercase hex digits). Label Studio's
ML backend settings can send HTTP Basic auth (user and password): the password is the token
(the user name is not checked, Label Studio requires one: any text). A ``Bearer <token>``
header is accepted as at the proxy. The token's tenant goes to Triton in the tenant header, as
the proxy sends it, so each tenant's cached images stay its own.

Without tokens the backend is open: it listens on localhost only and every request is in the
default tenant (the CLI says so when it starts).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping

from triton_sam.scaleout.access import DEFAULT_TENANT


class Unauthenticated(Exception):
    """No valid credential; the message says what was expected (never echoes a credential)."""


class TokenTenants:
    """Tokens -> tenants; :meth:`tenant_of` checks a request's ``Authorization`` header.

    Args:
        tokens: token -> tenant (validated by the caller, e.g. ``read_tokens_file``); empty =
            authentication off, every request in the default tenant.
    """

    def __init__(self, tokens: Mapping[str, str] | None = None) -> None:
        self._tokens = dict(tokens or {})

    @property
    def enabled(self) -> bool:
        """True when requests must carry a token."""
        return bool(self._tokens)

    def tenant_of(self, authorization: str | None) -> str:
        """The tenant of a request's ``Authorization`` header.

        Raises:
            Unauthenticated: tokens are on and the header holds no known token.
        """
        if not self._tokens:
            return DEFAULT_TENANT
        token = _token_of(authorization or "")
        # compare against every token in constant time: the match must not leak by timing
        found = None
        for known, tenant in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = tenant
        if found is None:
            raise Unauthenticated(
                "Authorization: expected HTTP Basic auth whose password is a backend token "
                "(Label Studio: the model's Basic Auth settings) or 'Bearer <token>'"
            )
        return found


def _token_of(header: str) -> str:
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        return rest.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(rest.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return ""
        return decoded.partition(":")[2]
    return ""
