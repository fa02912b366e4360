"""Modules that moved into the stage folders keep their old import paths for one release."""

import importlib
import sys
import warnings

import pytest

from triton_sam._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_module_at_its_new_home_and_warns(old):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert any(MOVED[old] in m for m in messages), messages


def test_from_imports_through_an_old_path_give_the_same_objects():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from triton_sam.pipeline import build_repository as old
    from triton_sam.setup.pipeline import build_repository as new

    assert old is new


def test_every_new_home_exists_and_no_old_path_is_still_a_file():
    from pathlib import Path

    root = Path(importlib.import_module("triton_sam").__file__).parent
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        assert not (root.parent / (old.replace(".", "/") + ".py")).exists(), old


def test_an_unknown_module_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("triton_sam.no_such_module")
