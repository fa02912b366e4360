"""Raw requests to the ``sam3_concept`` model with tritonclient, as a third-party client sends
them (no triton_sam client checks), for the concept serving and exemplar tests."""

from __future__ import annotations

import numpy as np

from triton_sam.client.transport import translate_error
from triton_sam.serving.protocol import concept as protocol
from triton_sam.serving.protocol.tenancy import TENANT_HEADER

KINDS = {"uint8": "UINT8", "float32": "FP32", "int32": "INT32", "object": "BYTES"}


def raw_infer(
    server,
    protocol_name: str,
    inputs: dict[str, np.ndarray],
    outputs=("num_instances",),
    tenant: str | None = None,
) -> dict[str, np.ndarray]:
    """One request over ``protocol_name`` ("http" or "grpc"), as ``tenant`` (the header the
    proxy sets) when given; the outputs, or our translated error when it is refused."""
    if protocol_name == "http":
        import tritonclient.http as module

        client = module.InferenceServerClient(server.http_address)
    else:
        import tritonclient.grpc as module

        client = module.InferenceServerClient(server.grpc_address)
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), KINDS[array.dtype.name])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    requested = [module.InferRequestedOutput(n) for n in outputs]
    try:
        result = client.infer(
            protocol.MODEL,
            tensors,
            outputs=requested,
            headers={TENANT_HEADER: tenant} if tenant else None,
        )
    except Exception as e:
        raise translate_error(e, what=f"infer on {protocol.MODEL}") from e
    finally:
        client.close()
    return {n: result.as_numpy(n) for n in outputs}
