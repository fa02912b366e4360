"""The Lambda seed's JSON contract without a server: prompt forms, refusals, the PNG, the config.

The forms accepted are the seed's (``sam2-triton-deploy/models/sam2/1/model.py`` of
channel3-ai/try-on-demo @ 1d69734: ``{"x", "y", "label"}`` points, one flat box) plus the
documented others; the end-to-end check with curl is tests/integration/test_lambda_contract.py.
"""

from __future__ import annotations

import base64
import io
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from triton_sam.models import get_family
from triton_sam.repository.config import RepositoryOptions, parse_config
from triton_sam.repository.lambda_config import (
    lambda_artifact,
    lambda_artifact_for,
    serves_lambda,
)
from triton_sam.repository.session_config import SessionOptions
from triton_sam.repository.writer import embedded_twin, write_models, written_by_triton_sam
from triton_sam.serving import lambda_prompts
from triton_sam.serving.bounds import RequestError
from triton_sam.serving.protocol import lambda_json


def parse(prompt: object, **kwargs):
    text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return lambda_prompts.parse_prompt(text.encode(), max_points=64, **kwargs)


def test_the_seeds_forms_and_the_documented_others_give_the_same_prompt():
    seed = parse({"points": [{"x": 10, "y": 20.5, "label": 0}, {"x": 3, "y": 4}], "boxes": []})
    pairs = parse({"points": [[10, 20.5, 0], [3, 4]]})
    for prompt in (seed, pairs):
        np.testing.assert_array_equal(prompt.points, [[10, 20.5], [3, 4]])
        np.testing.assert_array_equal(prompt.labels, [0, 1])  # label defaults to 1, as the seed's
        assert len(prompt.boxes) == 0
    flat = parse({"boxes": [1, 2, 30, 40]})  # the seed's one box
    nested = parse({"boxes": [[1, 2, 30, 40]]})
    named = parse({"boxes": [{"x1": 1, "y1": 2, "x2": 30, "y2": 40}]})
    for prompt in (flat, nested, named):
        np.testing.assert_array_equal(prompt.boxes, [[1, 2, 30, 40]])
    assert parse({}).empty and parse({"points": [], "boxes": []}).empty
    assert not parse({"points": [[1, 2]]}).empty and not parse({"boxes": [1, 2, 3, 4]}).empty
    assert parse({"points": None, "boxes": None}).requests()[0][2] is None


def test_several_boxes_are_one_request_each_and_a_point_goes_with_one_box():
    two = parse({"boxes": [[1, 2, 30, 40], [5, 6, 70, 80]]}).requests()
    assert [r[2].tolist() for r in two] == [[1, 2, 30, 40], [5, 6, 70, 80]]
    assert all(r[0] is None for r in two)
    (one,) = parse({"boxes": [1, 2, 30, 40], "points": [[5, 6]]}).requests()
    assert one[0].tolist() == [[5, 6]] and one[1].tolist() == [1]


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        ('{"points": [', "prompt_json"),
        ("[1, 2]", "prompt_json"),
        ({"point": []}, "prompt_json.point"),
        ({"points": {"x": 1}}, "prompt_json.points"),
        ({"points": [{"x": 1}]}, "prompt_json.points[0].y"),
        ({"points": [{"x": "1", "y": 2}]}, "prompt_json.points[0].x"),
        ('{"points": [{"x": 1, "y": Infinity}]}', "prompt_json.points[0].y"),
        ({"points": [{"x": 1, "y": 2, "label": 2}]}, "prompt_json.points[0].label"),
        ({"points": [{"x": 1, "y": 2, "label": True}]}, "prompt_json.points[0].label"),
        ({"points": [{"x": 1, "y": 2, "z": 3}]}, "prompt_json.points[0].z"),
        ({"points": [[1]]}, "prompt_json.points[0]"),
        ({"points": [[1, 2]] * 63}, "prompt_json.points"),  # 64 - 2 box corners
        ({"boxes": [3, 2, 1, 4]}, "prompt_json.boxes"),
        ({"boxes": [[1, 2, 3, 2]]}, "prompt_json.boxes[0]"),
        ({"boxes": [[1, 2, 3]]}, "prompt_json.boxes[0]"),
        ({"boxes": [{"x1": 1, "y1": 2, "x2": 3}]}, "prompt_json.boxes[0].y2"),
        ({"boxes": [[0, 0, 1, 1]] * 17}, "prompt_json.boxes"),
        ({"boxes": [[0, 0, 1, 1]] * 2, "points": [[1, 1]]}, "prompt_json.points"),
    ],
)
def test_a_bad_prompt_is_refused_naming_the_field(prompt, field):
    with pytest.raises(RequestError) as refused:
        parse(prompt)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")


def test_the_prompt_text_is_bounded():
    with pytest.raises(RequestError, match="^prompt_json: got 76 bytes, expected at most 64"):
        parse({"points": [[1, 2]] * 8}, max_bytes=64)


def test_image_b64_standard_base64_with_line_breaks_and_bounds():
    data = bytes(range(256)) * 3
    wrapped = base64.encodebytes(data)  # 76-character lines, as `base64` without -w0 writes
    assert lambda_prompts.decode_image_b64(wrapped, max_bytes=len(data)) == data
    for bad in (b"not base64!", b"AAA", b"", b"-_-_"):
        with pytest.raises(RequestError) as refused:
            lambda_prompts.decode_image_b64(bad, max_bytes=1000)
        assert refused.value.field == "image_b64"
    with pytest.raises(RequestError, match="^image_b64: got 769 bytes"):
        lambda_prompts.decode_image_b64(base64.b64encode(data + b"x"), max_bytes=len(data))
    with pytest.raises(RequestError, match="characters"):  # refused before decoding
        lambda_prompts.decode_image_b64(b"A" * 10_000, max_bytes=100)


def test_the_mask_png_is_the_seeds_8_bit_encoding():
    mask = np.random.default_rng(0).random((37, 53)) > 0.5
    png = Image.open(io.BytesIO(lambda_prompts.encode_png_gray8(mask)))
    seed = mask.astype(np.uint8) * 255  # the seed's Image.fromarray(mask.astype(uint8) * 255)
    assert png.mode == "L" and png.size == (53, 37)
    np.testing.assert_array_equal(np.asarray(png), seed)


def test_result_json_has_the_seeds_fields_and_one_mask_per_box():
    prompt = parse({"boxes": [[1, 2, 30, 40], [5, 6, 70, 80]]})
    masks = [np.eye(4, dtype=bool), np.zeros((4, 4), bool)]
    result = json.loads(lambda_prompts.result_json("sam2", 12, prompt, masks, [0.5, 0.25], (4, 4)))
    assert result["model"] == "sam2" and result["ok"] is True
    assert result["message"] == "sam2 inference"
    assert result["inputs"] == {"image_b64_len": 12, "prompt": prompt.given}
    assert result["scores"] == 0.5  # the seed's: its one mask's score, a number
    assert result["mask"] == {"format": "png_base64", "data": result["masks"][0]["data"]}
    assert [m["score"] for m in result["masks"]] == [0.5, 0.25]
    assert result["image_size"] == [4, 4]


@pytest.mark.parametrize(
    ("message", "index", "expected"),
    [
        ("image_bytes: cannot decode", None, "image_b64: cannot decode"),
        (
            "box: got a value of magnitude 2e4",
            1,
            "prompt_json.boxes[1]: got a value of magnitude 2e4",
        ),
        ("points: got 70 points", 0, "prompt_json.points: got 70 points"),
        ("image_id 'x' is not cached", 0, "image_id 'x' is not cached"),
    ],
)
def test_session_errors_name_the_clients_field(message, index, expected):
    assert lambda_prompts.client_message(message, index) == expected


def test_the_config_is_the_seeds_tensors_over_the_session_model():
    family = get_family("sam2")
    assert serves_lambda(family) and not serves_lambda(get_family("sam1"))
    artifact = lambda_artifact(family, RepositoryOptions(), SessionOptions(max_points=32))
    config = parse_config(artifact.config_text)
    assert config.name == lambda_json.DEFAULT_NAME == "sam2"
    assert config.backend == "python" and config.max_batch_size > 0  # [1, 1] requests
    assert [(t.name, list(t.dims)) for t in config.input] == [
        ("image_b64", [1]),
        ("prompt_json", [1]),
    ]
    assert [(t.name, list(t.dims)) for t in config.output] == [("result_json", [1])]
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert set(params) == set(lambda_json.PARAM_KEYS)
    assert params[lambda_json.PARAM_SESSION_MODEL] == family.session_model
    assert params[lambda_json.PARAM_MAX_POINTS] == "32"
    for path in artifact.files.values():
        assert path.is_file()
    # the shipped package holds everything model.py imports
    assert {"model.py", "triton_sam_serving/lambda_prompts.py"} <= set(artifact.files)
    assert written_by_triton_sam(artifact)
    twin = parse_config(embedded_twin(artifact, "onnxruntime").config_text)
    assert [(g.kind, g.count) for g in twin.instance_group] == [(config.instance_group[0].kind, 1)]


def test_setup_keeps_a_sam2_model_of_the_users_own_and_rewrites_its_own(tmp_path, caplog):
    family, options = get_family("sam2"), RepositoryOptions()
    repo = tmp_path / "model_repository"
    assert lambda_artifact_for(repo, family, options) is not None  # nothing there yet
    write_models(repo, [lambda_artifact_for(repo, family, options)])
    assert lambda_artifact_for(repo, family, options) is not None  # ours: rewritten
    shutil.rmtree(repo / "sam2")
    (repo / "sam2" / "1").mkdir(parents=True)  # the seed's own python model
    (repo / "sam2" / "config.pbtxt").write_text('name: "sam2"\nbackend: "python"\n')
    (repo / "sam2" / "1" / "model.py").write_text("class TritonPythonModel: ...\n")
    with caplog.at_level("WARNING"):
        assert lambda_artifact_for(repo, family, options) is None
    assert "model of your own" in caplog.text
    assert lambda_artifact_for(repo, get_family("sam1"), options) is None
