"""Each python model's settings: one dataclass, rendered by repository/ and read by serving/."""

from __future__ import annotations

import dataclasses

import pytest

from triton_sam.models.registry import get_family
from triton_sam.repository import concept, lambda_config, video_config
from triton_sam.repository.config import RepositoryOptions
from triton_sam.repository.everything_job import build_everything_config
from triton_sam.serving.protocol import KIND_PARAM, config_parameters, lambda_json
from triton_sam.serving.protocol import concept as concept_protocol
from triton_sam.serving.protocol import everything as everything_protocol
from triton_sam.serving.protocol import tracker as tracker_protocol
from triton_sam.serving.protocol.settings import from_parameters, to_parameters
from triton_sam.serving.tracking.config import TrackerConfig


def _rendered():
    options = RepositoryOptions()
    return [
        (everything_protocol, build_everything_config(get_family("sam2"))),
        (lambda_json, lambda_config.build_lambda_config(get_family("sam2"), options)),
        (
            concept_protocol,
            concept.build_serving_config(
                get_family("sam3_concept"), options, concept.ConceptOptions(), pad_token_id=7
            ),
        ),
        (tracker_protocol, video_config.build_tracker_config(options, TrackerConfig())),
    ]


SETTINGS = {
    everything_protocol: everything_protocol.JobSettings,
    lambda_json: lambda_json.LambdaSettings,
    concept_protocol: concept_protocol.ConceptSettings,
    tracker_protocol: tracker_protocol.TrackerSettings,
}


@pytest.mark.parametrize("protocol, config", _rendered(), ids=lambda v: getattr(v, "name", ""))
def test_the_model_reads_back_what_the_renderer_wrote(protocol, config):
    cls = SETTINGS[protocol]
    # the python backend hands model.py the config as JSON, each value under string_value
    as_json = {
        "parameters": {k: {"string_value": v.string_value} for k, v in config.parameters.items()}
    }
    params = config_parameters(as_json)
    read = from_parameters(cls, params)
    assert to_parameters(read, kind=protocol.KIND) == params
    # one key per field, and every key the protocol names
    assert {f.name for f in dataclasses.fields(cls)} == set(protocol.PARAM_KEYS) - {KIND_PARAM}


def test_tuples_and_defaults_round_trip():
    settings = everything_protocol.JobSettings("sam1", "s", "d", ("a", "b"), 10, 20)
    params = to_parameters(settings)
    assert params["embedding_names"] == "a,b" and params["max_concurrent_jobs"] == "1"
    assert from_parameters(everything_protocol.JobSettings, params) == settings
    params["max_waiting_jobs"] = ""  # left empty: the default
    assert from_parameters(everything_protocol.JobSettings, params).max_waiting_jobs == 1
    with pytest.raises(TypeError):
        from_parameters(everything_protocol.JobSettings, {"family": "sam1"})
