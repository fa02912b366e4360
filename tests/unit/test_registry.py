"""Registry and hydra configs: every variant resolves, unknown names list the valid ones."""

from __future__ import annotations

import pytest

from triton_sam.errors import ConfigError, UnsupportedModelError
from triton_sam.models import family_names, get_family, get_model, model_names
from triton_sam.setup.settings import load_config, model_spec, section

SAM2_VARIANTS = {
    "sam2.1_hiera_tiny": "sam2.1_hiera_t.yaml",
    "sam2.1_hiera_small": "sam2.1_hiera_s.yaml",
    "sam2.1_hiera_base_plus": "sam2.1_hiera_b+.yaml",
    "sam2.1_hiera_large": "sam2.1_hiera_l.yaml",
}


def test_all_sam2_variants_are_registered_with_official_urls():
    for name, config in SAM2_VARIANTS.items():
        spec = get_model(name)
        assert spec.family is get_family("sam2")
        assert spec.upstream_config == f"configs/sam2.1/{config}"
        assert spec.checkpoint.url.startswith("https://dl.fbaipublicfiles.com/segment_anything_2/")
        assert spec.checkpoint.url.endswith("/" + spec.checkpoint.filename)
    assert set(SAM2_VARIANTS) <= set(model_names())


def test_upstream_configs_exist_in_the_installed_sam2_package():
    pytest.importorskip("sam2")
    from importlib import resources

    for name in SAM2_VARIANTS:
        path = resources.files("sam2").joinpath(get_model(name).upstream_config)
        assert path.is_file(), path


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(UnsupportedModelError, match="sam2.1_hiera_tiny"):
        get_model("sam2_huge")
    with pytest.raises(UnsupportedModelError, match=r"model_type.*\['sam1', 'sam2', 'sam3'"):
        get_family("sam9")
    assert {"sam1", "sam2"} <= set(family_names())


@pytest.mark.parametrize(
    "family, embedding", [("sam1", "image_embeddings"), ("sam2", "image_embed")]
)
def test_family_contract_is_consistent(family, embedding):
    fam = get_family(family)
    decoder_inputs = {t.name: t for t in fam.decoder_inputs}
    for out in fam.encoder_outputs:  # every embedding feeds the decoder with the same shape
        assert decoder_inputs[out.name] == out
    pre = fam.preprocessing
    assert pre.mask_size * 4 == pre.image_size
    assert dict((t.name, t.shape) for t in fam.encoder_outputs)[embedding] == (256, 64, 64)


def test_hydra_config_composes_with_overrides():
    cfg = load_config("sam2.1_hiera_tiny", ["export.fp16=true", "repository.instance_count=2"])
    assert model_spec(cfg) == get_model("sam2.1_hiera_tiny")
    assert section(cfg, "export")["fp16"] is True
    assert section(cfg, "repository")["instance_count"] == 2


def test_default_model_is_base_plus_as_in_the_reference():
    assert model_spec(load_config()).name == "sam2.1_hiera_base_plus"


@pytest.mark.parametrize("override", ["export.nope=1", "export.fp16", "=3", "model=ghost"])
def test_malformed_overrides_raise_config_error(override):
    with pytest.raises(ConfigError, match="overrides"):
        load_config("sam2.1_hiera_tiny", [override])


def test_unknown_model_in_config_lists_valid_names():
    with pytest.raises(UnsupportedModelError, match="expected one of"):
        load_config("ghost")


# Full sha256 of the published SAM1 files, as independent projects verify them (Meta
# publishes none). The hex in each file name is the start of its MD5, not of its sha256.
SAM1_VARIANTS = {
    "sam1_vit_b": ("vit_b", "sam_vit_b_01ec64.pth", "ec2df627", "01ec64d29a2fca3f0661936605ae66f8"),
    "sam1_vit_l": ("vit_l", "sam_vit_l_0b3195.pth", "3adcc431", "0b3195507c641ddb6910d2bb5adee89c"),
    "sam1_vit_h": ("vit_h", "sam_vit_h_4b8939.pth", "a7bf3b02", "4b8939a88964f0f4ff5f5b2642c598a6"),
}


@pytest.mark.parametrize("name", list(SAM1_VARIANTS))
def test_sam1_variants_have_official_urls_and_full_sha256(name):
    upstream, filename, sha_start, md5 = SAM1_VARIANTS[name]
    spec = get_model(name)
    assert spec.family is get_family("sam1")
    assert spec.upstream_config == upstream
    assert spec.checkpoint.url == f"https://dl.fbaipublicfiles.com/segment_anything/{filename}"
    assert spec.checkpoint.filename == filename
    assert len(spec.checkpoint.sha256) == 64 and spec.checkpoint.sha256.startswith(sha_start)
    # The file-name hex is an MD5 prefix: as a sha256 prefix it would refuse the real file.
    assert filename.removesuffix(".pth").rsplit("_", 1)[1] == md5[:6]
    assert spec.checkpoint.sha256_prefix is None


def test_sam1_upstream_configs_exist_in_segment_anything():
    pytest.importorskip("segment_anything")
    from segment_anything import sam_model_registry

    for upstream, *_ in SAM1_VARIANTS.values():
        assert upstream in sam_model_registry


def test_sam1_family_follows_sam_predictor():
    fam = get_family("sam1")
    pre = fam.preprocessing
    assert pre.resize == "longest_side" and pre.pixel_scale == 1.0
    assert pre.pixel_mean == (123.675, 116.28, 103.53)
    assert pre.pixel_std == (58.395, 57.12, 57.375)
    assert pre.low_res_logit_limit is None  # SamPredictor returns low-res logits unclipped
    assert (fam.box_before_points, fam.pad_with_box) == (False, False)
    assert (fam.encoder_model, fam.decoder_model) == ("sam1_encoder", "sam1_decoder")
    assert [t.name for t in fam.decoder_outputs] == [
        "masks",
        "iou_predictions",
        "multimask_masks",
        "multimask_iou_predictions",
    ]
