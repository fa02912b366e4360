"""Where the embedded server finds Triton's onnxruntime backend, and how it links it in.

No server here: the folder is faked (a file with an ELF header is all the checks look at);
tests/integration/test_onnxruntime_backend.py loads the real one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from triton_sam.errors import BackendNotFoundError, ServerStartError
from triton_sam.server import (
    ORT_BACKEND_ENV,
    ORT_BACKEND_LIBRARY,
    backends,
    find_onnxruntime_backend,
    onnxruntime_backend_candidates,
    required_backends,
)

ELF = b"\x7fELF" + bytes(60)


def _backend(folder: Path, *, stand_in: bool = False) -> Path:
    """A fake backend folder: the backend library and libonnxruntime.so.1 -> .so.1.2.3."""
    folder.mkdir(parents=True)
    (folder / ORT_BACKEND_LIBRARY).write_bytes(ELF)
    (folder / "libonnxruntime.so.1.2.3").write_bytes(ELF)
    for link, target in (("libonnxruntime.so.1", "libonnxruntime.so.1.2.3"),
                         ("libonnxruntime.so", "libonnxruntime.so.1")):  # fmt: skip
        if stand_in:  # a symlink flattened to a text file holding its target's name
            (folder / link).write_text(target)
        else:
            (folder / link).symlink_to(target)
    return folder


def test_an_explicit_folder_is_the_only_one_tried(tmp_path, monkeypatch):
    good = _backend(tmp_path / "good")
    monkeypatch.setenv(ORT_BACKEND_ENV, str(tmp_path / "elsewhere"))
    assert find_onnxruntime_backend(good) == good.resolve()
    with pytest.raises(BackendNotFoundError) as info:
        find_onnxruntime_backend(tmp_path / "missing")
    message = str(info.value)
    assert str(tmp_path / "missing") in message and str(good) not in message
    assert ORT_BACKEND_ENV in message and "make onnxruntime-backend" in message
    assert isinstance(info.value, ServerStartError)  # callers catching start errors see it


def test_the_environment_variable_is_the_only_one_tried(tmp_path, monkeypatch):
    good = _backend(tmp_path / "good")
    monkeypatch.setenv(ORT_BACKEND_ENV, str(good))
    assert find_onnxruntime_backend() == good.resolve()
    monkeypatch.setenv(ORT_BACKEND_ENV, str(tmp_path / "missing"))
    with pytest.raises(BackendNotFoundError, match=f"\\${ORT_BACKEND_ENV}"):
        find_onnxruntime_backend()


def test_default_locations_in_order(tmp_path, monkeypatch):
    monkeypatch.delenv(ORT_BACKEND_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    candidates = onnxruntime_backend_candidates()
    assert candidates[0] == Path(sys.prefix) / "tools/triton-onnxruntime-backend/onnxruntime"
    checkout = Path(backends.__file__).resolve().parents[2]
    shared = Path("shared/triton-onnxruntime-backend/onnxruntime")
    assert checkout.parent / shared in candidates  # ../shared beside the clone
    assert tmp_path / shared in candidates and tmp_path.parent / shared in candidates
    assert backends.MACHINE_ORT_BACKEND in candidates
    machine = "/work/shared/triton-onnxruntime-backend/onnxruntime"
    assert str(backends.MACHINE_ORT_BACKEND) == machine
    assert len(candidates) == len(set(candidates))


def test_the_first_default_location_holding_the_backend_wins(tmp_path, monkeypatch):
    monkeypatch.delenv(ORT_BACKEND_ENV, raising=False)
    second, third = _backend(tmp_path / "b"), _backend(tmp_path / "c")
    order = [tmp_path / "a", second, third]
    monkeypatch.setattr(backends, "onnxruntime_backend_candidates", lambda: order)
    assert find_onnxruntime_backend() == second.resolve()


def test_nothing_found_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv(ORT_BACKEND_ENV, raising=False)
    monkeypatch.setattr(backends, "onnxruntime_backend_candidates", lambda: [tmp_path / "a"])
    with pytest.raises(BackendNotFoundError) as info:
        find_onnxruntime_backend()
    message = str(info.value)
    assert str(tmp_path / "a") in message
    for advice in (ORT_BACKEND_ENV, "--onnxruntime-backend", "make onnxruntime-backend"):
        assert advice in message


@pytest.mark.parametrize("stand_in", [False, True])
def test_linking_resolves_symlinks_stored_as_text(tmp_path, stand_in):
    source = _backend(tmp_path / "backend", stand_in=stand_in)
    dest = tmp_path / "backends" / "onnxruntime"
    backends.link_backend(source, dest)
    for name in ("libonnxruntime.so.1", "libonnxruntime.so"):  # a chain of two
        link = dest / name
        assert link.is_symlink()
        assert link.resolve() == (source / "libonnxruntime.so.1.2.3").resolve()
    assert (dest / ORT_BACKEND_LIBRARY).read_bytes() == ELF


def test_linking_refuses_a_library_that_is_not_one(tmp_path):
    source = _backend(tmp_path / "backend")
    (source / "libonnxruntime.so").unlink()
    (source / "libonnxruntime.so").write_text("libmissing.so.1")  # names no file here
    with pytest.raises(BackendNotFoundError, match="libonnxruntime.so: not a shared library"):
        backends.link_backend(source, tmp_path / "dest")


def test_required_backends_are_read_from_the_configs(tmp_path):
    for name, text in {
        "a": 'name: "a"\nplatform: "onnxruntime_onnx"\n',
        "b": 'name: "b"\nbackend: "python"\n',
        ".hidden": 'name: ".hidden"\nbackend: "tensorrt"\n',
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(text)
    assert required_backends(tmp_path) == {"onnxruntime", "python"}
