"""A python model's custom metrics on Triton's metrics endpoint, registered from a table.

Every call is a no-op where the stub has no custom metrics (before Triton 23.xx) or metrics
are disabled (``--allow-metrics=false``): metrics must never fail a model.
"""


class MetricSet:
    """One metric labelled with the model and version per ``(name, kind, description)`` row.

    Args:
        pb_utils: ``triton_python_backend_utils`` (or the unit tests' stub).
        args: the ``initialize`` arguments (``model_name``, ``model_version``).
        specs: rows of (name, ``"GAUGE"`` or ``"COUNTER"``, description).
        prefix: put before each name on the endpoint.
    """

    def __init__(self, pb_utils, args, specs, prefix):
        self._families, self._metrics = [], {}
        if not hasattr(pb_utils, "MetricFamily"):
            return
        labels = {"model": args["model_name"], "version": str(args["model_version"])}
        try:
            for name, kind, description in specs:
                family = pb_utils.MetricFamily(
                    name=prefix + name,
                    description=description,
                    kind=getattr(pb_utils.MetricFamily, kind),
                )
                self._families.append(family)
                self._metrics[name] = family.Metric(labels=labels)
            self._add_metrics(pb_utils, labels)
        except Exception:  # metrics disabled (--allow-metrics=false): record nothing
            self._families, self._metrics = [], {}

    def _add_metrics(self, pb_utils, labels):
        """Register further families beside the table's (a subclass's hook)."""

    def count(self, name, value=1):
        """Add ``value`` to the counter ``name`` (nothing when 0 or metrics are off)."""
        metric = self._metrics.get(name)
        if metric is not None and value:
            metric.increment(value)

    def close(self):
        """Drop every metric, then the families (python-backend rule: metrics go first)."""
        self._metrics.clear()
        self._families.clear()
