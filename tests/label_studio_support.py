"""Label Studio's side of the ML backend protocol, as the tests replay it.

The request bodies are written from Label Studio's sources (HumanSignal/label-studio 1.23.2, as
installed from PyPI):

- ``label_studio/ml/api_connector.py``: ``MLApi.setup`` posts ``{"project": "<id>.<created_at
  timestamp>", "schema": label_config, "hostname", "access_token", "extra_params"}`` to
  ``setup``; ``_prep_prediction_req`` posts ``{"tasks", "project", "label_config", "params":
  {"login", "password", "context"}}`` to ``predict``; ``health`` GETs ``health``; every call
  joins the endpoint to the backend URL with ``urljoin(url + "/", ...)``, with HTTP Basic auth
  when the model's basic auth user and password are set (``BaseHTTPAPI._prepare_kwargs``);
- ``label_studio/ml/models.py`` ``interactive_annotating``: one task, serialized with its
  drafts, predictions and annotations, and the context the frontend sent;
- ``label_studio/ml/api.py`` ``MLBackendInteractiveAnnotating.post``: the context is the
  ``context`` field of ``POST /api/ml/<id>/interactive-annotating``.

The regions in the context are those the frontend sends for a smart keypoint and a smart
rectangle (HumanSignal/label-studio-ml-backend
``label_studio_ml/examples/segment_anything_2_image/model.py`` reads ``original_width``,
``original_height``, ``value.x``/``y``/``width``/``height`` in percent, ``is_positive``, ``type``
and ``value[type][0]``).

:class:`FakeLabelStudio` stands for Label Studio's file and task API: a local HTTP server that
serves uploaded images under ``/data/upload/...`` only to ``Authorization: Token <key>``,
``/api/projects/<id>`` and ``/api/tasks?project=<id>&page=&page_size=``.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import numpy as np
from PIL import Image

API_KEY = "5d4c3b2a19f8e7d6c5b4a39281706f5e4d3c2b1a"
BRUSH_CONFIG = """<View>
  <Image name="image" value="$image" zoom="true"/>
  <BrushLabels name="tag" toName="image">
    <Label value="Cell" background="#FF0000"/>
  </BrushLabels>
  <KeyPointLabels name="tag2" toName="image" smart="true">
    <Label value="Cell" smart="true" background="#000000" showInline="true"/>
  </KeyPointLabels>
  <RectangleLabels name="tag3" toName="image" smart="true">
    <Label value="Cell" background="#000000" showInline="true"/>
  </RectangleLabels>
</View>"""
POLYGON_CONFIG = BRUSH_CONFIG.replace("BrushLabels", "PolygonLabels")


def png(rgb: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, "PNG")
    return buffer.getvalue()


def basic(user: str, password: str) -> dict[str, str]:
    """The header requests' HTTPBasicAuth sends."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def setup_body(schema: str, project: int = 1) -> dict:
    return {
        "project": f"{project}.1764300000",
        "schema": schema,
        "hostname": "http://localhost:8080",
        "access_token": "f" * 40,  # the project creator's token: the backend must not use it
        "extra_params": None,
    }


def keypoint_region(x_px: float, y_px: float, w: int, h: int, positive: bool = True) -> dict:
    return {
        "original_width": w,
        "original_height": h,
        "image_rotation": 0,
        "value": {
            "x": 100 * x_px / w,
            "y": 100 * y_px / h,
            "width": 0.6,
            "keypointlabels": ["Cell"],
        },
        "is_positive": positive,
        "id": "Pk3Jv9",
        "from_name": "tag2",
        "to_name": "image",
        "type": "keypointlabels",
        "origin": "manual",
    }


def rectangle_region(box: tuple[float, float, float, float], w: int, h: int) -> dict:
    x0, y0, x1, y1 = box
    value = {
        "x": 100 * x0 / w,
        "y": 100 * y0 / h,
        "width": 100 * (x1 - x0) / w,
        "height": 100 * (y1 - y0) / h,
        "rotation": 0,
        "rectanglelabels": ["Cell"],
    }
    return {
        "original_width": w,
        "original_height": h,
        "image_rotation": 0,
        "value": value,
        "id": "Rb7Tq2",
        "from_name": "tag3",
        "to_name": "image",
        "type": "rectanglelabels",
        "origin": "manual",
    }


def predict_body(task: dict, label_config: str, context: dict | None) -> dict:
    """``MLApi._prep_prediction_req`` of one task (interactive: ``context`` set)."""
    return {
        "tasks": [task],
        "project": "1.1764300000",
        "label_config": label_config,
        "params": {"login": None, "password": None, "context": context},
    }


def task(task_id: int, image_url: str) -> dict:
    """A task as ``InteractiveAnnotatingDataSerializer`` gives it (the fields that matter)."""
    return {
        "id": task_id,
        "data": {"image": image_url},
        "meta": {},
        "created_at": "2026-11-28T03:00:00.000000Z",
        "updated_at": "2026-11-28T03:00:00.000000Z",
        "is_labeled": False,
        "overlap": 1,
        "inner_id": task_id,
        "total_annotations": 0,
        "cancelled_annotations": 0,
        "total_predictions": 0,
        "comment_count": 0,
        "unresolved_comment_count": 0,
        "last_comment_updated_at": None,
        "project": 1,
        "updated_by": None,
        "file_upload": None,
        "comment_authors": [],
        "annotations": [],
        "predictions": [],
        "drafts": [],
    }


class FakeLabelStudio(ThreadingHTTPServer):
    """Uploaded images and the task API of one project, behind the API key."""

    daemon_threads = True

    def __init__(self, images: dict[str, bytes], label_config: str = BRUSH_CONFIG) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.images, self.label_config = images, label_config
        self.image_gets: dict[str, int] = {}  # path -> GETs answered with the file
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def tasks(self) -> list[dict]:
        return [task(i + 1, path) for i, path in enumerate(sorted(self.images))]

    def __enter__(self) -> FakeLabelStudio:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FakeLabelStudio

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.headers.get("Authorization") != f"Token {API_KEY}":
            return self._send(401, b'{"detail": "Authentication credentials were not provided."}')
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if parts.path in self.server.images:
            gets = self.server.image_gets
            gets[parts.path] = gets.get(parts.path, 0) + 1
            return self._send(200, self.server.images[parts.path])
        if parts.path == "/api/projects/1":
            return self._json({"id": 1, "label_config": self.server.label_config})
        if parts.path == "/api/tasks" and query.get("project") == ["1"]:
            page, size = int(query["page"][0]), int(query["page_size"][0])
            tasks = self.server.tasks()[(page - 1) * size : page * size]
            if not tasks and page > 1:
                return self._send(404, b'{"detail": "Invalid page."}')
            return self._json({"tasks": tasks, "total": len(self.server.tasks())})
        return self._send(404, b"{}")

    def _json(self, body: object) -> None:
        self._send(200, json.dumps(body).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
