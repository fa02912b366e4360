"""The session model's metrics on Triton's metrics endpoint, and each click's stage clock.

Gauges of the cache, counters of hits, misses, evictions and of what admission refused or
cancelled, and per stage of ``protocol.STAGES`` the microseconds clicks spent in it
(``triton-sam bench click`` reads them beside Triton's own per-model statistics).
"""

from __future__ import annotations

import time

from ..metric_set import MetricSet
from ..protocol import embedding_cache as protocol

SPECS = (
    ("cached_images", "GAUGE", "Images whose features the session model holds"),
    ("cached_bytes", "GAUGE", "Bytes of features and kept logits the session model holds"),
    ("hits", "COUNTER", "Predictions answered from cached features"),
    ("misses", "COUNTER", "Requests for an image id (or logits key) not cached"),
    ("evictions", "COUNTER", "Images evicted by the LRU bound"),
    ("restored", "COUNTER", "Images read back from the feature store instead of encoded"),
    ("cancelled_clicks", "COUNTER", "Clicks cancelled while waiting for the decoder"),
    ("decodes_in_flight", "GAUGE", "Clicks at the decoder (sent, not come back)"),
    ("embeds_in_flight", "GAUGE", "Embeds being decoded, preprocessed or encoded"),
    ("embeds_waiting", "GAUGE", "Embeds waiting for an encoder slot"),
    ("refused_embeds", "COUNTER", "Embeds refused at once: the waiting line was full"),
    ("cancelled_embeds", "COUNTER", "Embeds cancelled while waiting for a slot"),
)


class Metrics(MetricSet):
    """Gauges of the cache and counters of hits/misses/evictions; no-ops without metrics."""

    def __init__(self, pb_utils, args):
        super().__init__(pb_utils, args, SPECS, protocol.METRIC_PREFIX)

    def _add_metrics(self, pb_utils, labels):
        """Per stage of ``protocol.STAGES``: microseconds spent in it, and clicks through it."""
        specs = (
            (protocol.STAGE_MICROSECONDS, "Microseconds spent in each stage of clicks"),
            (protocol.STAGE_COUNT, "Clicks that went through each stage"),
        )
        for name, description in specs:
            family = pb_utils.MetricFamily(
                name=name, description=description, kind=pb_utils.MetricFamily.COUNTER
            )
            self._families.append(family)
            for stage in protocol.STAGES:
                metric = family.Metric(labels={**labels, "stage": stage})
                self._metrics[(name, stage)] = metric

    def stages(self, clock):
        """Add one click's stage durations (``clock.spent``, seconds) to the stage counters."""
        for stage, seconds in clock.totals().items():
            us = self._metrics.get((protocol.STAGE_MICROSECONDS, stage))
            if us is not None:
                us.increment(seconds * 1e6)
                self._metrics[(protocol.STAGE_COUNT, stage)].increment(1)

    def in_flight(self, clicks):
        metric = self._metrics.get("decodes_in_flight")
        if metric is not None:
            metric.set(clicks.at_decoder)

    def embeds(self, queue):
        if "embeds_in_flight" in self._metrics:
            self._metrics["embeds_in_flight"].set(queue.at_decoder)
            self._metrics["embeds_waiting"].set(queue.waiting)

    def publish(self, cache):
        if "cached_images" in self._metrics:
            self._metrics["cached_images"].set(len(cache))
            self._metrics["cached_bytes"].set(cache.nbytes)


class Clock:
    """Stage durations of one request: ``mark(stage)`` adds the time since the last mark."""

    __slots__ = ("start", "last", "spent", "decoded")

    def __init__(self, start):
        self.start = self.last = start  # time.perf_counter() when execute() received it
        self.spent = {}
        self.decoded = False  # set once the decoder ran: only clicks publish their stages

    def mark(self, stage):
        now = time.perf_counter()
        self.spent[stage] = self.spent.get(stage, 0.0) + now - self.last
        self.last = now

    def totals(self):
        return {**self.spent, "total": self.last - self.start}
