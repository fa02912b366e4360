"""What the server itself says it did: Triton's per-model statistics and Prometheus metrics.

- ``GET /v2/models/<m>/stats`` (HTTP port): ``inference_count`` (requests the backend
  answered), ``execution_count`` (model executions; a batch is one), success/fail counts.
- ``GET /metrics`` (metrics port): ``nv_inference_request_failure{reason="CANCELED"}``
  (requests Triton dropped before they reached the backend: cancelled while still in the
  dynamic batcher's queue), ``nv_inference_pending_request_count``, and the runner's
  ``triton_sam_cancelled_requests_skipped`` (cancelled requests that were already batched:
  answered unrun by the python-backend runner, yet counted by Triton as inferences), and the
  session model's ``triton_sam_session_cancelled_clicks`` (clicks cancelled while they waited
  for a decoder slot there: answered unrun, never sent to a decoder).

Requests that actually ran the model = ``inference_count - skipped``.

Which decoder runs a client's clicks is not always the one it names: a click through the
session model runs on the decoder its config names (on the CPU twin, an unbatched copy of
the batched decoder). :class:`ClickCounters` is the one place that answers "which decoders
ran these clicks, and how many times".
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from triton_sam.errors import ServerUnavailableError
from triton_sam.serving.protocol import embedding_cache
from triton_sam.serving.protocol import runner as runner_protocol

SKIPPED_METRIC = runner_protocol.SKIPPED_METRIC  # what runner_model.py counts
# what embedding_cache_model.py counts when a waiting click was cancelled
SESSION_CANCELLED_METRIC = embedding_cache.METRIC_PREFIX + "cancelled_clicks"
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _stat(*path: str) -> Any:
    """A counter read from the model's ``/stats`` entry at ``path`` (0 where absent)."""
    return field(default=0, metadata={"stats": path})


def _metric(name: str) -> Any:
    """A counter read from the metrics endpoint: the model's samples of ``name``, summed."""
    return field(default=0, metadata={"metric": name})


@dataclass(frozen=True)
class ServerCounters:
    """Cumulative counters of one model (subtract two readings for what happened between).

    Attributes:
        inference_count: requests the backend answered (``/stats``), including cancelled
            requests the runner answered unrun.
        execution_count: model executions (``/stats``); a batch of requests is one.
        success / fail: ``/stats`` inference_stats counts.
        canceled: ``nv_inference_request_failure{reason="CANCELED"}``: dropped by Triton
            before reaching the backend.
        skipped: ``triton_sam_cancelled_requests_skipped``: answered unrun by the runner
            (0 where the model is not served by it, e.g. the onnxruntime backend).
        session_cancelled: ``triton_sam_session_cancelled_clicks``: clicks the session
            model answered unrun, cancelled while they waited for a decoder slot (0 where
            clicks do not go through it).
        pending: ``nv_inference_pending_request_count`` (a gauge: not subtracted).

    Each field declares where :func:`read_counters` reads it.
    """

    inference_count: int = _stat("inference_count")
    execution_count: int = _stat("execution_count")
    success: int = _stat("inference_stats", "success", "count")
    fail: int = _stat("inference_stats", "fail", "count")
    canceled: int = _metric("nv_inference_request_failure{reason=CANCELED}")
    skipped: int = _metric(SKIPPED_METRIC)
    session_cancelled: int = _metric(SESSION_CANCELLED_METRIC)
    pending: int = _metric("nv_inference_pending_request_count")

    @property
    def executed(self) -> int:
        """Requests that actually ran the model."""
        return self.inference_count - self.skipped

    @property
    def cancelled(self) -> int:
        """Cancelled requests the server saw and did not run (dropped or skipped)."""
        return self.canceled + self.skipped + self.session_cancelled

    def __sub__(self, other: ServerCounters) -> ServerCounters:
        delta = {f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        delta["pending"] = self.pending
        return ServerCounters(**delta)

    def __add__(self, other: ServerCounters) -> ServerCounters:
        """Two models' counters together (pending requests too)."""
        return ServerCounters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def as_dict(self) -> dict[str, int]:
        """Every counter plus ``executed`` and ``cancelled``."""
        return {**asdict(self), "executed": self.executed, "cancelled": self.cancelled}


def parse_metrics(text: str, model: str) -> dict[str, float]:
    """Sum Prometheus samples of ``model`` by metric name (``name{reason=X}`` kept apart).

    Returns:
        e.g. ``{"nv_inference_count": 28, "nv_inference_request_failure{reason=CANCELED}": 4}``.
    """
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"] or ""))
        if labels.get("model") != model:
            continue
        key = match["name"]
        if "reason" in labels:
            key += "{reason=" + labels["reason"] + "}"
        try:
            totals[key] = totals.get(key, 0.0) + float(match["value"])
        except ValueError:
            continue
    return totals


def read_counters(http_url: str, metrics_url: str | None, model: str) -> ServerCounters:
    """Read one model's counters from a running server.

    Args:
        http_url: ``http://host:port`` of Triton's HTTP endpoint (statistics).
        metrics_url: ``http://host:port`` of its metrics endpoint; None skips the metrics
            (``canceled``, ``skipped`` and ``pending`` stay 0).
        model: Triton model name.

    Raises:
        ServerUnavailableError: an endpoint cannot be read.
    """
    text = _get_text(f"{metrics_url.rstrip('/')}/metrics") if metrics_url else None
    return _model_counters(http_url, text, model)


def _model_counters(http_url: str, metrics_text: str | None, model: str) -> ServerCounters:
    stats = _get_json(f"{http_url.rstrip('/')}/v2/models/{model}/stats")["model_stats"][0]
    metrics = parse_metrics(metrics_text, model) if metrics_text else {}
    values = {}
    for f in fields(ServerCounters):
        if "metric" in f.metadata:
            values[f.name] = int(metrics.get(f.metadata["metric"], 0))
            continue
        node = stats
        for key in f.metadata["stats"]:
            node = node.get(key, {})
        values[f.name] = int(node or 0)
    return ServerCounters(**values)


def session_decoder(http_url: str, session_model: str) -> str | None:
    """The decoder the session model's clicks run on: its config's ``decoder_model``
    parameter (on the CPU twin, the unbatched copy); None when the config does not say.

    Raises:
        ServerUnavailableError: the config cannot be read (the model is not served).
    """
    return _session_parameter(http_url, session_model, embedding_cache.PARAM_DECODER_MODEL)


def session_encoder(http_url: str, session_model: str) -> str | None:
    """The encoder the session model's embeds run on: its config's ``encoder_model``
    parameter (on the CPU twin, the background copy); None when the config does not say.

    Raises:
        ServerUnavailableError: the config cannot be read (the model is not served).
    """
    return _session_parameter(http_url, session_model, embedding_cache.PARAM_ENCODER_MODEL)


@dataclass(frozen=True)
class ClickCounters:
    """Reads what ran a client's clicks: calling it returns the counters of every decoder
    that executes them, summed, plus the session model's cancellations (clicks Triton dropped
    from its queue, clicks it answered unrun) when the clicks go through it.

    Build it with :meth:`of`, which asks the server which decoders those are.

    Attributes:
        http_url / metrics_url: the server's statistics and metrics endpoints (no metrics:
            ``canceled``, ``skipped``, ``session_cancelled`` and ``pending`` stay 0).
        decoders: the decoders counted.
        session_model: the session model counted for its cancellations, or None.
    """

    http_url: str
    metrics_url: str | None
    decoders: tuple[str, ...]
    session_model: str | None = None

    @classmethod
    def of(
        cls,
        http_url: str,
        metrics_url: str | None,
        decoder_model: str,
        session_model: str | None = None,
    ) -> ClickCounters:
        """The counters of a client calling ``decoder_model`` with features (the stateless
        path) and, when ``session_model`` is given, clicking through it: then the decoder
        its config names is counted too (once, where it is ``decoder_model`` itself).

        Raises:
            ServerUnavailableError: the server or the session model's config cannot be read.
        """
        decoders = [decoder_model]
        if session_model:
            called = session_decoder(http_url, session_model) or decoder_model
            decoders += [called] if called != decoder_model else []
        return cls(http_url, metrics_url, tuple(decoders), session_model)

    @classmethod
    def of_client(cls, client: Any, http_url: str, metrics_url: str | None) -> ClickCounters:
        """The counters of ``client``'s clicks (a ``SAM2TritonClient`` or
        ``SpeculativeSAM2Client``, connected): the session model's too where its clicks go
        through it (``client.uses_server_embeddings``)."""
        session_model = client.session_model if client.uses_server_embeddings else None
        return cls.of(http_url, metrics_url, client.decoder_model, session_model)

    @property
    def models(self) -> list[str]:
        """Every model counted: the decoders, then the session model (if any)."""
        return [*self.decoders, *([self.session_model] if self.session_model else [])]

    def __call__(self) -> ServerCounters:
        text = _get_text(f"{self.metrics_url.rstrip('/')}/metrics") if self.metrics_url else None
        total = ServerCounters()
        for decoder in self.decoders:
            total += _model_counters(self.http_url, text, decoder)
        if self.session_model:
            # only what it did not run: its own inferences are clicks counted at a decoder
            session = _model_counters(self.http_url, text, self.session_model)
            total += ServerCounters(
                canceled=session.canceled,
                session_cancelled=session.session_cancelled,
                pending=session.pending,
            )
        return total


def every_decoder(http_url: str) -> tuple[int, int]:
    """(inferences, executions) summed over every model of the server whose name says it is
    a decoder (``/v2/models/stats``): what ran, wherever the clicks went. The cross-check of
    :class:`ClickCounters`, which reads only the decoders that a client's clicks run on.
    """
    stats = _get_json(f"{http_url.rstrip('/')}/v2/models/stats")["model_stats"]
    decoders = [m for m in stats if "decoder" in m["name"]]
    return (
        sum(int(m.get("inference_count", 0)) for m in decoders),
        sum(int(m.get("execution_count", 0)) for m in decoders),
    )


def wait_until_quiet(
    read: Callable[[], ServerCounters], *, quiet_s: float, timeout_s: float = 120.0
) -> ServerCounters:
    """Poll ``read`` until nothing is pending and no counter moved for ``quiet_s``.

    Cancelled requests may still be executing (or queued) on the server after the client
    has given up on them; reading counters before they settle would undercount.
    """
    deadline = time.monotonic() + timeout_s
    last = read()
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(min(0.1, quiet_s / 4))
        now = read()
        if now != last or now.pending:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= quiet_s:
            return now
    return last


def _get_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as e:
        raise ServerUnavailableError(f"{url}: cannot read server counters ({e})") from e


def _get_json(url: str) -> dict:
    return json.loads(_get_text(url))


def _session_parameter(http_url: str, session_model: str, name: str) -> str | None:
    """The string parameter ``name`` of ``session_model``'s config; None when unset."""
    config = _get_json(f"{http_url.rstrip('/')}/v2/models/{session_model}/config")
    parameters = config.get("parameters", {})
    return parameters.get(name, {}).get("string_value") or None
