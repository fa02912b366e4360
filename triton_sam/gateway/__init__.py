"""A gateway speaking other services' HTTP APIs on top of Triton (Janelia's SAM_service).

``triton-sam gateway`` runs :func:`serve`; :func:`create_app` is the ASGI app (starlette) for
any ASGI server. Needs the ``gateway`` extra (starlette, uvicorn, python-multipart).
"""

from __future__ import annotations

from triton_sam.gateway.app import GatewayOptions, create_app
from triton_sam.gateway.backend import BackendOptions
from triton_sam.gateway.serve import serve

__all__ = ["BackendOptions", "GatewayOptions", "create_app", "serve"]
