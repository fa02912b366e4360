"""The widget's long jobs: segment everything (progress, cancel), propagation through z and
concept phrases. A mixin of :class:`~triton_sam.napari.widget.SegmentAnythingWidget`, which
provides the layers, the session and ``_run`` (a request on the worker thread, its answer on
the UI thread)."""

from __future__ import annotations

from typing import Any

import numpy as np

from triton_sam import resolve_pixel_mapping, to_sam_rgb
from triton_sam.napari import layers as L
from triton_sam.napari.labels import add_instances, everything_labels, replace_object


class LongJobs:
    """Segment everything, Propagate through z, Find concept."""

    # -- long jobs ------------------------------------------------------------------------
    def segment_everything(self, **params: Any) -> None:
        """Every instance of the embedded image into the "SAM everything" layer."""
        image = self._image_layer()
        if self.layers is None or self._needs_embed(image):
            self.embed(then=lambda: self.segment_everything(**params))
            return
        session, z = self.session, self._z(image)
        self._cancel.clear()
        self.progress.setValue(0)
        grpc_url = session.url if session.protocol == "grpc" else None

        def progress(done: int, total: int) -> None:
            self._bridge.call.emit(lambda: self._progress(done, total))

        def done(result: Any) -> None:
            labels = everything_labels(result)
            shape = L.spatial_shape(image)
            data = labels if z is None else np.zeros(shape, np.uint32)
            if z is not None:
                data[z] = labels
            if L.EVERYTHING in self.viewer.layers:
                self.viewer.layers.remove(L.EVERYTHING)
            self.viewer.add_labels(data, name=L.EVERYTHING)
            self.progress.setValue(self.progress.maximum())
            self.status.setText(f"Segment everything: {len(result)} instances")

        job = lambda: session.everything(progress, self._cancel, grpc_url, **params)  # noqa: E731
        self._run(job, done, "Segment everything")

    def _progress(self, done: int, total: int) -> None:
        self.progress.setMaximum(max(total, 1))
        self.progress.setValue(done)

    def propagate(self) -> None:
        """Track the current object from this slice through the stack, both ways; again on
        another slice to correct it (Propagate through z)."""
        image = self._image_layer()
        z = self._z(image)
        if z is None:
            self.status.setText("Propagate needs a 3-D image layer")
            return
        self.prepare_layers()
        prompt, object_id, session = self._prompt(z), self.object_id, self._session()
        if prompt.empty:
            self.status.setText("Add a point or a box on this slice first")
            return
        objects, data = self.layers.objects, np.asarray(image.data)

        def done(frames: dict[int, dict[int, np.ndarray]]) -> None:
            masks = {f: by_id[object_id] for f, by_id in frames.items() if object_id in by_id}
            replace_object(objects, masks, object_id)
            self.status.setText(f"Object {object_id} tracked through {len(masks)} slices")

        job = lambda: session.propagate(image.name, data, z, object_id, prompt)  # noqa: E731
        self._run(job, done, "Propagate")

    def find_concept(self) -> None:
        """Every instance of the phrase in the text box, each a new object (Find concept)."""
        image, text, session = (
            self._image_layer(),
            self.concept_text.text().strip(),
            self._session(),
        )
        if not text:
            self.status.setText("Type a phrase first, e.g. 'nucleus'")
            return
        objects, z, data = self.prepare_layers().objects, self._z(image), image.data

        def job() -> np.ndarray:  # the mapping reads the whole layer: off the UI thread too
            mapping = resolve_pixel_mapping(data, volume=z is not None)
            return session.concepts(
                text, to_sam_rgb(np.asarray(data if z is None else data[z]), mapping)
            )

        def done(instances: np.ndarray) -> None:
            self.object_id = add_instances(objects, instances, self.object_id, z)
            self.object_label.setText(f"Object {self.object_id}")
            self.status.setText(f"{text!r}: {len(instances)} instances")

        self._run(job, done, "Find concept")
