"""Calls from one python model to another over BLS, and to the session model in particular.

The everything job model and the Lambda model answer through the family's session model
(``<family>_session``, ``embedding_cache_model.py``): each call carries the request's tenant
(so the image cache stays per tenant) and relays the session model's refusals with their
protocol code. Written once here; ``pb_utils`` (Triton's ``triton_python_backend_utils``) is
passed in, never imported.
"""

from __future__ import annotations

import numpy as np

from . import protocol as envelope
from .protocol import tenancy


class SessionError(envelope.ProtocolError):
    """An error the session model answered: its protocol code and its text (header removed)."""


def preferred_memory(pb_utils, *, gpu: bool = False, device: int = 0) -> dict:
    """``InferenceRequest`` keyword arguments asking for outputs in host memory (or on GPU
    ``device``); none on stubs without ``PreferredMemory`` (before Triton 23.xx)."""
    if not hasattr(pb_utils, "PreferredMemory"):
        return {}
    kind = pb_utils.TRITONSERVER_MEMORY_GPU if gpu else pb_utils.TRITONSERVER_MEMORY_CPU
    return {"preferred_memory": pb_utils.PreferredMemory(kind, device if gpu else 0)}


def checked(response, model: str):
    """``response`` unless it is an error, which raises RuntimeError naming ``model``."""
    if response.has_error():
        raise RuntimeError(f"{model}: {response.error().message()}")
    return response


class BlsRunner:
    """Runs a graph as another model of this server (synchronous BLS, outputs in host memory),
    for the models that orchestrate graphs: the trackers and concept video.

    Args:
        pb_utils: ``triton_python_backend_utils``.
        models: graph key -> the Triton model serving it.
    """

    def __init__(self, pb_utils, models: dict[str, str]) -> None:
        self.pb_utils, self.models = pb_utils, models

    def run(self, graph: str, inputs: dict, outputs) -> dict:
        """``outputs`` (names) of ``graph`` on ``inputs`` (name -> numpy), as numpy copies."""
        pb = self.pb_utils
        request = pb.InferenceRequest(
            model_name=self.models[graph],
            inputs=[pb.Tensor(n, np.ascontiguousarray(v)) for n, v in inputs.items()],
            requested_output_names=list(outputs),
            **preferred_memory(pb),
        )
        response = checked(request.exec(), self.models[graph])
        result = {}
        for name in outputs:
            tensor = pb.get_output_tensor_by_name(response, name)
            if tensor is None:
                raise RuntimeError(f"{self.models[graph]} returned no {name!r}")
            result[name] = np.array(tensor.as_numpy())  # out of the shared-memory pool
        return result


class SessionCall:
    """BLS calls to the session model ``model`` as a tenant.

    Args:
        pb_utils: ``triton_python_backend_utils``.
        model: the session model's name (config parameter ``session_model``).
    """

    def __init__(self, pb_utils, model: str) -> None:
        self.pb_utils, self.model = pb_utils, model

    def request(self, tenant: str, inputs: list, wanted: list[str], parameters=None):
        """The BLS request: ``inputs`` (``pb_utils.Tensor``), the outputs ``wanted``, the
        tenant and any further request ``parameters`` (str -> str)."""
        parameters = dict(parameters or {})
        if tenant != tenancy.DEFAULT_TENANT:
            parameters[tenancy.TENANT_HEADER] = tenant
        kwargs = {"parameters": parameters} if parameters else {}
        return self.pb_utils.InferenceRequest(
            model_name=self.model,
            inputs=inputs,
            requested_output_names=list(wanted),
            **kwargs,  # outputs where the session keeps them (on a GPU: device memory)
        )

    def call(self, tenant: str, inputs: list, wanted: list[str], *, parameters=None) -> dict:
        """One call, blocking: output name -> ``pb_utils.Tensor``.

        Raises:
            SessionError: the session model refused, with its code and text.
            RuntimeError: any other error (not a triton_sam protocol error).
        """
        response = self.request(tenant, inputs, wanted, parameters).exec()
        return self.outputs(response, wanted)

    async def acall(self, tenant: str, inputs: list, wanted: list[str], *, parameters=None):
        """One call on the running event loop: as :meth:`call`."""
        response = await self.request(tenant, inputs, wanted, parameters).async_exec()
        return self.outputs(response, wanted)

    def outputs(self, response, wanted: list[str]) -> dict:
        """The ``wanted`` outputs of ``response`` by name, or its error raised."""
        if response.has_error():
            message = response.error().message()
            code = envelope.error_code(message)
            if code is None:
                raise RuntimeError(f"{self.model}: {message}")
            header = envelope.error_message(code, "")
            raise SessionError(code, message[message.find(header) + len(header) :])
        return {n: self.pb_utils.get_output_tensor_by_name(response, n) for n in wanted}
