"""``sam3_concept_video``'s bounds are checked as the trackers' are (one check of the session
store's bounds), plus its own: a bad value is refused naming it."""

from __future__ import annotations

import pytest

from triton_sam.errors import InputValidationError
from triton_sam.repository.concept_video import ConceptVideoOptions


@pytest.mark.parametrize(
    "bounds, field",
    [
        ({"max_sessions": 0}, "max_sessions"),
        ({"max_tenant_sessions": -1}, "max_tenant_sessions"),
        ({"max_tenant_sessions": 5, "max_sessions": 4}, "max_tenant_sessions"),
        ({"evict_idle_s": -1}, "evict_idle_s"),
        ({"max_propagations": 0}, "max_propagations"),
    ],
)
def test_bad_bounds_are_refused_naming_the_field(bounds, field) -> None:
    with pytest.raises(InputValidationError) as err:
        ConceptVideoOptions(**bounds)
    assert err.value.field == field


def test_the_defaults_are_accepted() -> None:
    ConceptVideoOptions()
