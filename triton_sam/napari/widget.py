"""The dock widget "Segment Anything (Triton)": Qt controls over :mod:`.session`.

Every request runs on a worker thread (one, so the image's embed, clicks and jobs keep their
order; hover previews on their own latest-wins thread); answers come back to the UI thread
through a queued Qt signal. A failure becomes a message in the status line and a napari
notification, never a traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from napari.utils.notifications import show_info, show_warning
from qtpy.QtCore import QObject, Signal
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from triton_sam import TritonSamError
from triton_sam.napari import layers as L
from triton_sam.napari.jobs import LongJobs
from triton_sam.napari.labels import replace_object
from triton_sam.napari.latest import LatestOnly
from triton_sam.napari.prompts import Prompt, box_prompt, combine, points_prompt
from triton_sam.napari.session import Cancelled, Session


class _Bridge(QObject):
    """Carries a function from a worker thread to the UI thread (queued signal)."""

    call = Signal(object)


class SegmentAnythingWidget(LongJobs, QWidget):
    """Segment Anything on a triton-sam server, in napari.

    Args:
        napari_viewer: the viewer (napari passes it by this name).
    """

    def __init__(self, napari_viewer: Any) -> None:
        super().__init__()
        self.viewer = napari_viewer
        self.session: Session | None = None
        self.layers: L.PromptLayers | None = None
        self.object_id = 1
        self.pending = 0  # jobs submitted and not yet answered on the UI thread
        self.last_error: str | None = None
        self._muted = False  # prompt edits made by the widget itself do not re-segment
        self._cancel = threading.Event()
        self._bridge = _Bridge()
        self._bridge.call.connect(lambda fn: fn())
        self._jobs = ThreadPoolExecutor(1, thread_name_prefix="triton-sam")
        self.hover = LatestOnly(self._bridge.call.emit)
        self._build()
        self.viewer.layers.events.inserted.connect(self._refresh_images)
        self.viewer.layers.events.removed.connect(self._refresh_images)
        self._refresh_images()

    # -- layout --------------------------------------------------------------------------
    def _build(self) -> None:
        self.url = QLineEdit("localhost:8001")
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.Password)  # a secret: never shown nor logged
        self.token.setPlaceholderText("optional: the proxy's bearer token")
        self.protocol = QComboBox()
        self.protocol.addItems(["grpc", "http"])
        self.model = QComboBox()
        self.connect_button = self._button("Connect", self.connect_server)
        self.status = QLabel("Not connected")
        self.status.setWordWrap(True)
        self.image = QComboBox()
        self.embed_button = self._button("Embed", self.embed)
        self.segment_button = self._button("Segment [S]", self.segment)
        self.auto = QCheckBox("Segment on every prompt change")
        self.hover_box = QCheckBox("Preview under the mouse")
        self.commit_button = self._button("Commit object [C]", self.commit)
        self.undo_button = self._button("Undo", self.undo)
        self.object_label = QLabel("Object 1")
        self.everything_button = self._button("Segment everything", self.segment_everything)
        self.cancel_button = self._button("Cancel", self._cancel.set)
        self.progress = QProgressBar()
        self.propagate_button = self._button("Propagate through z", self.propagate)
        self.concept_text = QLineEdit()
        self.concept_text.setPlaceholderText("a phrase, e.g. 'nucleus'")
        self.concept_button = self._button("Find concept", self.find_concept)
        form = QFormLayout()
        form.addRow("Server", self.url)
        form.addRow("Token", self.token)
        form.addRow("Protocol", self.protocol)
        form.addRow("Model", self.model)
        form.addRow("Image", self.image)
        rows: list[QWidget | QHBoxLayout] = [
            self.connect_button,
            self.status,
            self.embed_button,
            self._row(self.segment_button, self.commit_button, self.undo_button),
            self.object_label,
            self.auto,
            self.hover_box,
            self._row(self.everything_button, self.cancel_button),
            self.progress,
            self.propagate_button,
            self._row(self.concept_text, self.concept_button),
        ]
        box = QVBoxLayout(self)
        box.addLayout(form)
        for row in rows:
            box.addLayout(row) if isinstance(row, QHBoxLayout) else box.addWidget(row)
        box.addStretch()
        self._show_tools()

    def _button(self, text: str, slot: Callable[[], Any]) -> QPushButton:
        button = QPushButton(text)
        button.clicked.connect(lambda *_: self._guarded(text, slot))
        return button

    def _guarded(self, what: str, slot: Callable[[], Any]) -> None:
        """Run a button's action; a refusal before any request becomes a message too."""
        try:
            slot()
        except Exception as e:
            self._report(what, e)

    def _row(self, *widgets: QWidget) -> QHBoxLayout:
        row = QHBoxLayout()
        for w in widgets:
            row.addWidget(w)
        return row

    def _show_tools(self) -> None:
        """Only the tools the server can run are shown."""
        offer = self.session.offer if self.session is not None else None
        connected = offer is not None and bool(offer.families)
        for w in (self.embed_button, self.segment_button, self.commit_button, self.undo_button):
            w.setEnabled(connected)
        self.everything_button.setVisible(bool(offer and offer.everything))
        self.cancel_button.setVisible(bool(offer and offer.everything))
        self.progress.setVisible(bool(offer and offer.everything))
        self.propagate_button.setVisible(bool(offer and offer.tracker))
        self.concept_text.setVisible(bool(offer and offer.concepts))
        self.concept_button.setVisible(bool(offer and offer.concepts))

    def _refresh_images(self, *_: Any) -> None:
        current = self.image.currentText()
        names = [layer.name for layer in self.viewer.layers if layer._type_string == "image"]
        self.image.clear()
        self.image.addItems(names)
        if current in names:
            self.image.setCurrentText(current)

    # -- running requests off the UI thread ------------------------------------------------
    @property
    def idle(self) -> bool:
        """No request is running or waiting for its answer."""
        return self.pending == 0

    def _run(self, job: Callable[[], Any], done: Callable[[Any], None], what: str) -> None:
        self.pending += 1
        self.status.setText(f"{what}...")

        def work() -> None:
            try:
                answer, error = job(), None
            except Exception as e:  # shown to the user on the UI thread
                answer, error = None, e
            self._bridge.call.emit(lambda: self._finish(done, answer, error, what))

        self._jobs.submit(work)

    def _finish(self, done: Callable[[Any], None], answer: Any, error: Any, what: str) -> None:
        self.pending -= 1
        if error is None:
            self.last_error = None
            done(answer)
        else:
            self._report(what, error)

    def _report(self, what: str, error: BaseException) -> None:
        if isinstance(error, Cancelled):
            message = f"{what}: cancelled"
        elif isinstance(error, TritonSamError):
            message = f"{what} failed: {error}"
        else:  # a bug or a library error: still a message, with its type to report it
            message = f"{what} failed: {type(error).__name__}: {error}"
        self.last_error = message
        self.status.setText(message)
        show_warning(message)

    # -- actions -------------------------------------------------------------------------
    def connect_server(self) -> None:
        """List the server's models and open the clients (Connect)."""
        if self.session is not None:
            self.session.close()
        token = self.token.text().strip() or None
        session = Session(self.url.text().strip(), self.protocol.currentText(), token=token)
        family = self.model.currentText() or None

        def done(offer: Any) -> None:
            self.session = session
            self.model.clear()
            self.model.addItems(offer.families)
            if session.client is not None:
                self.model.setCurrentText(session.client.model_type)
            self._show_tools()
            tools = offer.families + [
                name
                for name, on in (("tracker", offer.tracker), ("concepts", offer.concepts))
                if on
            ]
            self.status.setText(f"Connected: {', '.join(tools)}")
            show_info(f"triton-sam: connected to {session.url}")

        self._run(lambda: session.connect(family), done, "Connect")

    def _session(self) -> Session:
        if self.session is None:
            raise ValueError("not connected: press Connect first")
        return self.session

    def _image_layer(self) -> Any:
        name = self.image.currentText()
        if not name:
            raise ValueError("no image layer: add one, then choose it under Image")
        return self.viewer.layers[name]

    def _z(self, image: Any) -> int | None:
        return int(self.viewer.dims.current_step[0]) if len(L.spatial_shape(image)) == 3 else None

    def embed(self, then: Callable[[], None] | None = None) -> None:
        """Embed the chosen image layer (its current z-slice in a stack) (Embed)."""
        image, _ = self._image_layer(), self.prepare_layers()
        z, session = self._z(image), self._session()

        def done(embedded: Any) -> None:
            path = "tiled" if embedded.large is not None else "whole"
            self.status.setText(f"Embedded {image.name} ({path}, slice {z})")
            if then is not None:
                then()

        self._run(lambda: session.embed(image.name, image.data, rgb=image.rgb, z=z), done, "Embed")

    def prepare_layers(self) -> L.PromptLayers:
        """The prompt and mask layers of the chosen image, made if missing."""
        self.layers = L.ensure_layers(self.viewer, self._image_layer())
        self._watch_prompts()
        return self.layers

    def _needs_embed(self, image: Any) -> bool:
        e = self.session.embedded if self.session is not None else None
        return e is None or e.layer_name != image.name or e.z != self._z(image)

    def _prompt(self, z: int | None) -> Prompt:
        assert self.layers is not None
        points = points_prompt(self.layers.points.data, L.point_labels(self.layers.points), z)
        return combine(points, box_prompt(self.layers.boxes.data, self.layers.boxes.shape_type, z))

    def segment(self) -> None:
        """Segment the current object from its prompts into the objects layer (Segment)."""
        image = self._image_layer()
        if self.layers is None or self._needs_embed(image):
            self.embed(then=self.segment)
            return
        z = self._z(image)
        prompt, object_id, session = self._prompt(z), self.object_id, self.session
        if prompt.empty:
            self.status.setText("Add a point or a box first")
            return
        objects = self.layers.objects

        def done(mask: np.ndarray) -> None:
            replace_object(objects, {z: mask}, object_id)
            self.status.setText(f"Object {object_id}: {int(mask.sum())} pixels")

        self._run(lambda: session.segment(prompt), done, "Segment")

    def commit(self) -> None:
        """Keep the current object and start the next id; clears the prompts (Commit)."""
        self.object_id += 1
        self.object_label.setText(f"Object {self.object_id}")
        if self.layers is not None:
            self._muted = True
            try:
                self.layers.points.data = np.empty((0, self.layers.points.ndim))
                self.layers.boxes.data = []
            finally:
                self._muted = False

    def undo(self) -> None:
        """Take back the last write to the objects layer (its own undo history)."""
        if self.layers is not None:
            self.layers.objects.undo()

    def _watch_prompts(self) -> None:
        assert self.layers is not None
        for layer in (self.layers.points, self.layers.boxes):
            if not getattr(layer, "_triton_sam_watched", False):
                layer.events.data.connect(self._on_prompt_change)
                layer._triton_sam_watched = True
        image = self._image_layer()
        if self._on_mouse_move not in image.mouse_move_callbacks:
            image.mouse_move_callbacks.append(self._on_mouse_move)
        self._bind_keys()

    def _bind_keys(self) -> None:
        assert self.layers is not None
        points = self.layers.points
        for layer in (self.viewer, points, self.layers.boxes):  # layers shadow viewer keys
            layer.bind_key("s", lambda *_: self.segment(), overwrite=True)
            layer.bind_key("c", lambda *_: self.commit(), overwrite=True)
        points.bind_key(
            "t",
            lambda *_: self.status.setText(f"New points: {L.toggle_new_point_label(points)}"),
            overwrite=True,
        )

    def _on_prompt_change(self, event: Any) -> None:
        if self._muted or not self.auto.isChecked():
            return
        if str(getattr(event, "action", "added")) in ("added", "removed", "changed"):
            self.segment()

    # -- hover preview (latest wins) ----------------------------------------------------------
    def _on_mouse_move(self, layer: Any, event: Any) -> None:
        if self.hover_box.isChecked():
            self.hover_at(layer.world_to_data(event.position)[-2:])

    def hover_at(self, row_col: Any) -> None:
        """Preview the mask of a single click at (row, col) of the embedded slice; of many
        calls, only the newest answer is painted (the others are skipped or discarded)."""
        session = self.session
        if session is None or session.embedded is None or self.layers is None:
            return
        rows, cols = session.embedded.size
        row, col = float(row_col[0]), float(row_col[1])
        if not (0 <= row < rows and 0 <= col < cols):
            return
        prompt = Prompt(np.array([[col, row]]), np.array([1]))
        preview = self.layers.preview

        def show(mask: Any, error: BaseException | None) -> None:
            if error is not None:
                self._report("Preview", error)
            else:
                preview.data = mask.astype(np.uint32)

        self.hover.submit(lambda: session.segment(prompt), show)

    def closeEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        self.hover.close()
        self._jobs.shutdown(wait=False, cancel_futures=True)
        if self.session is not None:
            self.session.close()
        super().closeEvent(event)
