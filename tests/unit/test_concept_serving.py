"""Concept segmentation pieces without torch or a server: masks, ids, cache, protocol, configs."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import sys

import numpy as np
import pytest
from PIL import Image

from triton_sam.client import concepts, model_frame, postprocess
from triton_sam.errors import InputValidationError, RepositoryError
from triton_sam.models.sam3 import PREPROCESSING
from triton_sam.models.sam3_concept import SAM3_CONCEPT_FAMILY, concept_family
from triton_sam.repository import concept as concept_repo
from triton_sam.repository.config import RepositoryOptions, config_to_text, parse_config
from triton_sam.repository.writer import (
    SHIPPED_PACKAGE,
    ModelFiles,
    embedded_repository,
    write_models,
)
from triton_sam.serving import cache, images, masks
from triton_sam.serving.protocol import concept as protocol


def _shape_6x5() -> np.ndarray:
    m = np.zeros((6, 5), bool)
    m[1:4, 2:5] = True
    m[5, 0] = True
    return m


def _long_runs() -> np.ndarray:
    m = np.zeros((40, 70), bool)
    m[3:37, 5:69] = True
    m[10, :] = False
    return m


# pycocotools 2.0.10 ``mask.encode(np.asfortranarray(m.astype(np.uint8)))["counts"]``.
GOLDEN_RLE = {
    "empty 3x4": (np.zeros((3, 4), bool), b"<"),
    "full 3x4": (np.ones((3, 4), bool), b"0<"),
    "shape 6x5": (_shape_6x5(), b"5172L000O"),
    "random 9x11": (
        np.unpackbits(np.frombuffer(bytes.fromhex("e583f25c227dd0be0ade6e1500"), np.uint8))[:99]
        .reshape(9, 11)
        .astype(bool),
        b"01100010O012ON0040N1N01OO013O20L001001O40J2010N12ON00",
    ),
    "long runs 40x70": (
        _long_runs(),
        b"[671c0" + b"5]OKc0" * 63 + b"Z1",
    ),
}


@pytest.mark.parametrize("name", list(GOLDEN_RLE))
def test_rle_is_pycocotools_compressed_rle(name):
    mask, counts = GOLDEN_RLE[name]
    assert masks.encode_rle(mask) == counts
    np.testing.assert_array_equal(masks.decode_rle(counts, mask.shape), mask)


def test_rle_round_trips_random_masks_of_any_size():
    rng = np.random.default_rng(0)
    for _ in range(50):
        h, w = rng.integers(1, 90, 2)
        mask = rng.random((h, w)) > rng.random()
        np.testing.assert_array_equal(masks.decode_rle(masks.encode_rle(mask), (h, w)), mask)


def test_a_placed_crop_has_the_rle_of_the_whole_mask_it_is_part_of():
    """Crops at every kind of offset (touching the top, the bottom, the image's last pixel:
    runs joined across columns, a run to the end) against the full mask's own RLE."""
    rng = np.random.default_rng(1)
    for _ in range(3000):
        h, w = rng.integers(1, 12, 2)
        rows, cols = rng.integers(0, h + 1), rng.integers(0, w + 1)
        r0, c0 = rng.integers(0, h - rows + 1), rng.integers(0, w - cols + 1)
        crop = rng.random((rows, cols)) < rng.random()
        full = np.zeros((h, w), bool)
        full[r0 : r0 + rows, c0 : c0 + cols] = crop
        placed = masks.placed_rle_counts(crop, (r0, c0), (h, w))
        np.testing.assert_array_equal(placed, masks.rle_counts(full))
    with pytest.raises(ValueError, match="offset"):
        masks.placed_rle_counts(np.ones((2, 2), bool), (9, 0), (10, 10))


def test_decode_rle_refuses_counts_of_another_size_or_garbage():
    counts = masks.encode_rle(_shape_6x5())
    with pytest.raises(ValueError, match="cover 30 pixels, expected 5x5"):
        masks.decode_rle(counts, (5, 5))
    with pytest.raises(ValueError, match="not a COCO compressed RLE"):
        masks.decode_rle(b"\x01\x02", (2, 2))


def test_png_is_a_1_bit_image_of_the_mask():
    mask = _long_runs()
    with Image.open(io.BytesIO(masks.encode_png(mask))) as image:
        assert image.mode == "1" and image.size == (70, 40)
        np.testing.assert_array_equal(np.asarray(image), mask)
    np.testing.assert_array_equal(concepts.decode_png(masks.encode_png(mask)), mask)


def test_binary_masks_are_sigmoid_then_bilinear_then_threshold():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((11, 12, 12)).astype(np.float32) * 4  # more than one chunk
    out = list(masks.binary_masks(logits, (30, 17), 0.5))
    expected = postprocess.postprocess_masks(masks.sigmoid(logits)[None], (30, 17), PREPROCESSING)
    np.testing.assert_array_equal(np.stack(out), expected[0] > 0.5)


def test_server_preprocessing_is_the_clients_bit_for_bit():
    rgb = np.random.default_rng(2).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    np.testing.assert_array_equal(
        images.preprocess_sam3(rgb), model_frame.preprocess(rgb, PREPROCESSING)
    )


def test_image_id_depends_on_pixels_shape_and_namespace():
    rgb = np.zeros((4, 6, 3), np.uint8)
    base = images.image_id(rgb, "a")
    assert re.fullmatch(r"[0-9a-f]{32}", base)
    assert images.image_id(rgb.copy(), "a") == base
    assert images.image_id(rgb, "b") != base
    assert images.image_id(rgb.reshape(6, 4, 3), "a") != base
    changed = rgb.copy()
    changed[0, 0, 0] = 1
    assert images.image_id(changed, "a") != base


@pytest.mark.parametrize(
    "image, message",
    [
        (np.zeros((4, 4, 3), np.float32), "dtype float32"),
        (np.zeros((4, 4), np.uint8), r"shape \[4, 4\]"),
        (np.zeros((0, 4, 3), np.uint8), r"shape \[0, 4, 3\]"),
        (np.zeros((30, 40, 3), np.uint8), "1200 pixels, expected at most 1000"),
    ],
)
def test_check_rgb_names_what_is_wrong(image, message):
    with pytest.raises(ValueError, match=f"image: .*{message}"):
        images.check_rgb(image, max_pixels=1000)


def test_lru_cache_bounds_entries_and_bytes_keeping_the_newest():
    lru = cache.LruCache(max_entries=2, max_bytes=100)
    assert lru.put("a", 1, 40) == [] and lru.put("b", 2, 40) == []
    assert lru.get("a") == 1  # a is now the most recent
    assert lru.put("c", 3, 40) == ["b"]  # too many entries: the least recent goes
    assert lru.put("d", 4, 500) == ["a", "c"]  # one entry above max_bytes is still kept
    assert "d" in lru and len(lru) == 1 and lru.nbytes == 500 and lru.evictions == 3
    assert lru.get("a") is None


def _prediction() -> concepts.ConceptPrediction:
    mask = np.zeros((2, 4, 5), bool)
    mask[0, 1:3, 1:4] = True
    mask[1, 0, 0] = True
    return concepts.ConceptPrediction(
        phrases=("cat", "dog"),
        image_size=(4, 5),
        presence=np.array([0.9, 0.2], np.float32),
        phrase_index=np.array([0, 0], np.int32),
        query_index=np.array([3, 7], np.int32),
        scores=np.array([0.8, 0.6], np.float32),
        boxes=np.array([[1, 1, 4, 3], [0, 0, 1, 1]], np.float32),
        masks=mask,
    )


def test_for_phrase_and_coco_export():
    prediction = _prediction()
    assert len(prediction.for_phrase("cat")) == 2 and len(prediction.for_phrase(1)) == 0
    coco = json.loads(json.dumps(prediction.to_coco(file_name="x.png")))
    assert [c["name"] for c in coco["categories"]] == ["cat", "dog"]
    first = coco["annotations"][0]
    assert first["bbox"] == [1.0, 1.0, 3.0, 2.0] and first["area"] == 6
    assert first["segmentation"]["size"] == [4, 5]
    decoded = masks.decode_rle(first["segmentation"]["counts"], (4, 5))
    np.testing.assert_array_equal(decoded, prediction.masks[0])


@pytest.mark.parametrize(
    "text, message",
    [
        ([], "got 0 phrases"),
        (["cat"] * 17, "got 17 phrases"),
        (["cat", " "], "phrase 1 is empty"),
        (["cat", 3], "phrase 1 is int"),
        ("é" * 600, "phrase 0 is 1200 bytes"),
    ],
)
def test_client_refuses_bad_phrases_before_sending(text, message):
    with pytest.raises(InputValidationError, match=message) as raised:
        concepts.check_phrases(text)
    assert raised.value.field == "text"


def test_parse_prediction_reads_the_protocol_outputs():
    prediction = _prediction()
    rle = [masks.encode_rle(m) for m in prediction.masks]
    out = {
        protocol.IMAGE_SIZE: np.array([[4, 5]], np.int32),
        protocol.PRESENCE: prediction.presence[None],
        protocol.PHRASE_INDEX: prediction.phrase_index[None],
        protocol.QUERY_INDEX: prediction.query_index[None],
        protocol.SCORES: prediction.scores[None],
        protocol.BOXES: prediction.boxes[None],
        protocol.MASKS_RLE: np.array([rle], dtype=np.object_),
    }
    parsed = concepts.parse_prediction(out, ["cat", "dog"], "rle")
    np.testing.assert_array_equal(parsed.masks, prediction.masks)
    assert parsed.rle[1] == {"size": [4, 5], "counts": rle[1].decode()}
    empty = {**out, protocol.SCORES: np.zeros((1, 0), np.float32)}
    empty |= {protocol.BOXES: np.zeros((1, 0, 4), np.float32)}
    empty |= {protocol.MASKS_RLE: np.zeros((1, 0), np.object_)}
    assert concepts.parse_prediction(empty, ["cat", "dog"], "rle").masks.shape == (0, 4, 5)


def test_concept_family_contract_scales_with_width():
    small = concept_family(width=64)
    assert [t.shape for t in small.vision.outputs] == [(64, 288, 288), (64, 144, 144), (64, 72, 72)]
    assert small.text.outputs[0].shape == (32, 64)
    # prompts x tokens (32 text tokens, then exemplar tokens if any) x width
    assert SAM3_CONCEPT_FAMILY.decoder.inputs[3].shape == (-1, -1, 256)
    assert [t.shape for t in small.exemplar.inputs] == [(64, 72, 72), (-1, 4), (-1,)]
    assert small.exemplar.outputs[0].shape == (-1, 64)  # G boxes + 1 CLS token
    masks_out = {t.name: t.shape for t in SAM3_CONCEPT_FAMILY.decoder.outputs}["masks"]
    assert masks_out == (-1, -1, 288, 288)


def test_serving_config_carries_the_protocol_and_every_parameter():
    options = RepositoryOptions(target="onnxruntime")
    config = concept_repo.build_serving_config(
        SAM3_CONCEPT_FAMILY, options, concept_repo.ConceptOptions(), pad_token_id=49407
    )
    assert config.backend == "python" and config.name == protocol.MODEL
    assert [i.name for i in config.input] == list(protocol.INPUTS)
    assert [o.name for o in config.output] == list(protocol.OUTPUTS)
    assert all(i.optional for i in config.input)
    assert set(config.parameters) == set(protocol.PARAM_KEYS)
    assert len(config.instance_group) == 1 and config.instance_group[0].count == 1
    assert config.instance_group[0].gpus == [0]  # GPU target: one instance, one cache
    assert parse_config(config_to_text(config)) == config
    # every key the model reads (its settings) is one the renderer writes, but the kind,
    # which is for the tools that read the repository
    fields = {f.name for f in dataclasses.fields(protocol.ConceptSettings)}
    assert fields == set(protocol.PARAM_KEYS) - {protocol.PARAM_KIND}


def test_graph_configs_serve_like_encoder_and_decoder():
    options = RepositoryOptions(encoder_max_batch_size=2, decoder_max_batch_size=4)
    configs = concept_repo.graph_configs(
        SAM3_CONCEPT_FAMILY, options, concept_repo.ConceptOptions(max_phrases=16)
    )
    assert configs["vision"].max_batch_size == 2 and configs["decoder"].max_batch_size == 2
    assert configs["text"].max_batch_size == 16  # every phrase of a request in one batch
    assert configs["exemplar"].max_batch_size == 1  # roi_align's unrolled batch: one image
    dims = {o.name: list(o.dims) for o in configs["decoder"].output}
    assert dims["masks"] == [-1, -1, 288, 288] and dims["boxes"] == [-1, -1, 4]


def test_serving_files_ship_a_dependency_free_package(tmp_path):
    files = concept_repo.serving_files(tmp_path / "tokenizer.json")
    shipped = [p for n, p in files.items() if n.startswith(SHIPPED_PACKAGE + "/")]
    for path in shipped:
        imports = re.findall(r"^(?:from|import) (\S+)", path.read_text(), re.M)
        allowed = set(sys.stdlib_module_names) | {"__future__", "numpy"}
        top = {i.split(".")[0] for i in imports if not i.startswith(".")}  # "." = siblings
        assert top <= allowed, (path.name, imports)


def _python_model(name: str) -> str:
    return config_to_text(
        parse_config(
            f'name: "{name}"\nbackend: "python"\ninstance_group {{ kind: KIND_GPU }}\n'
            'parameters { key: "triton_sam.kind" value { string_value: "concept" } }'
        )
    )


def test_write_models_is_all_or_nothing_and_twins_bls_models(tmp_path):
    repo = tmp_path / "repo"
    source = tmp_path / "model.py"
    source.write_text("# model\n")
    (tmp_path / "mod.py").write_text("X = 1\n")
    files = {"model.py": source, "pkg/mod.py": tmp_path / "mod.py"}
    write_models(repo, [ModelFiles("a", _python_model("a"), files)])
    assert (repo / "a" / "1" / "pkg" / "mod.py").read_text() == "X = 1\n"
    broken = {"model.py": tmp_path / "missing.py"}
    with pytest.raises(RepositoryError, match="missing.py"):
        write_models(
            repo,
            [
                ModelFiles("a", _python_model("a"), {"model.py": source}),
                ModelFiles("b", _python_model("b"), broken),
            ],
        )
    assert (repo / "a" / "1" / "pkg" / "mod.py").is_file()  # the old "a" is untouched
    with pytest.raises(RepositoryError, match="duplicate"):
        write_models(repo, [ModelFiles("a", _python_model("a"), files)] * 2)
    twin = embedded_repository(repo, tmp_path / "twin")
    assert (twin / "a" / "1" / "pkg" / "mod.py").read_text() == "X = 1\n"
    assert "KIND_CPU" in (twin / "a" / "config.pbtxt").read_text()
