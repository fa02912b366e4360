"""No unpickling of untrusted data anywhere in the package, checked on its source.

Checkpoints come from the internet and model repositories may be shared: every load of
torch/numpy/yaml data must be one that cannot run code, and nothing may eval/exec strings.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "triton_sam"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    """Every call in ``path`` as (dotted name of the callee, node)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            out.append((_name(node.func), node))
    return out


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{_name(func.value)}.{func.attr}"
    return ""


def _keyword(call: ast.Call, name: str) -> object:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else kw.value
    return None


def _where(path: Path, call: ast.Call) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{call.lineno}"


def test_the_scan_sees_the_package():
    assert len(SOURCES) > 20
    names = {name for path in SOURCES for name, _ in _calls(path)}
    assert "torch.load" in names  # the one checkpoint loader is found, so the scan works


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_unsafe_deserialisation_or_eval(path):
    problems = []
    for name, call in _calls(path):
        last = name.rsplit(".", 1)[-1]
        if name in ("pickle.load", "pickle.loads", "cPickle.load", "dill.load", "marshal.loads"):
            problems.append(f"{_where(path, call)}: {name} can run arbitrary code")
        if name == "torch.load" and _keyword(call, "weights_only") is not True:
            problems.append(f"{_where(path, call)}: torch.load without weights_only=True")
        if name in ("np.load", "numpy.load") and _keyword(call, "allow_pickle") not in (
            None,
            False,
        ):
            problems.append(f"{_where(path, call)}: np.load with allow_pickle")
        if name in ("yaml.load", "yaml.load_all", "yaml.unsafe_load", "yaml.full_load"):
            loader = _keyword(call, "Loader")
            if name != "yaml.load" or not (
                isinstance(loader, ast.Attribute) and "Safe" in loader.attr
            ):
                problems.append(f"{_where(path, call)}: {name} without SafeLoader")
        if name in ("eval", "exec") or (last in ("eval", "exec") and name.startswith("builtins")):
            problems.append(f"{_where(path, call)}: {name}() of a string")
    assert not problems, "\n".join(problems)


def test_no_pickle_imports():
    pattern = re.compile(r"^\s*(import|from)\s+(c?pickle|dill|marshal)\b", re.MULTILINE)
    offenders = [str(p) for p in SOURCES if pattern.search(p.read_text())]
    assert not offenders
