"""What a python model ships beside its model.py is derived from its imports."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from triton_sam.repository import shipping
from triton_sam.serving.protocol import SHIPPED_PACKAGE

MODELS = sorted(p.name for p in shipping.SERVING_DIR.glob("*_model.py"))


def _imported_names(path):
    """Every serving module a file names in an import (the oracle: read independently)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for root in (SHIPPED_PACKAGE, "triton_sam.serving"):
                if node.module == root or node.module.startswith(root + "."):
                    base = node.module[len(root) :].lstrip(".").replace(".", "/")
                    names |= {f"{base}/{a.name}".lstrip("/") for a in node.names}
    return names


@pytest.mark.parametrize("model", MODELS)
def test_every_module_a_model_imports_is_shipped_and_nothing_outside_serving(model):
    source = shipping.SERVING_DIR / model
    files = shipping.shipped_files(source)
    modules = set(shipping.imported_modules(source))
    assert files and all(p.is_file() for p in files.values())
    assert all(p.resolve().is_relative_to(shipping.SERVING_DIR) for p in files.values())
    assert all(k.startswith(f"{SHIPPED_PACKAGE}/") for k in files)
    assert "__init__" in modules
    for name in _imported_names(source):
        is_module = (shipping.SERVING_DIR / f"{name}.py").is_file()
        is_package = (shipping.SERVING_DIR / name / "__init__.py").is_file()
        if is_module or is_package:
            assert (name if is_module else f"{name}/__init__") in modules, name
    for module in modules:  # each package on the way ships its __init__
        parts = module.split("/")[:-1]
        assert all("/".join([*parts[:i], "__init__"]) in modules for i in range(len(parts)))


def test_imports_inside_functions_and_relative_imports_are_followed():
    modules = shipping.imported_modules(shipping.SERVING_DIR / "everything_model.py")
    assert "rules" in modules  # intake -> from . import rules
    assert "session_call" in modules and "protocol/tenancy" in modules
    assert "embedding_cache_model" not in modules and "tracking/__init__" not in modules


def test_a_shipped_model_imports_in_a_bare_interpreter(tmp_path):
    """The shipped files alone (no triton_sam on the path) import what the model imports."""
    source = shipping.SERVING_DIR / "concept_model.py"
    for name, path in shipping.shipped_files(source).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(path.read_text())
    imports = [
        ast.unparse(node)
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.ImportFrom) and node.module.startswith(SHIPPED_PACKAGE)
    ]
    code = "import sys; sys.path.insert(0, sys.argv[1]);" + ";".join(imports)
    subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path)], check=True)
