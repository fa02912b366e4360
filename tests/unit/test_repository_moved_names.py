"""Names that moved out of repository/config.py and writer.py keep importing from there."""

import importlib

import pytest

from triton_sam.repository import artifacts, backend_checks, cpu_twin, embedded

OLD_HOMES = {
    "triton_sam.repository.config": (cpu_twin, backend_checks),
    "triton_sam.repository.writer": (artifacts, embedded),
}


@pytest.mark.parametrize("old", sorted(OLD_HOMES))
def test_every_moved_name_is_the_object_at_its_new_home(old):
    module = importlib.import_module(old)
    for home in OLD_HOMES[old]:
        for name in home.__all__:
            assert getattr(module, name) is getattr(home, name), (old, name)


def test_from_imports_through_the_old_home_work():
    from triton_sam.repository.config import CPU_MAX_CONCURRENT_EMBEDS, ORT_GRAPH_LEVELS
    from triton_sam.repository.writer import embedded_repository, write_pair

    assert CPU_MAX_CONCURRENT_EMBEDS == cpu_twin.CPU_MAX_CONCURRENT_EMBEDS
    assert ORT_GRAPH_LEVELS == backend_checks.ORT_GRAPH_LEVELS
    assert embedded_repository is embedded.embedded_repository
    assert write_pair is artifacts.write_pair


@pytest.mark.parametrize("old", sorted(OLD_HOMES))
def test_an_unknown_name_is_still_an_attribute_error(old):
    module = importlib.import_module(old)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018 - the access is the test
