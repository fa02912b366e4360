"""Click-to-mask latency in napari: a click on the plugin's Segment button until the labels
layer holds the mask, against the Python client's ``predict`` on the same server, image and
clicks, interleaved in one run so both see the same server state.

The napari figure is what an annotator waits for: the request on the widget's worker
thread, the answer's trip back to the UI thread, and the write into the labels layer (one
undo step). It needs a display (napari draws with OpenGL): run it under ``xvfb-run`` on a
headless machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from triton_sam.bench.stats import percentiles, ratio


@dataclass(frozen=True)
class NapariLatency:
    """Milliseconds per click, each path's samples and their percentiles."""

    napari_ms: list[float]
    client_ms: list[float]

    def table(self) -> str:
        """A markdown table: p50/p95 of each path and the napari/client ratio."""
        ours, theirs = percentiles(self.napari_ms, digits=1), percentiles(self.client_ms, digits=1)
        rows = [
            "| path | clicks | p50 ms | p95 ms |",
            "|---|---|---|---|",
            f"| napari widget (click -> labels) | {len(self.napari_ms)} | {ours['p50']} | "
            f"{ours['p95']} |",
            f"| SAM2TritonClient.predict | {len(self.client_ms)} | {theirs['p50']} | "
            f"{theirs['p95']} |",
            f"| ratio | | {ratio(ours['p50'], theirs['p50'])} | "
            f"{ratio(ours['p95'], theirs['p95'])} |",
        ]
        return "\n".join(rows)


def _image(shape: tuple[int, int]) -> np.ndarray:
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
    image = ((xx + yy) % 256).astype(np.uint8)
    image[(yy - shape[0] // 2) ** 2 + (xx - shape[1] // 2) ** 2 < (min(shape) // 4) ** 2] = 250
    return image


def _wait(widget: Any, timeout_s: float) -> None:
    from qtpy.QtWidgets import QApplication

    deadline = time.monotonic() + timeout_s
    while not widget.idle:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the widget did not answer within {timeout_s} s")
        QApplication.processEvents()
        time.sleep(0.0005)


def napari_click_latency(
    url: str,
    *,
    protocol: str = "grpc",
    clicks: int = 20,
    shape: tuple[int, int] = (512, 640),
    viewer: Any = None,
    timeout_s: float = 60.0,
) -> NapariLatency:
    """Time ``clicks`` widget clicks and as many client predicts, interleaved.

    Args:
        url: the server (``host:port``) with a SAM2.1 session model.
        protocol: ``"grpc"`` or ``"http"``, for both paths.
        clicks: clicks per path (one warm-up click each is not counted).
        shape: (rows, cols) of the synthetic image.
        viewer: a napari viewer to use (None: a hidden one made and closed here).
        timeout_s: the longest one click may take.
    """
    import napari

    from triton_sam import SAM2TritonClient, to_sam_rgb
    from triton_sam.napari.widget import SegmentAnythingWidget

    own = viewer is None
    viewer = napari.Viewer(show=False) if own else viewer
    image = _image(shape)
    layer = viewer.add_image(image, name="latency")
    widget = SegmentAnythingWidget(viewer)
    client = SAM2TritonClient(url, "sam2", protocol)
    try:
        widget.url.setText(url)
        widget.protocol.setCurrentText(protocol)
        widget.connect_button.click()
        _wait(widget, timeout_s)
        widget.image.setCurrentText(layer.name)
        widget.embed_button.click()
        _wait(widget, timeout_s)
        client.set_image(to_sam_rgb(image))
        rng = np.random.default_rng(0)
        spots = rng.integers((0, 0), shape, size=(clicks + 1, 2))
        napari_ms, client_ms = [], []
        for i, (row, col) in enumerate(spots):
            widget.commit()  # clears the prompts; each click is a new object
            widget.layers.points.add([row, col])
            t0 = time.perf_counter()
            widget.segment_button.click()
            _wait(widget, timeout_s)
            t1 = time.perf_counter()
            client.predict([[col, row]], [1])
            t2 = time.perf_counter()
            if widget.last_error is not None:
                raise RuntimeError(widget.last_error)
            if i:  # the first of each is a warm-up (connections, caches)
                napari_ms.append((t1 - t0) * 1e3)
                client_ms.append((t2 - t1) * 1e3)
        return NapariLatency(napari_ms, client_ms)
    finally:
        client.close()
        widget.close()
        viewer.layers.remove(layer)
        if own:
            viewer.close()
