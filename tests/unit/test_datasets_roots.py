"""Data roots (serving/datasets/roots.py) and format detection (serving/datasets/formats.py).

The server reads only under the roots its operator configures; every path that could read
elsewhere (absolute, ``..``, a link out, another tenant's root, an unknown root) is refused
naming the field, and a root hidden from a tenant is refused exactly as one that does not
exist. Anything that is not zarr, N5 or TIFF is refused before a reader parses it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from triton_sam.serving.bounds import RequestError
from triton_sam.serving.datasets import DataRoots, formats, open_source


@pytest.fixture
def roots(tmp_path):
    for name in ("em", "lm", "secret"):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "sub" / "a.tif").write_bytes(b"II*\0")
    (tmp_path / "secret.txt").write_text("outside every root")
    (tmp_path / "em" / "out").symlink_to(tmp_path / "secret")
    (tmp_path / "em" / "file-out").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "em" / "in").symlink_to(tmp_path / "em" / "sub")
    config = {
        "em": {"path": str(tmp_path / "em"), "tenants": ["alice", "bob"]},
        "lm": {"path": str(tmp_path / "lm")},
        "secret": {"path": str(tmp_path / "secret"), "tenants": ["carol"]},
    }
    return DataRoots.from_json(json.dumps(config))


def test_a_dataset_resolves_to_its_real_path_under_its_root(roots, tmp_path):
    assert roots.resolve("em/sub/a.tif", "alice") == tmp_path / "em" / "sub" / "a.tif"
    assert roots.resolve("em/in/a.tif", "bob") == tmp_path / "em" / "sub" / "a.tif"
    assert roots.resolve("lm/sub", "anyone") == tmp_path / "lm" / "sub"
    assert roots.names("alice") == ["em", "lm"]
    assert roots.names("carol") == ["lm", "secret"]
    assert roots.names("") == ["lm"]


@pytest.mark.parametrize(
    ("dataset", "problem"),
    [
        ("/etc/passwd", "an absolute path"),
        ("em/../secret/sub/a.tif", "'..' or '.' parts"),
        ("em/sub/../../secret", "'..' or '.' parts"),
        ("em/./sub", "'..' or '.' parts"),
        ("em//sub", "empty parts"),
        ("em/sub/", "empty parts"),
        ("em", "empty parts"),
        ("em/sub\0/a.tif", "a NUL character"),
        ("em/sub\\a.tif", "a backslash"),
    ],
)
def test_paths_that_could_leave_a_root_are_refused(roots, dataset, problem):
    with pytest.raises(RequestError, match=rf"^request\.dataset: got .*which has {problem}"):
        roots.resolve(dataset, "alice")


def test_links_out_of_the_root_are_refused(roots):
    for dataset in ("em/out/sub/a.tif", "em/file-out", "em/out"):
        with pytest.raises(RequestError, match=r"leaves its data root"):
            roots.resolve(dataset, "alice")


def test_another_tenants_root_is_refused_as_an_unknown_one(roots):
    with pytest.raises(RequestError) as hidden:
        roots.resolve("secret/sub/a.tif", "alice")
    with pytest.raises(RequestError) as unknown:
        roots.resolve("nowhere/sub/a.tif", "alice")
    assert str(hidden.value).replace("secret", "X") == str(unknown.value).replace("nowhere", "X")
    assert str(hidden.value) == ("request.dataset: no data root 'secret' (your data roots: em, lm)")
    assert roots.resolve("secret/sub/a.tif", "carol").name == "a.tif"


def test_a_missing_path_and_a_custom_field(roots):
    with pytest.raises(RequestError, match=r"^dataset: no dataset 'em/sub/b.tif'"):
        roots.resolve("em/sub/b.tif", "alice", field="dataset")
    with pytest.raises(RequestError, match=r"^request\.dataset: no dataset 'em/sub/aaa"):
        roots.resolve("em/sub/" + "a" * 300, "alice")  # ENAMETOOLONG: refused, not raised


def test_no_roots_configured_opens_nothing():
    roots = DataRoots.from_json("")
    assert roots.names("alice") == []
    with pytest.raises(RequestError, match=r"your data roots: none are configured for you"):
        roots.resolve("em/a.tif", "alice")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[]", "expected"),
        ('{"a/b": {"path": "/x"}}', "expected a word without '/'"),
        ('{"a": {"path": "rel"}}', "is not absolute"),
        ('{"a": "/x"}', "expected"),
        ('{"a": {"path": "/x", "tenants": "alice"}}', "tenants must be a list"),
        ('{"a": {"path": "/x", "users": []}}', "unknown keys"),
    ],
)
def test_malformed_configuration_is_refused(text, message):
    with pytest.raises(RequestError, match=rf"^data_roots: .*{message}"):
        DataRoots.from_json(text)


def test_unknown_formats_are_refused_naming_the_field(tmp_path):
    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    (tmp_path / "a.txt").write_text("pixels")
    (tmp_path / "empty.tif").write_bytes(b"")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.tif").write_bytes(b"II*\0")
    for name in ("a.png", "a.txt", "empty.tif"):
        with pytest.raises(RequestError, match=r"^request\.dataset: a file of an unknown format"):
            open_source(tmp_path / name)
    with pytest.raises(RequestError, match=r"^image: a folder with no zarr or N5 metadata"):
        open_source(tmp_path / "folder", field="image")
    with pytest.raises(RequestError, match=r"^request\.dataset: no such dataset"):
        open_source(tmp_path / "missing")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(RequestError, match=r"^request\.dataset: neither a file nor a folder"):
        open_source(tmp_path / "fifo")


def test_an_unreadable_file_is_refused_without_its_path(tmp_path, monkeypatch):
    (tmp_path / "a.tif").write_bytes(b"II*\0")

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(formats, "is_tiff", denied)  # root reads any file: simulate a denial
    with pytest.raises(RequestError) as refused:
        open_source(tmp_path / "a.tif")
    assert str(refused.value) == "request.dataset: cannot be read (Permission denied)"


def test_a_broken_file_with_a_tiff_header_is_refused(tmp_path):
    (tmp_path / "broken.tif").write_bytes(b"II*\0" + np.arange(8, dtype=np.uint8).tobytes())
    with pytest.raises(RequestError, match=r"^request\.dataset: not a readable TIFF"):
        open_source(tmp_path / "broken.tif")
