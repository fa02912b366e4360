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


def _run(logits, scores):
    return SessionRun(image=0, masks=logits, scores=scores)


def test_compare_runs_tells_rounding_from_different_masks():
    ref = np.array([[[2.0, -1.0], [2e-4, -3.0]]], np.float32)  # [M=1, H=2, W=2] logits
    s = np.array([0.5], np.float32)
    reference = [_run([ref, ref, ref, ref], [s, s, s, s])]
    rounding = ref + np.float32(1e-6)
    near_zero = ref.copy()
    near_zero[0, 1, 0] = -2e-4  # a pixel at the decision boundary takes the other side
    far = ref.copy()
    far[0, 0, 1] = 1.0  # a pixel flips that the reference was sure about
    same = compare_runs([_run([ref, rounding, ref, ref], [s, s, s, s + 1e-7])], reference)
    assert same.mismatches == 0 and same.sign_flips == 0
    assert same.max_logit_diff == pytest.approx(1e-6, rel=0.5)
    assert same.max_score_diff == pytest.approx(1e-7, rel=0.5)
    assert compare_runs([_run([ref, near_zero, ref, ref], [s] * 4)], reference).sign_flips == 1
    assert compare_runs([_run([ref, near_zero, ref, ref], [s] * 4)], reference).mismatches == 0
    result = compare_runs([_run([ref, far, None, ref], [s, s, None, s])], reference)
    assert result.mismatches == 2  # the flipped mask and the failed click
