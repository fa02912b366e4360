"""The session model's settings: one dataclass, written by the renderer and read back by the
model through one generic codec (``serving/protocol/parameters.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from triton_sam.errors import InputValidationError
from triton_sam.models import get_family
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.session_config import SessionOptions, build_session_config
from triton_sam.serving.embedding_cache import settings as shared
from triton_sam.serving.embedding_cache.settings import SessionSettings
from triton_sam.serving.protocol import embedding_cache as protocol
from triton_sam.serving.protocol.parameters import (
    ParameterError,
    from_parameters,
    to_parameters,
)


def _parameters(family: str, session: SessionOptions | None = None) -> dict[str, str]:
    config = build_session_config(get_family(family), RepositoryOptions(), session)
    return {k: v.string_value for k, v in config.parameters.items()}


@pytest.mark.parametrize("family", ["sam1", "sam2", "sam3"])
def test_what_the_renderer_writes_the_model_reads_back_field_by_field(family):
    session = SessionOptions(max_images=3, cpu_features="shared_memory", max_bytes=0)
    params = _parameters(family, session)
    settings = from_parameters(SessionSettings, params)
    assert to_parameters(settings) | {protocol.PARAM_KIND: protocol.KIND} == params
    assert settings.max_images == 3 and settings.cpu_features == "shared_memory"
    assert settings.encoder_model == get_family(family).encoder_model
    assert settings.embedding_names == tuple(get_family(family).embedding_names)


def test_the_rendered_fields_are_the_protocol_keys_and_the_twin_keys_are_not_rendered():
    rendered = set(to_parameters(SessionSettings()))
    assert rendered | {protocol.PARAM_KIND} == set(protocol.PARAM_KEYS)
    twin = {protocol.PARAM_ENCODER_IDENTITY, protocol.PARAM_DECODER_SLOTS}
    twin.add(protocol.PARAM_MAX_WAITING_CLICKS)
    assert twin == {f.name for f in dataclasses.fields(SessionSettings)} - rendered


def test_absent_or_empty_parameters_are_the_defaults():
    settings = from_parameters(SessionSettings, {"max_images": "", "triton_sam.kind": "x"})
    assert settings == SessionSettings()
    assert settings.low_res_logit_limit is None and settings.identity == ""
    twin = from_parameters(
        SessionSettings, {"encoder_model": "e", "encoder_identity": "", "decoder_slots": "2"}
    )
    assert twin.identity == "e" and twin.decoder_slots == 2
    assert from_parameters(SessionSettings, {"encoder_identity": "f"}).identity == "f"


@pytest.mark.parametrize(
    ("key", "text", "message"),
    [
        ("max_images", "many", "max_images: got 'many', expected an integer"),
        ("max_images", "0", "max_images: got 0, expected an integer >= 1"),
        ("pad_with_box", "yes", "pad_with_box: got 'yes', expected 'true' or 'false'"),
        ("low_res_logit_limit", "x", "low_res_logit_limit: got 'x', expected a number"),
        ("cpu_features", "disk", "cpu_features: got 'disk', expected one of"),
        ("decoder_slots", "-1", "decoder_slots: got -1, expected an integer >= 0"),
    ],
)
def test_a_bad_parameter_is_a_typed_error_naming_it(key, text, message):
    with pytest.raises(ParameterError, match=message) as info:
        from_parameters(SessionSettings, {key: text})
    assert info.value.name == key


def test_session_options_keep_their_checks_and_the_package_error():
    assert SessionOptions() == SessionOptions()
    assert isinstance(SessionOptions(), shared.SessionOptions)  # the bounds the model reads
    with pytest.raises(InputValidationError, match="max_images: got 0, expected an integer"):
        SessionOptions(max_images=0)
    with pytest.raises(InputValidationError, match="max_points: got 1025, expected at most"):
        SessionOptions(max_points=1025)
    with pytest.raises(InputValidationError, match="max_bytes"):
        SessionOptions(max_bytes=True)  # a bool is not a byte count
