"""Memory a benchmark reports: a process tree's size, sampled on a background thread.

One sampler for every benchmark that reports memory (soak, storm, everything, users), so
each counts the same thing: the proportional set size (PSS) of a process and all its
descendants, where tritonserver and its python-backend stubs map the same shared-memory
regions that plain RSS would count once per process.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


def process_tree_rss(pid: int, *, children: bool = True) -> int | None:
    """Memory of ``pid`` and all its descendants (bytes; ``pid`` alone when not
    ``children``), None if it is gone.

    Proportional set size (PSS) where the kernel reports it: tritonserver and its stubs map
    the same shared-memory regions, which plain RSS would count once per process.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *(root.children(recursive=True) if children else ())]
    except psutil.Error:
        return None
    total = 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except psutil.Error:  # a stub exiting while we read
            continue
    return total


@dataclass
class MemorySample:
    """Resident memory at one time (bytes); ``server`` is None when it cannot be seen."""

    t_s: float
    client: int
    server: int | None


class _Periodic:
    """Calls ``self._sample()`` every ``period_s`` on a daemon thread while the block runs."""

    def __init__(self, period_s: float, name: str) -> None:
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _start(self) -> None:
        self._thread.start()

    def _join(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self) -> object:
        raise NotImplementedError


class MemorySampler(_Periodic):
    """Samples this process's RSS and the server's (tree) memory on a background thread."""

    def __init__(self, server_pid: int | None, period_s: float) -> None:
        super().__init__(period_s, "bench-memory")
        self.server_pid = server_pid
        self.samples: list[MemorySample] = []
        self._t0 = time.monotonic()

    def __enter__(self) -> MemorySampler:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._join()

    def sample(self) -> MemorySample:
        """Take one sample now (also recorded)."""
        import psutil

        server = process_tree_rss(self.server_pid) if self.server_pid else None
        sample = MemorySample(
            time.monotonic() - self._t0, psutil.Process().memory_info().rss, server
        )
        self.samples.append(sample)
        return sample

    _sample = sample


class PeakMemory(_Periodic):
    """The largest :func:`process_tree_rss` of ``pid`` seen while the block runs (of ``pid``
    alone when not ``children``: a client whose embedded server is its child)."""

    def __init__(self, pid: int | None, period_s: float, *, children: bool = True) -> None:
        super().__init__(period_s, "bench-peak-memory")
        self.pid, self.children = pid, children
        self.bytes: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.pid is not None:
            self._sample()
            self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pid is not None:
            self._join()
            self._sample()

    def _sample(self) -> None:
        assert self.pid is not None
        value = process_tree_rss(self.pid, children=self.children)
        if value is not None:
            self.bytes = max(self.bytes or 0, value)


class TreePeaks(_Periodic):
    """Peaks of this process and its descendants (bytes), sampled while the block runs and
    once more at its end (a short block still gets a sample).

    Attributes:
        peaks: ``tree`` = the highest PSS of this process plus all its descendants at once;
            ``servers`` = the highest PSS of its descendants (tritonserver and its stubs)
            together; ``own`` = this process's highest RSS.
    """

    def __init__(self, period_s: float = 2.0) -> None:
        super().__init__(period_s, "bench-tree-memory")
        self.peaks = {"tree": 0, "servers": 0, "own": 0}

    def __enter__(self) -> TreePeaks:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._join()
        self._sample()

    def _sample(self) -> None:
        import psutil

        own = psutil.Process()
        tree = process_tree_rss(own.pid) or 0
        mine = getattr(own.memory_full_info(), "pss", 0)
        self.peaks["tree"] = max(self.peaks["tree"], tree)
        self.peaks["servers"] = max(self.peaks["servers"], tree - mine)
        self.peaks["own"] = max(self.peaks["own"], own.memory_info().rss)
