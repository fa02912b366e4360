"""Paintera's traffic, replayed: sam-link 1.0.0's gRPC client in Python, and what it costs.

:class:`SamLinkReplay` sends what saalfeldlab/sam-link (tag ``sam-link-1.0.0``, commit
56c8d5e067a133f2257715cff924cb0d9ac5aa0b) sends, from its sources:
``src/main/kotlin/org/janelia/saalfeldlab/samlink/TritonClient.kt`` (4 lanes, each a channel
with one long-lived ``ModelStreamInfer`` stream, round-robin, gzip, 32 MiB inbound, no
deadline, ``priority`` as ``int64_param`` 5, a random UUID ``id``, one input in
``raw_input_contents``, no requested outputs, ``ModelReady(name, "")`` on a fifth channel) and
``encode/EncodeHelper.kt`` (:func:`samlink_pixels`). It is built from raw protobufs:
tritonclient's helpers send ``priority`` as ``uint64_param``, which is not what Paintera sends.

Two measurements (``python -m triton_sam.bench.paintera --help``):

- :func:`entry_overhead`: per-request time of an entry ensemble vs the encoder it runs,
  interleaved in one run, plus the normalising graph's own compute time from Triton's stats;
- :func:`stale_burst`: how many encoder runs a navigation burst costs (Paintera drops stale
  answers locally and never cancels), read from ``/v2/models/<m>/stats``.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

MIB = 2**20
LANES = 4  # TritonClient.streamCount
PRIORITY = 5  # EncodeOptions.kt: TritonEncodeOptions(priority = 5)
# Triton counts an inference in its stats after it sent the answer: wait this long before
# reading them, or the last request of a burst may not be counted yet (seen: 7 of 8).
_STATS_SETTLE_S = 1.0


def samlink_pixels(rgb: np.ndarray, lo: float, hi: float) -> bytes:
    """``EncodeHelper.intRGBtoCHW``: float32 ``u8 * ((hi - lo) / 255f) + lo``, CHW,
    little-endian, for an HxWx3 uint8 ``rgb`` already at the encoder's size."""
    scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255.0))
    chw = np.ascontiguousarray(rgb.transpose(2, 0, 1)).astype(np.float32)
    return (chw * scale + np.float32(lo)).astype("<f4").tobytes()


class SamLinkReplay:
    """sam-link's ``TritonClient`` against ``address`` (``host:port``, plaintext)."""

    def __init__(self, address: str) -> None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self._grpc, self._pb_grpc = grpc, service_pb2_grpc
        options = [("grpc.max_receive_message_length", 32 * MIB)]

        def channel() -> Any:
            return grpc.insecure_channel(
                address, options=options, compression=grpc.Compression.Gzip
            )

        self.control = channel()  # TritonClient.controlChannel: ModelReady only
        self.lanes: list[tuple[Any, queue.Queue, Any, threading.Thread]] = []
        self.answers: dict[str, queue.Queue] = {}
        self.stream_errors: list[str] = []  # how streams ended early, as gRPC said
        self._lock = threading.Lock()
        self._next = 0
        for _ in range(LANES):
            ch = channel()
            requests: queue.Queue = queue.Queue()
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            stream = stub.ModelStreamInfer(
                iter(requests.get, None), compression=grpc.Compression.Gzip
            )
            reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
            reader.start()
            self.lanes.append((ch, requests, stream, reader))

    def _read(self, stream: Any) -> None:
        try:
            for response in stream:
                box = self.answers.get(response.infer_response.id)
                if box is not None:  # sam-link drops answers nobody waits for
                    box.put(response)
        except self._grpc.RpcError as e:  # cancelled, closed, or reset by a proxy
            self.stream_errors.append(f"{e.code().name}: {e.details()}")

    def is_model_ready(self, name: str) -> bool:
        """``TritonClient.isModelReady``: ``ModelReady(name, version="")``."""
        from tritonclient.grpc import service_pb2

        stub = self._pb_grpc.GRPCInferenceServiceStub(self.control)
        request = service_pb2.ModelReadyRequest(name=name, version="")
        return stub.ModelReady(request, compression=self._grpc.Compression.Gzip).ready

    def send(self, model: str, name: str, shape: list[int], raw: bytes) -> tuple[str, int]:
        """Queue one request as ``TritonClient.infer`` does; returns (its id, its lane)."""
        from tritonclient.grpc import service_pb2

        request = service_pb2.ModelInferRequest(model_name=model, id=str(uuid.uuid4()))
        request.parameters["priority"].int64_param = PRIORITY
        tensor = request.inputs.add(name=name, datatype="FP32")
        tensor.shape.extend(shape)
        request.raw_input_contents.append(raw)
        with self._lock:
            lane = self._next % LANES
            self._next += 1
            self.answers[request.id] = queue.Queue()
        self.lanes[lane][1].put(request)
        return request.id, lane

    def wait(self, request_id: str, timeout_s: float = 600) -> Any:
        """The ``ModelStreamInferResponse`` answering ``request_id``."""
        response = self.answers[request_id].get(timeout=timeout_s)
        del self.answers[request_id]
        return response

    def infer(self, model: str, name: str, shape: list[int], raw: bytes) -> Any:
        return self.wait(self.send(model, name, shape, raw)[0])

    def close(self) -> None:
        for ch, requests, _, _ in self.lanes:
            requests.put(None)
            ch.close()
        self.control.close()


def _stats(http_url: str, model: str) -> dict[str, Any]:
    from triton_sam.bench.counters import _get_json

    (stats,) = _get_json(f"{http_url}/v2/models/{model}/stats")["model_stats"]
    return stats


def _counts(http_url: str, model: str) -> tuple[int, int, float]:
    """(inference_count, execution_count, compute_infer ms in total) of ``model``."""
    s = _stats(http_url, model)
    infer_ns = int(s["inference_stats"]["compute_infer"]["ns"])
    return int(s["inference_count"]), int(s["execution_count"]), infer_ns / 1e6


@dataclass(frozen=True)
class EntryPair:
    """One of Paintera's entry models as the bundle writes it, and our encoder it runs.

    Attributes:
        family: the model family (``sam1``, ``sam2``, ``sam3``).
        entry: the entry model sam-link calls, with pixels in ``pixel_range``.
        encoder: our encoder, which takes the pixels normalised as our clients send them.
        input_name: the input tensor of both; edge: the side of their square image.
        normalizes: the entry runs a normalising graph (``<entry>_pixels``) first.
    """

    family: str
    entry: str
    encoder: str
    input_name: str
    edge: int
    pixel_range: tuple[float, float]
    normalizes: bool

    @property
    def normalizer(self) -> str | None:
        """The normalising graph's model name, or None."""
        return self.entry + "_pixels" if self.normalizes else None

    @property
    def shape(self) -> list[int]:
        """The input's shape: one RGB image."""
        return [1, 3, self.edge, self.edge]


def entry_overhead(
    grpc_address: str, http_url: str, pair: EntryPair, *, rounds: int = 5
) -> dict[str, float]:
    """p50 wall time per request of ``pair.entry`` (sam-link's pixels) and of
    ``pair.encoder`` (the same image normalised as our clients send it, so the encoder
    computes on the same values: random-init networks run slower on some inputs, denormals),
    interleaved so both see the same machine, sequential on sam-link's streams; and the
    normalising graph's mean compute time from Triton's stats."""
    from triton_sam.models.registry import get_family
    from triton_sam.tools.sample import sample_image

    entry, encoder, normalizer = pair.entry, pair.encoder, pair.normalizer
    client = SamLinkReplay(grpc_address)
    rgb = sample_image(pair.edge, pair.edge)
    pre = get_family(pair.family).preprocessing
    chw = rgb.transpose(2, 0, 1).astype(np.float32) * np.float32(pre.pixel_scale)
    mean = np.reshape(pre.pixel_mean, (3, 1, 1)).astype(np.float32)
    std = np.reshape(pre.pixel_std, (3, 1, 1)).astype(np.float32)
    raws = {
        entry: samlink_pixels(rgb, *pair.pixel_range),
        encoder: ((chw - mean) / std).astype("<f4").tobytes(),
    }
    times: dict[str, list[float]] = {entry: [], encoder: []}
    try:
        for model in (entry, encoder):  # warm both
            client.infer(model, pair.input_name, pair.shape, raws[model])
        before = _counts(http_url, normalizer) if normalizer else None
        for _ in range(rounds):
            for model in (entry, encoder):
                t0 = time.perf_counter()
                response = client.infer(model, pair.input_name, pair.shape, raws[model])
                times[model].append((time.perf_counter() - t0) * 1e3)
                assert not response.error_message, response.error_message
    finally:
        client.close()
    out = {f"{m}_p50_ms": statistics.median(v) for m, v in times.items()}
    out["overhead_ms"] = out[f"{entry}_p50_ms"] - out[f"{encoder}_p50_ms"]
    if normalizer and before:
        after = _counts(http_url, normalizer)
        out["normalizer_compute_ms"] = (after[2] - before[2]) / max(1, after[0] - before[0])
    return out


def stale_burst(
    grpc_address: str,
    http_url: str,
    pair: EntryPair,
    *,
    requests: int = 8,
    spacing_s: float = 0.1,
) -> dict[str, Any]:
    """Send ``requests`` different views ``spacing_s`` apart on sam-link's 4 streams, as a
    user panning through a volume makes Paintera do, wait for every answer, and count what
    the encoder ran. Paintera only uses the last answer; every other run is stale work."""
    from triton_sam.tools.sample import sample_image

    client = SamLinkReplay(grpc_address)
    edge = pair.edge
    views = [
        samlink_pixels(sample_image(edge, edge, seed=i), *pair.pixel_range) for i in range(requests)
    ]
    try:
        client.infer(pair.entry, pair.input_name, pair.shape, views[0])  # warm
        time.sleep(_STATS_SETTLE_S)
        before = _counts(http_url, pair.encoder)
        t0 = time.perf_counter()
        ids = []
        for raw in views:
            ids.append(client.send(pair.entry, pair.input_name, pair.shape, raw)[0])
            time.sleep(spacing_s)
        answers = [client.wait(i) for i in ids]
        seconds = time.perf_counter() - t0
        time.sleep(_STATS_SETTLE_S)
        after = _counts(http_url, pair.encoder)
    finally:
        client.close()
    return {
        "requests": requests,
        "encoder_inferences": after[0] - before[0],
        "encoder_executions": after[1] - before[1],
        "errors": sum(bool(a.error_message) for a in answers),
        "error_messages": sorted({a.error_message for a in answers if a.error_message}),
        "failed_positions": [i for i, a in enumerate(answers) if a.error_message],
        "burst_s": seconds,
        "last_answer_after_s": seconds - spacing_s * (requests - 1),
    }


# Paintera's entry models as the bundle writes them, by family.
BUNDLE = {
    "sam1": EntryPair("sam1", "sam1_encoder", "sam1_encoder_normalized", "image", 1024,
                      (0.0, 1.0), normalizes=True),
    "sam2": EntryPair("sam2", "sam2.1_large_encoder", "sam2_encoder", "image", 1024,
                      (0.0, 1.0), normalizes=True),
    "sam3": EntryPair("sam3", "sam3_tracker_encoder_fp16", "sam3_encoder", "pixel_values",
                      1008, (-1.0, 1.0), normalizes=False),
}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """``python -m triton_sam.bench.paintera GRPC_ADDRESS --http-url URL [--family sam2]``:
    both measurements on a running server of ``triton-sam setup paintera``; prints JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("grpc_address", help="host:port of Triton's gRPC endpoint")
    parser.add_argument("--http-url", default="http://localhost:8000")
    parser.add_argument("--family", choices=sorted(BUNDLE), default="sam2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--spacing-s", type=float, default=0.1)
    args = parser.parse_args(argv)
    pair = BUNDLE[args.family]
    overhead = entry_overhead(args.grpc_address, args.http_url, pair, rounds=args.rounds)
    burst = stale_burst(
        args.grpc_address, args.http_url, pair, requests=args.burst, spacing_s=args.spacing_s
    )
    print(json.dumps({"overhead": overhead, "burst": burst}, indent=2))


if __name__ == "__main__":
    main()
