"""Graph runners for :class:`.tracker.Tracker` outside Triton.

:class:`OnnxRuntimeRunner` runs the exported graphs in-process with onnxruntime (imported
when constructed): the benchmark's "ORT in-process" baseline and the fast tests. Inside
Triton the tracker model uses BLS calls instead (``serving/tracker_model.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from ..protocol import tracker as protocol


class OnnxRuntimeRunner:
    """One onnxruntime CPU session per graph.

    Args:
        graphs: graph key (``protocol.GRAPHS``) -> ``.onnx`` path; a directory holding
            ``<key>.onnx`` files is accepted too.
        intra_op_threads: onnxruntime intra-op threads (0 = its default).
        keys: the graphs to load (both families have the five of ``protocol.GRAPHS``).

    Raises:
        FileNotFoundError: a graph file is missing (the message names it).
    """

    def __init__(
        self,
        graphs: Mapping[str, str | os.PathLike[str]] | str | os.PathLike[str],
        *,
        intra_op_threads: int = 0,
        keys: Sequence[str] = tuple(protocol.GRAPHS),
    ) -> None:
        import onnxruntime as ort

        if not isinstance(graphs, Mapping):
            folder = os.fspath(graphs)
            graphs = {key: os.path.join(folder, f"{key}.onnx") for key in keys}
        missing = [os.fspath(p) for p in graphs.values() if not os.path.isfile(p)]
        if missing or set(graphs) != set(keys):
            raise FileNotFoundError(
                f"graphs: expected {sorted(keys)}, missing files {missing} "
                f"(got keys {sorted(graphs)}); export them with export_video()"
            )
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if intra_op_threads:
            options.intra_op_num_threads = intra_op_threads
        self.sessions = {
            key: ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
            for key, path in graphs.items()
        }

    def run(
        self, graph: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run ``graph`` on ``inputs``; returns ``outputs`` by name."""
        results = self.sessions[graph].run(list(outputs), dict(inputs))
        return dict(zip(outputs, results, strict=True))
