"""Settings' bounds declared with their fields: each refusal names the field and the value."""

from __future__ import annotations

import pytest

from triton_sam.bench.replicas import ReplicaBenchOptions
from triton_sam.bench.soak_report import SoakSettings
from triton_sam.bench.stress_report import DragSettings
from triton_sam.errors import InputValidationError


@pytest.mark.parametrize(
    ("settings", "kwargs", "field", "expected"),
    [
        (SoakSettings, {"sessions": 0}, "sessions", "got 0, expected an integer >= 1"),
        (SoakSettings, {"images": -1}, "images", "got -1, expected an integer >= 0"),
        (SoakSettings, {"encode_every": 1.5}, "encode_every", "expected an integer >= 0"),
        (SoakSettings, {"timeout_s": 0}, "timeout_s", "got 0, expected > 0"),
        (DragSettings, {"repeats": True}, "repeats", "got True, expected an integer >= 1"),
        (DragSettings, {"rate_hz": -1.0}, "rate_hz", "got -1.0, expected > 0"),
        (ReplicaBenchOptions, {"images": True}, "images", "expected an integer >= 1"),
    ],
)
def test_a_value_outside_its_bounds_is_refused_by_name(settings, kwargs, field, expected):
    with pytest.raises(InputValidationError) as info:
        settings(**kwargs)
    assert info.value.field == field
    assert expected in str(info.value)


def test_defaults_and_values_on_the_bounds_pass():
    assert SoakSettings(images=0, encode_every=0, sessions=1).sessions == 1
    assert DragSettings().events == 50
    assert ReplicaBenchOptions().replicas == 3
