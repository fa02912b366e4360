"""What the server itself says it did: Triton's per-model statistics and Prometheus metrics.

- ``GET /v2/models/<m>/stats`` (HTTP port): ``inference_count`` (requests the backend
  answered), ``execution_count`` (model executions; a batch is one), success/fail counts.
- ``GET /metrics`` (metrics port): ``nv_inference_request_failure{reason="CANCELED"}``
  (requests Triton dropped before they reached the backend: cancelled while still in the
  dynamic batcher's queue), ``nv_inference_pending_request_count``, and the runner's
  ``triton_sam_cancelled_requests_skipped`` (cancelled requests that were already batched:
  answered unrun by the python-backend runner, yet counted by Triton as inferences).

Requests that actually ran the model = ``inference_count - skipped``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

from triton_sam.errors import ServerUnavailableError
from triton_sam.serving.protocol import runner as runner_protocol

SKIPPED_METRIC = runner_protocol.SKIPPED_METRIC  # what runner_model.py counts
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


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
        pending: ``nv_inference_pending_request_count`` (a gauge: not subtracted).
    """

    inference_count: int = 0
    execution_count: int = 0
    success: int = 0
    fail: int = 0
    canceled: int = 0
    skipped: int = 0
    pending: int = 0

    @property
    def executed(self) -> int:
        """Requests that actually ran the model."""
        return self.inference_count - self.skipped

    @property
    def cancelled(self) -> int:
        """Cancelled requests the server saw and did not run (dropped or skipped)."""
        return self.canceled + self.skipped

    def __sub__(self, other: ServerCounters) -> ServerCounters:
        delta = {f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        delta["pending"] = self.pending
        return ServerCounters(**delta)

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
    stats = _get_json(f"{http_url.rstrip('/')}/v2/models/{model}/stats")["model_stats"][0]
    infer = stats.get("inference_stats", {})
    metrics: dict[str, float] = {}
    if metrics_url:
        metrics = parse_metrics(_get_text(f"{metrics_url.rstrip('/')}/metrics"), model)
    return ServerCounters(
        inference_count=int(stats.get("inference_count", 0)),
        execution_count=int(stats.get("execution_count", 0)),
        success=int(infer.get("success", {}).get("count", 0)),
        fail=int(infer.get("fail", {}).get("count", 0)),
        canceled=int(metrics.get("nv_inference_request_failure{reason=CANCELED}", 0)),
        skipped=int(metrics.get(SKIPPED_METRIC, 0)),
        pending=int(metrics.get("nv_inference_pending_request_count", 0)),
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
