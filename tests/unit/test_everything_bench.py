"""The segment-everything bench's timing loop (no models: runners are stand-ins)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from triton_sam.bench import everything as bench


def test_rows_interleave_and_ratio() -> None:
    calls: list[str] = []

    def runner(name: str, delay: float):
        def run(image):
            calls.append(name)
            start = time.perf_counter()
            while time.perf_counter() - start < delay:
                pass
            return [1] * (3 if name == "a" else 2)

        return run

    rows = bench.bench_rows(
        {"a": runner("a", 0.02), "b": runner("b", 0.005)}, np.zeros((4, 4, 3)), repeats=2
    )
    assert calls == ["a", "b"] * 3  # warm-up, then alternating
    assert [r.name for r in rows] == ["a", "b"]
    assert [r.instances for r in rows] == [3, 2]
    assert rows[0].speedup == 1.0 and rows[1].speedup > 1.5


def test_help_fits(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        bench.main(["--help"])
    assert info.value.code == 0
    assert len(capsys.readouterr().out.splitlines()) < 30
