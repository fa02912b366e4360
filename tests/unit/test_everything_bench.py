"""The segment-everything bench's timing loop (no models: runners are stand-ins)."""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.bench import everything as bench


def test_rows_interleave_and_ratio() -> None:
    """A simulated clock (each runner advances it by its own cost) makes the ratio exact: a
    busy-wait on the wall clock flaked on a loaded 2-core CI machine."""
    calls: list[str] = []
    now = [0.0]

    def runner(name: str, cost: float):
        def run(image):
            calls.append(name)
            now[0] += cost
            return [1] * (3 if name == "a" else 2)

        return run

    rows = bench.bench_rows(
        {"a": runner("a", 0.02), "b": runner("b", 0.005)},
        np.zeros((4, 4, 3)),
        repeats=2,
        clock=lambda: now[0],
    )
    assert calls == ["a", "b"] * 3  # warm-up, then alternating
    assert [r.name for r in rows] == ["a", "b"]
    assert [r.instances for r in rows] == [3, 2]
    assert [r.seconds for r in rows] == [pytest.approx([0.02] * 2), pytest.approx([0.005] * 2)]
    assert rows[0].speedup == 1.0 and rows[1].speedup == pytest.approx(4.0)
    assert rows[1].median_s == pytest.approx(0.005)


def test_help_fits(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        bench.main(["--help"])
    assert info.value.code == 0
    assert len(capsys.readouterr().out.splitlines()) < 30
