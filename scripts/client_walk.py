"""Follow ``image`` from ``SAM2TritonClient.set_image`` through the client's files, and count.

No server: tritonclient's HTTP ``InferenceServerClient`` (the lowest layer the client calls)
is replaced by a stand-in that answers as a Triton with the ``sam2`` encoder, decoder and
session model would: everything is ready, a probe misses (the server does not hold the
image yet), an embed answers the image id the client asked about. Every layer of
``triton_sam/client/`` runs as it does against a real server, down to tritonclient's own
request objects (``InferInput``, the HTTP body it would send).

``sys.setprofile`` records each *call* (a function entered, or a generator resumed) whose
code lives in ``triton_sam/client/`` during one ``set_image(image)`` (after one untraced
``set_image`` on the same client, so that first-use imports are not counted). A call's
*caller file* is the file of the nearest frame below it that is in ``triton_sam/client/``.

Definitions (what is printed):

- **stop**: a call from one client file into another (``caller -> file:function``), each
  (caller file, callee file) pair listed once, at its first occurrence; the first stop is
  ``sync.py:set_image`` itself. A flow sending two requests (a probe, then an embed) goes
  down the same stairs twice: that is the same stops, not new ones.
- **files**: the distinct client files the walk enters.
- **hops**: the number of distinct (caller file, callee file) pairs, i.e. stops after the
  first.
- **returns** (to a file already left): stops into a file that the walk entered *before* the
  caller file (files ranked by first entry): a callback into an upper layer (a hook calling
  the client back, a retry helper calling the transport back) or a back-and-forth between
  two layers. A callee handing back its result is a return of a value, not a call, and never
  counts; nor does a file calling again into a file it called before (a flow asking the
  request builders for its second request).
- **opens** (mode ``path``): how many times the image file is opened.
- **layers**: the files' layers (:data:`LAYERS`) in the order the walk first enters them; a
  walk that reads one way passes each layer once, top down.

Usage::

    PYTHONPATH=$PWD .venv/bin/python scripts/client_walk.py [--mode array|path|both]
"""

from __future__ import annotations

import argparse
import builtins
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

import triton_sam.client

CLIENT_DIR = os.path.realpath(os.path.dirname(triton_sam.client.__file__)) + os.sep
MODELS = ("sam2_encoder", "sam2_decoder", "sam2_session")
# docs/architecture.md's client layers, top down, and the files of each the walk may enter.
LAYERS = {
    "api": ("sync.py", "speculative.py", "connection.py"),
    "core": ("image_session.py",),
    "flows": ("flow.py", "startup.py"),
    "requests": ("image_io.py", "embedding_path.py", "decode_request.py", "prompts.py"),
    "wire": ("transport.py", "wire.py", "routing.py", "retry.py", "wire_errors.py"),
}


@dataclass
class Walk:
    """What one ``set_image`` passed through (see the module docstring)."""

    stops: list[tuple[str | None, str, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    returns: list[tuple[str | None, str, str]] = field(default_factory=list)
    opens: int = 0

    @property
    def hops(self) -> int:
        return len(self.stops) - 1

    @property
    def layers(self) -> list[str]:
        """The layer of each file entered, in order, repeats folded (``?``: no layer)."""
        named = [next((k for k, v in LAYERS.items() if f in v), "?") for f in self.files]
        return [layer for i, layer in enumerate(named) if i == 0 or named[i - 1] != layer]


# -- the stand-in server ---------------------------------------------------------------------
class _Result:
    def __init__(self, outputs: dict[str, np.ndarray]) -> None:
        self._outputs = outputs

    def as_numpy(self, name: str) -> np.ndarray | None:
        return self._outputs.get(name)


def _stand_in_client() -> type:
    """tritonclient.http.InferenceServerClient, answering without a network."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    from triton_sam.serving import protocol

    class StandIn(http.InferenceServerClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:  # no connection pool
            pass

        def is_server_ready(self, *args: Any, **kwargs: Any) -> bool:
            return True

        def is_model_ready(self, model: str, *args: Any, **kwargs: Any) -> bool:
            return model in MODELS

        def get_model_metadata(self, model: str, *args: Any, **kwargs: Any) -> dict:
            return {"name": model, "platform": "onnxruntime_onnx", "inputs": [], "outputs": []}

        def infer(self, model: str, inputs: list, *args: Any, **kwargs: Any) -> _Result:
            names = {i.name() for i in inputs}
            if "image_bytes" in names or "image_rgb" in names:  # an embed
                image_id = np.array([[b"0" * 32]], dtype=np.object_)
                return _Result({"encoded": np.array([1], np.int32), "image_id": image_id})
            message = protocol.error_message(protocol.ERR_EMBEDDING_NOT_FOUND, "not held")
            raise InferenceServerException(msg=message, status="404")  # a probe: a miss

        def close(self) -> None:
            pass

    return StandIn


# -- the walk --------------------------------------------------------------------------------
def _client_file(frame: Any) -> str | None:
    """The client file of ``frame`` or the nearest frame below it in triton_sam/client/."""
    while frame is not None:
        path = os.path.realpath(frame.f_code.co_filename)
        if path.startswith(CLIENT_DIR):
            return path[len(CLIENT_DIR) :]
        frame = frame.f_back
    return None


@contextmanager
def _counting_opens(path: str, walk: Walk) -> Iterator[None]:
    real_open = builtins.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | os.PathLike) and os.path.realpath(file) == path:
            walk.opens += 1
        return real_open(file, *args, **kwargs)

    with mock.patch("builtins.open", counting_open):
        yield


def _record(walk: Walk) -> Any:
    seen: set[tuple[str | None, str]] = set()
    rank: dict[str, int] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        if not _in_client(frame):
            return
        callee = _client_file(frame)
        assert callee is not None
        caller = _client_file(frame.f_back)
        if caller == callee or (caller, callee) in seen:
            return
        seen.add((caller, callee))
        stop = (caller, callee, frame.f_code.co_name)
        walk.stops.append(stop)
        if caller is not None and callee in rank and rank[callee] < rank[caller]:
            walk.returns.append(stop)
        if callee not in rank:
            rank[callee] = len(rank)
            walk.files.append(callee)

    return profile


def _in_client(frame: Any) -> bool:
    return os.path.realpath(frame.f_code.co_filename).startswith(CLIENT_DIR)


def walk(mode: str = "array") -> Walk:
    """One traced ``set_image`` of a 32x48 image given as an array (``mode="array"``) or a
    PNG file's path (``"path"``)."""
    from PIL import Image

    from triton_sam.client.sync import SAM2TritonClient

    rgb = np.random.default_rng(0).integers(0, 255, (32, 48, 3), dtype=np.uint8)
    result = Walk()
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch("tritonclient.http.InferenceServerClient", _stand_in_client()),
    ):
        path = os.path.realpath(os.path.join(tmp, "image.png"))
        Image.fromarray(rgb).save(path)
        image: Any = rgb if mode == "array" else Path(path)
        with SAM2TritonClient("localhost:8000", "sam2", "http") as client:
            client.set_image(image)  # untraced: first-use imports
            with _counting_opens(path, result):
                sys.setprofile(_record(result))
                try:
                    client.set_image(image)
                finally:
                    sys.setprofile(None)
            assert client.is_image_set and client.uses_server_embeddings
    return result


def report(mode: str, result: Walk) -> str:
    """The walk as text: stops, then the counts."""
    lines = [f"set_image({mode}): stops"]
    for i, (caller, callee, function) in enumerate(result.stops, 1):
        back = (
            "   <- return to a file already left"
            if (caller, callee, function) in (result.returns)
            else ""
        )
        source = f"{caller} -> " if caller else ""
        lines.append(f"  {i:2d}. {source}{callee}:{function}{back}")
    counts = (
        f"  stops {len(result.stops)}, files {len(result.files)}, hops {result.hops}, "
        f"returns {len(result.returns)}"
    )
    if mode == "path":
        counts += f", file opened {result.opens}x"
    lines.append(counts)
    lines.append(f"  layers {' -> '.join(result.layers)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("array", "path", "both"), default="both")
    args = parser.parse_args(argv)
    modes = ("array", "path") if args.mode == "both" else (args.mode,)
    print("\n\n".join(report(mode, walk(mode)) for mode in modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
