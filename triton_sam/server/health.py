"""Liveness of the python-backend models, and their recovery (runs outside Triton).

What Triton 2.51 does when a python-backend stub dies (killed by the OOM killer, a crash, a
``kill -9``; measured in tests/integration/test_self_healing.py): nothing. The model and the
server stay READY (``/v2/health/ready`` and ``/v2/models/<m>/ready`` answer 200), no new stub
is started, and every request to the model answers ``Stub process '<m>_0_0' is not healthy``
for as long as the server runs (watched for 105 s). Readiness therefore cannot tell, and an
orchestrator that only polls it never restarts anything. Nor does Triton ever finish unloading
a model instance whose dead stub was sent a request (the probe that found it dead is one), not
even once a reload started a new instance beside it: a server that lost a stub waits out its
whole exit timeout when it stops (10 s by default, measured on 2.51), then exits.

So liveness is asked of the model itself: a probe request for an image id nobody embeds
(:data:`LIVENESS_ID`) costs a dictionary lookup in a healthy stub, which answers our
NOT_FOUND miss; a dead stub answers the "not healthy" error. The segment-everything job model
(``<family>_everything``) is decoupled, which Triton's HTTP endpoint refuses, so it is probed
over a gRPC stream (:func:`probe_stream`): a job without an image, which a live stub refuses
at once naming the field. Recovery, by what the deployment allows:

- model control ``poll`` (``triton-sam serve`` with self-heal): :func:`touch` marks the dead
  model's folders as modified, and Triton's next scan of the repository loads it again with a
  new stub (2 s measured for SAM2.1-tiny's session model with a 1 s scan). Poll mode refuses
  every load/unload request, so no client can load a model of its own, key or not. Touching
  the config alone does not do it: Triton then only updates the config and keeps the dead
  instance (measured on 2.51);
- model control ``explicit`` (a container whose health check runs on localhost with the admin
  key): :func:`heal` unloads and loads the dead model, which starts a new stub (0.5 s
  measured). Either way its cache is empty, and clients re-embed on their next click, as
  after a restart;
- otherwise ``scripts/health_check.sh`` fails, so compose's healthcheck marks the container
  unhealthy and a Kubernetes liveness probe restarts the pod.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.serving import protocol as envelope
from triton_sam.serving.protocol import everything as everything_protocol

LIVENESS_ID = "triton-sam-liveness"
# Triton's own message for a request to a model whose stub process died (not ours to code).
DEAD_MARKER = "is not healthy"
# How long a stream probe waits: a live everything stub refuses it at once, before admission,
# even while its job slots are taken; no answer in time ("busy") means its stub is stuck.
STREAM_PROBE_TIMEOUT_S = 5.0
STREAM_KINDS = (envelope.KIND_EVERYTHING,)
# The large model's probe: the status of a handle no one was issued (its miss, HandleNotFound).
LARGE_PROBE = b'{"op":"status","handle":"' + b"0" * 32 + b'"}'


def probe(client: object, model: str, kind: str | None = None) -> str:
    """``"alive"`` or ``"dead"`` for one python model we ship, by a probe request.

    Args:
        client: a ``tritonclient.http.InferenceServerClient``.
        model: a ``<family>_session`` model (or any model answering an ``image_id`` probe),
            or, with ``kind`` the Lambda JSON kind, a ``sam2`` model: it gets an empty
            ``image_b64``, which its stub refuses as our typed ``InvalidInput`` before it
            calls anything; with the large-image kind, a ``<family>_large`` model: the
            status of a handle nobody holds, its ``HandleNotFound`` miss.
        kind: the model's kind (``protocol.KIND_*``); None: a session model.

    Raises:
        tritonclient.utils.InferenceServerException: any other error (server down, unknown
            model): not a stub death this module can repair.
    """
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    shape = [1, 1]
    if kind == envelope.KIND_LAMBDA_JSON:
        values = {"image_b64": b"", "prompt_json": b"{}"}
    elif kind == envelope.KIND_LARGE_IMAGE:  # no batch dim; a handle nobody holds: a miss
        shape, values = [1], {"request": LARGE_PROBE}
    else:
        values = {"image_id": LIVENESS_ID.encode()}
    tensors = []
    for name, value in values.items():
        tensor = httpclient.InferInput(name, shape, "BYTES")
        tensor.set_data_from_numpy(np.array([value], dtype=np.object_).reshape(shape))
        tensors.append(tensor)
    try:
        client.infer(model, tensors)
    except InferenceServerException as e:
        return _status(e)
    return "alive"


def probe_stream(client: object, model: str, *, timeout_s: float = STREAM_PROBE_TIMEOUT_S) -> str:
    """``"alive"``, ``"dead"`` or ``"busy"`` for a decoupled model we ship (the everything job
    model, ``<family>_everything``), by a probe job over a gRPC stream.

    The job carries ``params`` ``{}`` and no image: a live stub refuses it before any work and
    before admission, naming the image field (our ``InvalidInput``), so the probe never takes
    a job's slot or its place in the line; a dead one answers the "not healthy" error.
    ``"busy"``: no answer within ``timeout_s`` (the stub's execute loop is held up; a dead stub
    answers at once); the stream is cancelled and the model is not reloaded.

    Args:
        client: a ``tritonclient.grpc.InferenceServerClient`` with no stream open.
        model: the everything model.
        timeout_s: how long to wait for the answer.

    Raises:
        tritonclient.utils.InferenceServerException: any other error (server down, unknown
            model): not a stub death this module can repair.
    """
    import tritonclient.grpc as grpcclient

    answers: queue.Queue[object] = queue.Queue()
    params = grpcclient.InferInput(everything_protocol.PARAMS, [1], "BYTES")
    params.set_data_from_numpy(np.array([b"{}"], dtype=np.object_))
    client.start_stream(callback=lambda result, error: answers.put(error))
    try:
        client.async_stream_infer(model, [params])
        try:
            error = answers.get(timeout=timeout_s)
        except queue.Empty:
            return "busy"
    finally:
        client.stop_stream(cancel_requests=True)
    return "alive" if error is None else _status(error)


def _status(error: Exception) -> str:
    """``"alive"`` or ``"dead"`` from a probe's error; any other error is raised again."""
    message = str(error)
    if envelope.error_code(message) is not None:
        return "alive"  # the stub answered in our protocol (the miss, or a refusal)
    if DEAD_MARKER in message:
        return "dead"
    raise error


def session_models(repo_dir: str | os.PathLike[str]) -> list[str]:
    """The ``<family>_session`` models of a repository (by the kind their configs declare)."""
    return [
        m for m, kind in watched_models(repo_dir).items() if kind == envelope.KIND_EMBEDDING_CACHE
    ]


def watched_models(repo_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The python models a watchdog probes, name -> kind: the session models, the Lambda
    JSON models, the large-image models and the everything job models (a dead stub of any
    answers every request with an error until reloaded)."""
    from triton_sam.repository.config import model_kind, parse_config
    from triton_sam.repository.writer import CONFIG_FILENAME, list_models

    kinds = (
        envelope.KIND_EMBEDDING_CACHE,
        envelope.KIND_LAMBDA_JSON,
        envelope.KIND_LARGE_IMAGE,
        *STREAM_KINDS,
    )
    found = {}
    for name in list_models(repo_dir):
        kind = model_kind(parse_config(Path(repo_dir) / name / CONFIG_FILENAME))
        if kind in kinds:
            found[name] = kind
    return found


def heal(client: object, model: str, *, admin_key: str) -> float:
    """Reload ``model`` (needs model control ``explicit``); returns the seconds it took.

    A ``load`` of a model whose files did not change is a no-op in Triton, so it is unloaded
    first: the load then starts a fresh stub. The repository API is restricted: ``admin_key``
    unlocks it.
    """
    from triton_sam.server.admin_key import HTTP_HEADER

    headers = {HTTP_HEADER: admin_key}
    start = time.perf_counter()
    client.unload_model(model, headers=headers)
    client.load_model(model, headers=headers)
    return time.perf_counter() - start


def touch(repository: str | os.PathLike[str], model: str) -> None:
    """Mark ``model``'s folder and its version folders as modified, so that Triton in poll
    mode loads it again (a new stub) at its next scan of ``repository``.

    Only folders: touching ``model.py`` would make its compiled ``__pycache__`` stale, and
    the stub's rewrite of it would modify the folder once more (a second reload).
    """
    folder = Path(repository) / model
    for path in (folder, *sorted(p for p in folder.iterdir() if p.name.isdigit())):
        os.utime(path)


def heal_by_touch(
    client: object,
    repository: str | os.PathLike[str],
    model: str,
    *,
    kind: str | None = None,
    timeout_s: float = 300.0,
) -> float:
    """:func:`touch` ``model``, then wait until it answers a probe; returns the seconds it took.

    Waiting keeps a watchdog from touching it again while the reload runs (which would
    queue another one).

    Raises:
        TimeoutError: still dead after ``timeout_s``.
    """
    return _touch_and_wait(repository, model, lambda: probe(client, model, kind), timeout_s)


def _touch_and_wait(
    repository: str | os.PathLike[str],
    model: str,
    check: Callable[[], str],
    timeout_s: float = 300.0,
) -> float:
    start = time.perf_counter()
    touch(repository, model)
    while time.perf_counter() - start < timeout_s:
        time.sleep(0.25)
        if check() == "alive":
            return time.perf_counter() - start
    raise TimeoutError(f"{model}: still dead {timeout_s:.0f} s after touching its files")


class Watchdog:
    """Probes our python models every ``interval_s`` and reloads the dead ones (a thread).

    Args:
        address: ``host:port`` of the server's HTTP endpoint.
        models: the models to watch: session model names, or name -> kind
            (:func:`watched_models`).
        repository: the served repository, for a server in poll mode: a dead model is
            reloaded by :func:`heal_by_touch`.
        admin_key: for a server in explicit mode: a dead model is reloaded by :func:`heal`.
        interval_s: seconds between probes.
        grpc_address: ``host:port`` of the server's gRPC endpoint, where the everything job
            models are probed (:func:`probe_stream`); without it they are not watched (a
            warning says so).

    Attributes:
        models: the models watched.
        reloads: (model, seconds the reload took) of every recovery, in order.
    """

    def __repr__(self) -> str:  # the admin key stays out of logs and tracebacks
        return f"Watchdog({self.address!r}, {list(self.models)})"

    def __init__(
        self,
        address: str,
        models: Sequence[str] | Mapping[str, str],
        *,
        repository: str | os.PathLike[str] | None = None,
        admin_key: str | None = None,
        interval_s: float = 5.0,
        grpc_address: str | None = None,
    ) -> None:
        if (repository is None) == (admin_key is None):
            raise InputValidationError(
                "repository", "give repository (poll mode) or admin_key (explicit), one of them"
            )
        self.address = address
        self.grpc_address = grpc_address
        kinds = dict(models) if isinstance(models, Mapping) else dict.fromkeys(models)
        self.kinds: dict[str, str | None] = _streams_last(kinds, grpc_address)
        self.models = tuple(self.kinds)
        self.repository = Path(repository) if repository is not None else None
        self.admin_key = admin_key
        self.interval_s = float(interval_s)
        self.reloads: list[tuple[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check_once(self) -> dict[str, str]:
        """Probe every model once, reload the dead ones; returns model -> status found
        (``"alive"``, ``"dead"``, or ``"busy"`` for an everything model whose jobs kept it
        from answering: see :func:`probe_stream`)."""
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.address)
        streams = self._stream_client()
        try:
            found = {m: self._probe(client, streams, m) for m in self.models}
            for model, status in found.items():
                if status != "dead":
                    continue
                if self.repository is not None:
                    check = functools.partial(self._probe, client, streams, model)
                    seconds = _touch_and_wait(self.repository, model, check)
                else:
                    seconds = heal(client, model, admin_key=self.admin_key)
                self.reloads.append((model, seconds))
            return found
        finally:
            client.close()
            if streams is not None:
                streams.close()

    def _stream_client(self) -> object | None:
        if not any(kind in STREAM_KINDS for kind in self.kinds.values()):
            return None
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.grpc_address)

    def _probe(self, client: object, streams: object | None, model: str) -> str:
        kind = self.kinds[model]
        if kind in STREAM_KINDS:
            return probe_stream(streams, model)
        return probe(client, model, kind)

    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._run, name="triton-sam-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check_once()
            except Exception:  # server restarting or stopping: try again next round
                continue


def _streams_last(kinds: dict[str, str | None], grpc_address: str | None) -> dict[str, str | None]:
    """``kinds`` with the models probed over a gRPC stream last (a busy one keeps a round
    waiting for up to its probe's timeout), or left out, with a warning, without an address."""
    streams = {m: k for m, k in kinds.items() if k in STREAM_KINDS}
    if streams and grpc_address is None:
        warnings.warn(
            f"self-heal: {', '.join(streams)} not watched: decoupled models are probed over "
            "gRPC; give the Watchdog grpc_address",
            stacklevel=3,
        )
        streams = {}
    return {**{m: k for m, k in kinds.items() if k not in STREAM_KINDS}, **streams}
