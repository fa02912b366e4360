"""What the command line prints as logs: ours at INFO, other libraries' only when asked.

triton-sam's own loggers (``triton_sam.*``) say what a command is doing (downloading, export
steps, the twin written) and stay at INFO. Libraries we call speak to their own developers:
onnxruntime's transformers optimizer logs every fusion at INFO (``fusion_utils: Removed 40
Identity nodes``), onnx and torch's exporter warn about tracing and deprecations through
:mod:`warnings`. Printed between our progress bars they break them mid-line and bury our own
lines, so by default only their warnings and errors (logging) or nothing (``warnings``) are
shown; ``verbose`` shows everything.
"""

from __future__ import annotations

import logging
import sys
import warnings

FORMAT = "%(levelname)s %(name)s: %(message)s"
OURS = "triton_sam"
# Python warnings (``warnings.warn``) are logged under this name once captured.
WARNINGS_LOGGER = "py.warnings"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record comes (a test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT))

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def setup_logging(*, verbose: bool = False) -> None:
    """Configure logging for a command-line run (before the command runs; calling it again
    replaces what an earlier call set).

    Args:
        verbose: show every library's INFO logs and Python warnings too.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(handler)
    root.addHandler(_StderrHandler())
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger(OURS).setLevel(logging.INFO)
    # Warnings (torch's TracerWarning, deprecations of onnx and friends) go through logging,
    # so they are held back like the logs: they speak to those libraries' users writing code,
    # not to someone running a command.
    logging.captureWarnings(True)
    logging.getLogger(WARNINGS_LOGGER).setLevel(logging.WARNING if verbose else logging.ERROR)
    if verbose:
        warnings.simplefilter("default")  # each distinct warning once per location
