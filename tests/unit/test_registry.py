"""Registry and hydra configs: every variant resolves, unknown names list the valid ones."""

from __future__ import annotations

import pytest

from triton_sam.config import load_config, model_spec, section
from triton_sam.errors import ConfigError, UnsupportedModelError
from triton_sam.models import family_names, get_family, get_model, model_names

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
    with pytest.raises(UnsupportedModelError, match=r"model_type.*\['sam2'\]"):
        get_family("sam9")
    assert "sam2" in family_names()


def test_family_contract_is_consistent():
    fam = get_family("sam2")
    decoder_inputs = {t.name: t for t in fam.decoder_inputs}
    for out in fam.encoder_outputs:  # every embedding feeds the decoder with the same shape
        assert decoder_inputs[out.name] == out
    pre = fam.preprocessing
    assert pre.mask_size * 4 == pre.image_size
    assert dict((t.name, t.shape) for t in fam.encoder_outputs)["image_embed"] == (256, 64, 64)


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
