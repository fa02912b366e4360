"""Checkpoint download and integrity, against a local HTTP server on 127.0.0.1 (no internet).

The server serves one random body at ``/ckpt.pt``, honours ``Range: bytes=<start>-`` and has
switches to ignore Range, serve a corrupted body, or close the connection after N bytes.
It records every request so that tests can assert what was (not) asked.
"""

from __future__ import annotations

import hashlib
import http.server
import logging
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from triton_sam.errors import CheckpointError, ConfigError, DownloadError, IntegrityError
from triton_sam.models import download
from triton_sam.models.checkpoints import (
    checkpoint_path,
    checkpoint_sha256,
    describe_user_checkpoint,
    download_checkpoint,
    resolve_checkpoint,
    sha256_file,
    sidecar_path,
    verify_checkpoint,
)
from triton_sam.models.spec import Checkpoint

BODY = os.urandom(300_000)  # not a multiple of the chunk size, on purpose
BODY_SHA = hashlib.sha256(BODY).hexdigest()
CHUNK = 16 * 1024


@dataclass
class FakeServer:
    """State and switches of the test server (read by the handler thread)."""

    url: str = ""
    body: bytes = BODY
    ignore_range: bool = False
    corrupt: bool = False
    drop_after: int | None = None  # bytes of body sent per response before closing
    status: int | None = None  # force an error status
    requests: list[str | None] = field(default_factory=list)  # Range header of each GET
    bytes_sent: int = 0


def _handler(state: FakeServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (stdlib name)
            rng = self.headers.get("Range")
            state.requests.append(rng)
            if state.status is not None:
                self.send_error(state.status)
                return
            body = bytearray(state.body)
            if state.corrupt:
                body[len(body) // 2] ^= 0xFF
            start = 0
            match = re.fullmatch(r"bytes=(\d+)-", rng or "")
            if match and not state.ignore_range:
                start = int(match.group(1))
                if start >= len(body):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            payload = bytes(body[start:])
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if state.drop_after is not None:
                payload = payload[: state.drop_after]
            self.wfile.write(payload)
            state.bytes_sent += len(payload)
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def server() -> Iterator[FakeServer]:
    state = FakeServer()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/ckpt.pt"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download, "_RETRY_BACKOFF_S", 0.0)


def _ckpt(server: FakeServer, **kw: str | None) -> Checkpoint:
    return Checkpoint(url=server.url, filename="ckpt.pt", **kw)


def _download(ckpt: Checkpoint, dest: Path, **kw: object) -> Path:
    return download_checkpoint(ckpt, dest, progress=False, timeout_s=5.0, chunk_bytes=CHUNK, **kw)


def _part(dest: Path) -> Path:
    return dest / "ckpt.pt.part"


# --- download ---------------------------------------------------------------------------


def test_fresh_download_verifies_and_records_the_hash(server, tmp_path):
    path = _download(_ckpt(server), tmp_path)
    assert path == tmp_path / "ckpt.pt"
    assert path.read_bytes() == BODY
    assert server.requests == [None]
    # trust on first use: sha256sum format, so `sha256sum -c` works too
    assert sidecar_path(path).read_text() == f"{BODY_SHA}  ckpt.pt\n"
    assert not _part(tmp_path).exists()


def test_second_call_skips_the_network(server, tmp_path):
    _download(_ckpt(server), tmp_path)
    path = _download(_ckpt(server), tmp_path)
    assert len(server.requests) == 1
    assert sha256_file(path) == BODY_SHA


def test_partial_file_is_resumed_with_a_range_request(server, tmp_path):
    _part(tmp_path).write_bytes(BODY[:100_000])
    path = _download(_ckpt(server), tmp_path)
    assert server.requests == ["bytes=100000-"]
    assert server.bytes_sent == len(BODY) - 100_000
    assert sha256_file(path) == BODY_SHA
    assert not _part(tmp_path).exists()


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    server.ignore_range = True
    _part(tmp_path).write_bytes(BODY[:100_000])
    path = _download(_ckpt(server), tmp_path, retries=0)
    assert server.requests == ["bytes=100000-"]
    assert path.read_bytes() == BODY  # not the prefix twice


def test_complete_partial_file_answered_416_is_verified_and_placed(server, tmp_path):
    _part(tmp_path).write_bytes(BODY)
    path = _download(_ckpt(server, sha256=BODY_SHA), tmp_path)
    assert server.requests == [f"bytes={len(BODY)}-"]
    assert server.bytes_sent == 0
    assert path.read_bytes() == BODY


def test_oversized_partial_file_is_discarded_not_trusted(server, tmp_path):
    _part(tmp_path).write_bytes(BODY + b"junk")
    path = _download(_ckpt(server), tmp_path)
    assert path.read_bytes() == BODY
    assert sidecar_path(path).read_text().split()[0] == BODY_SHA


def test_corrupted_download_raises_and_leaves_no_file(server, tmp_path):
    server.corrupt = True
    with pytest.raises(IntegrityError, match=BODY_SHA):
        _download(_ckpt(server, sha256=BODY_SHA), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_published_sha256_mismatch_names_expected_and_actual(server, tmp_path):
    wrong = "0" * 64
    with pytest.raises(IntegrityError) as err:
        _download(_ckpt(server, sha256=wrong), tmp_path)
    assert wrong in str(err.value) and BODY_SHA in str(err.value)
    assert "checkpoint.sha256" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_published_prefix_is_checked(server, tmp_path):
    bad_prefix = "0" * 8 if not BODY_SHA.startswith("0" * 8) else "f" * 8
    with pytest.raises(IntegrityError, match="sha256_prefix"):
        _download(_ckpt(server, sha256_prefix=bad_prefix), tmp_path)
    assert list(tmp_path.iterdir()) == []
    path = _download(_ckpt(server, sha256_prefix=BODY_SHA[:8].upper()), tmp_path)
    assert path.read_bytes() == BODY
    # a prefix is no full hash: the full one is recorded too
    assert sidecar_path(path).read_text().split()[0] == BODY_SHA


def test_download_is_checked_against_the_recorded_hash(server, tmp_path):
    _download(_ckpt(server), tmp_path)
    (tmp_path / "ckpt.pt").unlink()
    server.corrupt = True
    with pytest.raises(IntegrityError, match="recorded at first download"):
        _download(_ckpt(server), tmp_path)
    assert not (tmp_path / "ckpt.pt").exists()
    assert not _part(tmp_path).exists()


def test_corrupt_file_in_place_is_replaced_by_a_fresh_download(server, tmp_path):
    path = _download(_ckpt(server), tmp_path)
    path.write_bytes(b"bit rot")
    assert _download(_ckpt(server), tmp_path).read_bytes() == BODY
    assert len(server.requests) == 2


def test_connection_refused_says_where_to_put_the_file(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ckpt = Checkpoint(url=f"http://127.0.0.1:{port}/ckpt.pt", filename="ckpt.pt")
    with pytest.raises(DownloadError) as err:
        download_checkpoint(ckpt, tmp_path, progress=False, timeout_s=5.0)
    message = str(err.value)
    assert "could not reach" in message
    assert str(tmp_path / "ckpt.pt") in message
    assert "--random-init" in message
    assert "object at 0x" not in message  # no urllib3 reprs in a user-facing message


def test_http_error_status_is_a_download_error(server, tmp_path):
    server.status = 404
    with pytest.raises(DownloadError, match="HTTP 404"):
        _download(_ckpt(server), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_download_leaves_only_the_part_file(server, tmp_path):
    server.drop_after = 120_000
    with pytest.raises(DownloadError, match="interrupted") as err:
        _download(_ckpt(server), tmp_path, retries=0)
    assert str(_part(tmp_path)) in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt.part"]
    # what was kept is a clean prefix (urllib3 drops the chunk that broke mid-read)
    kept = _part(tmp_path).stat().st_size
    assert 0 < kept <= 120_000
    assert _part(tmp_path).read_bytes() == BODY[:kept]
    # the next run resumes where this one stopped
    server.drop_after = None
    assert _download(_ckpt(server), tmp_path).read_bytes() == BODY
    assert server.requests[-1] == f"bytes={kept}-"


def test_interruptions_are_resumed_automatically(server, tmp_path):
    server.drop_after = 120_000  # every response breaks after 120 kB
    path = _download(_ckpt(server), tmp_path, retries=5)
    assert server.requests[0] is None
    assert len(server.requests) >= 3
    assert all(r and r.startswith("bytes=") for r in server.requests[1:])
    assert sha256_file(path) == BODY_SHA


def test_retries_are_bounded(server, tmp_path):
    server.drop_after = 1_000
    with pytest.raises(DownloadError, match="interrupted"):
        _download(_ckpt(server), tmp_path, retries=2)
    assert len(server.requests) == 3


# --- verification of local files -----------------------------------------------------------


def test_verify_records_on_first_use_then_detects_changes(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(BODY)
    ckpt = Checkpoint(url="http://unused.invalid/ckpt.pt", filename="ckpt.pt")
    assert verify_checkpoint(ckpt, path) == BODY_SHA
    assert sidecar_path(path).is_file()
    path.write_bytes(BODY[:-1] + bytes([BODY[-1] ^ 0xFF]))  # a changed byte, whatever it was
    with pytest.raises(IntegrityError, match=BODY_SHA):
        verify_checkpoint(ckpt, path)


def test_verify_rejects_a_garbled_record(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(BODY)
    sidecar_path(path).write_text("not a hash\n")
    ckpt = Checkpoint(url="http://unused.invalid/ckpt.pt", filename="ckpt.pt")
    with pytest.raises(CheckpointError, match="delete it"):
        verify_checkpoint(ckpt, path)


def test_sha256_file_reads_in_chunks(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(BODY)
    assert sha256_file(path, chunk_bytes=7) == BODY_SHA


def test_resolve_user_path_must_exist(tmp_path):
    ckpt = Checkpoint(url="http://unused.invalid/ckpt.pt", filename="ckpt.pt")
    missing = tmp_path / "mine.pt"
    with pytest.raises(CheckpointError, match=re.escape(str(missing))):
        resolve_checkpoint(ckpt, missing, tmp_path / "checkpoints")


def test_a_user_file_that_is_not_the_published_one_is_accepted_as_fine_tuned(tmp_path, caplog):
    mine = tmp_path / "mine.pt"
    mine.write_bytes(BODY)
    published = Checkpoint(url="http://unused.invalid/x", filename="ckpt.pt", sha256="1" * 64)
    with caplog.at_level(logging.INFO, logger="triton_sam.models.checkpoints"):
        assert resolve_checkpoint(published, mine, tmp_path / "checkpoints") == mine
    assert BODY_SHA in caplog.text and "fine-tuned" in caplog.text
    assert "download" not in caplog.text  # never advice to replace the user's own file
    tofu = Checkpoint(url="http://unused.invalid/x", filename="ckpt.pt")
    resolve_checkpoint(tofu, mine, tmp_path / "checkpoints")
    assert not sidecar_path(mine).exists()  # nothing written next to a user's file


def test_a_user_file_that_is_the_published_one_is_said_so(tmp_path, caplog):
    mine = tmp_path / "mine.pt"
    mine.write_bytes(BODY)
    good = Checkpoint(url="http://unused.invalid/x", filename="ckpt.pt", sha256=BODY_SHA)
    with caplog.at_level(logging.INFO, logger="triton_sam.models.checkpoints"):
        assert resolve_checkpoint(good, mine, tmp_path / "checkpoints") == mine
    assert "is the published ckpt.pt" in caplog.text
    assert describe_user_checkpoint(good, mine) == (BODY_SHA, True)


def test_the_default_path_stays_verified_even_when_named_explicitly(tmp_path):
    bad = Checkpoint(url="http://unused.invalid/x", filename="ckpt.pt", sha256="1" * 64)
    default = checkpoint_path(bad, tmp_path)
    default.write_bytes(BODY)
    with pytest.raises(IntegrityError):
        resolve_checkpoint(bad, None, tmp_path)
    with pytest.raises(IntegrityError):
        resolve_checkpoint(bad, default, tmp_path)


def test_a_model_directory_hash_covers_its_files_and_names(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(BODY)
    first = checkpoint_sha256(folder)
    (folder / "model.safetensors").write_bytes(BODY + b"x")
    second = checkpoint_sha256(folder)
    (folder / "model.safetensors").rename(folder / "other.safetensors")
    assert len({first, second, checkpoint_sha256(folder)}) == 3
    assert checkpoint_sha256(folder / "config.json") == sha256_file(folder / "config.json")


def test_resolve_default_path_missing_suggests_download_or_random_init(tmp_path):
    ckpt = Checkpoint(url="http://unused.invalid/ckpt.pt", filename="ckpt.pt")
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(ckpt, None, tmp_path)
    assert str(tmp_path / "ckpt.pt") in str(err.value)
    assert "--random-init" in str(err.value)


def test_resolve_accepts_a_model_spec(tmp_path):
    from triton_sam.models import get_model

    spec = get_model("sam2.1_hiera_tiny")
    path = checkpoint_path(spec.checkpoint, tmp_path)
    path.write_bytes(BODY)
    assert resolve_checkpoint(spec, None, tmp_path) == path


@pytest.mark.parametrize("name", ["", "..", "../evil.pt", "sub/ckpt.pt"])
def test_filename_must_not_escape_the_directory(tmp_path, name):
    with pytest.raises(ConfigError, match="checkpoint.filename"):
        checkpoint_path(Checkpoint(url="http://unused.invalid/x", filename=name), tmp_path)


# -- the demo: real weights when it can download them, random weights loudly when not ---------
def _demo_spec(url: str, sha256: str | None = None):
    import dataclasses

    from triton_sam.models import get_model

    spec = get_model("sam2.1_hiera_tiny")
    checkpoint = dataclasses.replace(spec.checkpoint, url=url, sha256=sha256)
    return dataclasses.replace(spec, checkpoint=checkpoint)


def test_demo_downloads_the_checkpoint_when_it_can(server, tmp_path, caplog):
    from triton_sam.tools.demo import demo_checkpoint

    spec = _demo_spec(server.url)
    dest = tmp_path / "checkpoints"
    path = demo_checkpoint(spec, dest, download=True)
    assert path == dest / spec.checkpoint.filename and path.read_bytes() == BODY
    assert sidecar_path(path).read_text().split()[0] == BODY_SHA  # recorded at first download
    # the next run uses the verified file and does not download again
    with caplog.at_level(logging.WARNING):
        assert demo_checkpoint(spec, dest, download=True) == path
    assert len(server.requests) == 1 and "RANDOM" not in caplog.text


def test_demo_falls_back_to_random_weights_loudly_when_offline(tmp_path, caplog):
    from triton_sam.tools.demo import demo_checkpoint

    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = _demo_spec(f"http://127.0.0.1:{port}/sam2.1_hiera_tiny.pt")
    with caplog.at_level(logging.WARNING):
        assert demo_checkpoint(spec, tmp_path, download=True) is None
    assert "RANDOM WEIGHTS" in caplog.text and "could not reach" in caplog.text
    assert not (tmp_path / spec.checkpoint.filename).exists()


def test_demo_refuses_a_download_that_fails_its_hash(server, tmp_path, caplog):
    from triton_sam.tools.demo import demo_checkpoint

    spec = _demo_spec(server.url, sha256="1" * 64)
    with caplog.at_level(logging.WARNING):
        assert demo_checkpoint(spec, tmp_path, download=True) is None
    assert "RANDOM WEIGHTS" in caplog.text and "checkpoint.sha256" in caplog.text
    assert list(tmp_path.iterdir()) == []  # nothing half-written or unverified is kept


def test_demo_without_download_never_touches_the_network(server, tmp_path):
    from triton_sam.tools.demo import demo_checkpoint

    assert demo_checkpoint(_demo_spec(server.url), tmp_path, download=False) is None
    assert server.requests == []
