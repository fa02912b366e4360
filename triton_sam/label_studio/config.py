"""A Label Studio labeling config, read for what this backend needs (pure, no I/O).

Label Studio sends the project's labeling config (XML) to ``/setup`` (as ``schema``) and to
``/predict`` (as ``label_config``). The backend segments with SAM from clicks and boxes, so the
config must have:

- an ``<Image name=... value="$key">``: the task field ``data[key]`` holds the image URL;
- an output control on that image: ``<BrushLabels>`` (answered as Label Studio's brush RLE)
  or ``<PolygonLabels>`` (answered as one polygon);
- at least one prompt control on that image: ``<KeyPointLabels>`` (clicks) and/or
  ``<RectangleLabels>`` (a box).

Anything else (choices, text areas, other images) is left alone.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

from triton_sam.errors import InputValidationError

OUTPUT_TAGS = {"brushlabels": "brush", "polygonlabels": "polygon"}
PROMPT_TAGS = ("keypointlabels", "rectanglelabels")
# A labeling config is a page of XML; a megabyte is far past any real one.
MAX_CONFIG_CHARS = 2**20


@dataclass(frozen=True)
class LabelingConfig:
    """What the backend reads from a labeling config.

    Attributes:
        image_name: the ``<Image>``'s ``name`` (results' ``to_name``).
        image_key: the task ``data`` key of its URL (``value="$image"`` -> ``"image"``).
        output: ``"brush"`` or ``"polygon"``: what the backend answers.
        output_name: the output control's ``name`` (results' ``from_name``).
        output_labels: the output control's label values, in config order.
        prompt_names: ``name`` of each prompt control on the image.
    """

    image_name: str
    image_key: str
    output: str
    output_name: str
    output_labels: tuple[str, ...]
    prompt_names: tuple[str, ...]

    @property
    def result_type(self) -> str:
        """The ``type`` of the answered results (``brushlabels`` / ``polygonlabels``)."""
        return f"{self.output}labels"


def parse_labeling_config(text: object, *, field: str = "label_config") -> LabelingConfig:
    """Read a labeling config.

    Args:
        text: the XML as Label Studio sends it.
        field: the request field it came in (named by errors: ``schema`` at ``/setup``).

    Raises:
        InputValidationError: not XML, a DTD (refused: entity expansion), no ``<Image>``,
            no BrushLabels/PolygonLabels or no KeyPointLabels/RectangleLabels on it; the
            message says what a usable config has.
    """
    if not isinstance(text, str) or not text.strip():
        raise InputValidationError(field, f"expected the labeling config (XML), got {text!r:.40}")
    if len(text) > MAX_CONFIG_CHARS:
        raise InputValidationError(field, f"{len(text)} characters, at most {MAX_CONFIG_CHARS}")
    if "<!DOCTYPE" in text.upper() or "<!ENTITY" in text.upper():
        raise InputValidationError(field, "a DTD or entity declaration; a labeling config has none")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as e:
        raise InputValidationError(field, f"not well-formed XML ({e})") from None
    images = [el for el in root.iter() if el.tag.lower() == "image" and el.get("name")]
    for image in images:
        config = _config_of(root, image, field)
        if config is not None:
            return config
    raise InputValidationError(field, _missing(root, images))


def _config_of(
    root: ElementTree.Element, image: ElementTree.Element, field: str
) -> LabelingConfig | None:
    name = image.get("name", "")
    on_image = [el for el in root.iter() if el.get("toName") == name]
    outputs = [el for el in on_image if el.tag.lower() in OUTPUT_TAGS]
    prompts = [el for el in on_image if el.tag.lower() in PROMPT_TAGS]
    if not outputs or not prompts:
        return None
    value = image.get("value", "")
    if not value.startswith("$") or len(value) < 2:
        raise InputValidationError(
            field, f'<Image name="{name}"> has value={value!r}, expected a task field ("$image")'
        )
    output = outputs[0]
    labels = tuple(el.get("value", "") for el in output if el.tag.lower() == "label")
    return LabelingConfig(
        image_name=name,
        image_key=value[1:],
        output=OUTPUT_TAGS[output.tag.lower()],
        output_name=output.get("name", ""),
        output_labels=labels,
        prompt_names=tuple(el.get("name", "") for el in prompts),
    )


def _missing(root: ElementTree.Element, images: list[ElementTree.Element]) -> str:
    expected = (
        "expected an <Image> with a <BrushLabels> or <PolygonLabels> and a <KeyPointLabels> "
        "and/or <RectangleLabels> on it (toName = the image's name)"
    )
    if not images:
        return f"no <Image name=...>; {expected}"
    tags = sorted({el.tag for el in root.iter() if el.get("toName")})
    return f"controls on the image: {', '.join(tags) or 'none'}; {expected}"
