"""The lock (requirements/lock*.txt) covers pyproject.toml, pins hashes, and is what installs.

A fresh install must get exactly what the tests ran against: every dependency of every extra
is in the lock at a version inside pyproject's range, every pin carries its sha256, the
Makefile installs from the lock with --require-hashes, and pixi pins the same versions.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
LOCKS = ("lock.txt", "lock-sam2.txt", "lock-tools.txt", "lock-micro-sam.txt")
# The interpreter and platform the lock is compiled for (Makefile LOCK_PYTHON/LOCK_PLATFORM).
LOCK_ENV = default_environment() | {
    "python_version": "3.11",
    "python_full_version": "3.11.7",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def parse_lock(text: str) -> dict[str, tuple[str, int]]:
    """``name -> (version, number of --hash entries)`` of a pip requirements lock."""
    pins: dict[str, tuple[str, int]] = {}
    current = None
    for line in text.splitlines():
        match = _PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            pins[current] = (match.group(2), 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
        elif line and not line.startswith(" "):
            current = None
    return pins


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def declared_requirements() -> list[Requirement]:
    """Every requirement of the package and of every extra, for the lock's platform."""
    project = pyproject()["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    requirements = [Requirement(line) for line in lines]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(LOCK_ENV)]


def missing_from_lock(
    requirements: list[Requirement], pins: dict[str, tuple[str, int]]
) -> list[str]:
    """Requirements the lock lacks, or pins at a version outside the requirement's range."""
    problems = []
    for requirement in requirements:
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is None:
            problems.append(f"{requirement.name}: not in the lock")
        elif not requirement.specifier.contains(pin[0], prereleases=True):
            problems.append(f"{requirement.name}=={pin[0]}: outside {requirement.specifier}")
    return problems


@pytest.fixture(scope="module")
def pins() -> dict[str, tuple[str, int]]:
    merged: dict[str, tuple[str, int]] = {}
    for name in ("lock.txt", "lock-sam2.txt"):
        merged |= parse_lock((REQUIREMENTS / name).read_text())
    return merged


def test_every_dependency_of_every_extra_is_locked_within_its_range(pins):
    assert missing_from_lock(declared_requirements(), pins) == []


def test_a_dependency_missing_from_the_lock_is_reported(pins):
    requirements = declared_requirements() + [Requirement("not-a-locked-package>=1")]
    assert missing_from_lock(requirements, pins) == ["not-a-locked-package: not in the lock"]
    torch = pins["torch"][0]
    assert missing_from_lock([Requirement(f"torch>{torch}")], pins) == [
        f"torch=={torch}: outside >{torch}"
    ]


def test_the_lock_inputs_beside_pyproject_are_locked(pins):
    for name in ("lock.in", "sam2.in"):
        lines = (REQUIREMENTS / name).read_text().splitlines()
        requirements = [Requirement(x) for x in lines if x.strip() and x[0] not in "#-"]
        assert missing_from_lock(requirements, pins) == [], name


@pytest.mark.parametrize("name", LOCKS)
def test_every_pin_carries_its_sha256(name):
    pins = parse_lock((REQUIREMENTS / name).read_text())
    assert pins, f"{name} pins nothing"
    assert [n for n, (_, hashes) in pins.items() if hashes == 0] == []


def test_the_lock_respects_its_constraints(pins):
    lines = (REQUIREMENTS / "constraints.txt").read_text().splitlines()
    constraints = [Requirement(x) for x in lines if x.strip() and not x.startswith("#")]
    assert constraints
    assert missing_from_lock(constraints, pins) == []


def test_the_makefile_installs_the_lock_with_hashes_and_no_resolution():
    makefile = (ROOT / "Makefile").read_text()
    install = makefile.split("$(STAMP):", 1)[1].split("\ninstall:", 1)[0]
    assert "--require-hashes --no-deps -r $(LOCK)" in install
    assert "--require-hashes --no-deps --no-build-isolation -r $(LOCK_SAM2)" in install
    # the project itself adds nothing: its dependencies all came from the lock
    assert "--no-deps --no-build-isolation -e ." in install
    assert "pip check" in install
    # nothing is installed from a name without a pin (e.g. `pip install torch`)
    pip_lines = [x for x in install.splitlines() if "$(PIP)" in x]
    assert all(("-r $(LOCK" in x) or x.rstrip().endswith("-e .") for x in pip_lines), pip_lines


def test_the_perf_analyzer_tools_come_from_their_lock():
    script = (ROOT / "scripts" / "install_perf_analyzer.sh").read_text()
    assert "--require-hashes -r" in script and "lock-tools.txt" in script


def test_pixi_pins_the_locked_versions(pins):
    pixi = pyproject()["tool"]["pixi"]["pypi-dependencies"]
    pinned = {
        canonicalize_name(name): spec
        for name, spec in pixi.items()
        if isinstance(spec, str) and spec.startswith("==")
    }
    # the packages whose version changes results or the server's behaviour
    for name in ("torch", "torchvision", "onnxruntime", "transformers", "sam2", "nvidia-pytriton"):
        assert name in pinned, f"pixi does not pin {name}"
    assert {n: s for n, s in pinned.items() if s != f"=={pins[n][0]}"} == {}
