"""The screenshot of Label Studio's labeling page with the backend's mask, for the docs
(docs/images/label-studio.png), taken by tests/integration/test_label_studio.py when
``TRITON_SAM_SCREENSHOTS=1``: the mask is saved as the task's annotation through Label Studio's
API, then Debian's headless Chromium logs in and opens the task in the data manager."""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path

import requests
from browser_support import chromium, js
from PIL import Image

MAX_BYTES = 300 * 1024
WAIT_S = 60


def save_labeling_page(
    url: str, token: str, user: str, password: str, project: int, task: int, region: dict,
    root: Path,
) -> Path:  # fmt: skip
    """Annotate ``task`` with ``region`` and save the labeling page as a PNG under ``root``."""
    answer = requests.post(
        f"{url}/api/tasks/{task}/annotations",
        json={"result": [region]},
        headers={"Authorization": f"Token {token}"},
        timeout=60,
    )
    assert answer.status_code == 201, answer.text
    out = root / "docs" / "images" / "label-studio.png"
    with chromium(Path(tempfile.mkdtemp())) as browser:
        browser.set_window_size(1280, 760)
        browser.get(f"{url}/user/login/")
        browser.find_element("name", "email").send_keys(user)
        browser.find_element("name", "password").send_keys(password)
        browser.find_element("css selector", "form button[type=submit], form [type=submit]").click()
        _wait(browser, "!location.pathname.startsWith('/user/login')", "the login")
        browser.get(f"{url}/projects/{project}/data?task={task}")
        # the labeling view is drawn when its image has loaded and the brush layer exists
        _wait(browser, "document.querySelectorAll('canvas').length >= 2", "the labeling canvas")
        time.sleep(3)  # Konva draws the brush region after the image's own layer
        png = browser.get_screenshot_as_png()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    buffer = io.BytesIO()
    image.quantize(colors=128).save(buffer, "PNG", optimize=True)
    assert len(buffer.getvalue()) < MAX_BYTES, len(buffer.getvalue())
    out.write_bytes(buffer.getvalue())
    return out


def _wait(browser, condition: str, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not js(browser, f"return {condition}"):
        assert time.monotonic() < deadline, f"Label Studio never showed {what}"
        time.sleep(0.1)
