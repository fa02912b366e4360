"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def serve_arguments(monkeypatch):
    """``serve(**options)``: run ``triton-sam serve``'s command with those options and return
    the keyword arguments it would start the embedded server with (no server starts)."""
    from triton_sam import server
    from triton_sam.cli.serve import serve_cmd
    from triton_sam.repository import writer

    class Stop(Exception):
        pass

    def serve(**options) -> dict:
        seen = {}

        def fake_server(repo, **kwargs):
            seen.update(kwargs)
            raise Stop

        monkeypatch.setattr(server, "EmbeddedTriton", fake_server)
        monkeypatch.setattr(writer, "embedded_repository", lambda repo, **_: repo)
        with pytest.raises(Stop):
            serve_cmd(**options)
        return seen

    return serve
