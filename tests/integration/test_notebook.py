"""examples/quickstart.ipynb executes top to bottom (so it cannot rot), against the session's
embedded Triton (random-init SAM2.1-tiny) passed in through its environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def test_quickstart_notebook_executes(sam2_tiny_server, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("TRITON_SAM_HTTP_URL", sam2_tiny_server.http_url)
    monkeypatch.setenv("TRITON_SAM_GRPC_URL", sam2_tiny_server.grpc_url)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any error

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(figures) == 2  # the sync client's overlays, the drag's overlay
    assert sam2_tiny_server.grpc_url in text  # it used the test's server, not a new one
    assert "cancelled:" in text and "never sent" in text


def test_committed_notebook_has_no_outputs():
    """Outputs (random-weight masks, timings, ~1 MB of PNG) are regenerated, never committed."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
