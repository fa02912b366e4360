"""The replicas benchmark's pure parts: options, click scripts, run comparison (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.bench.replicas import ReplicaBenchOptions, SessionRun, click_script, compare_runs
from triton_sam.errors import InputValidationError


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sessions": 0}, "sessions"),
        ({"clicks": 1.5}, "clicks"),
        ({"kill_after": 1.0}, "kill_after"),
        ({"replicas": 1}, "replicas"),  # nothing to fail over to
    ],
)
def test_options_refuse_bad_fields(kwargs, field):
    with pytest.raises(InputValidationError, match=field):
        ReplicaBenchOptions(**kwargs)


def test_one_replica_is_fine_without_a_kill():
    assert ReplicaBenchOptions(replicas=1, kill_after=0.0).replicas == 1


def test_click_scripts_are_deterministic_inside_the_image_and_refine():
    a, b = click_script(3, 6, (240, 320)), click_script(3, 6, (240, 320))
    assert a == b and a != click_script(4, 6, (240, 320))
    assert any(p.get("refine") for p in a) and any("box" in p for p in a)
    for prompt in a:
        for x, y in prompt.get("point_coords", []):
            assert 0 <= x < 320 and 0 <= y < 240


def _run(masks, scores):
    return SessionRun(image=0, masks=masks, scores=scores)


def test_compare_runs_counts_differing_and_failed_clicks():
    m = np.zeros((4, 4), bool)
    flipped = m.copy()
    flipped[0, 0] = True
    s = np.array([0.5], np.float32)
    reference = [_run([m, m, m], [s, s, s])]
    assert compare_runs([_run([m, m, m], [s, s, s + 1e-7])], reference) == (
        0,
        pytest.approx(1e-7, rel=0.5),
    )
    assert compare_runs([_run([m, flipped, None], [s, s, None])], reference)[0] == 2
