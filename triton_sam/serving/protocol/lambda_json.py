"""The ``sam2`` model: the Lambda seed's KServe v2 JSON contract, served over ``sam2_session``.

The seed's users POST plain JSON to ``/v2/models/sam2/infer`` with two BYTES inputs of shape
[1, 1]: ``image_b64`` (a base64-encoded image file) and ``prompt_json`` (a JSON object with
``points`` and ``boxes``), and read ``result_json``: a JSON object whose ``mask.data`` is a
base64 PNG (8-bit grayscale, 0 / 255) at the image's size. This model keeps that contract and
answers from the session model (``<family>_session``, through BLS), so the image is decoded,
bounded and cached there, per tenant.

Prompt forms accepted (pixels of the original image, X right, Y down):

- ``points``: a list of ``{"x": X, "y": Y, "label": 0|1}`` (the seed's form; ``label``
  defaults to 1, foreground), ``[X, Y]`` (foreground) or ``[X, Y, label]``;
- ``boxes``: one box as ``[x1, y1, x2, y2]`` (the seed's form), or a list of such boxes, or
  ``{"x1": .., "y1": .., "x2": .., "y2": ..}`` objects. Several boxes give one mask each
  (``masks``, in order; ``mask`` is the first), and cannot be combined with points;
- neither (``{"points": [], "boxes": []}``): the decoder's answer to no prompt at all, as the
  seed's model answered it (the official predictor's ``predict()`` without prompts: no
  prompt token, not even the padding point).

Refused with ``InvalidInput`` naming the field (``image_b64``, ``prompt_json``,
``prompt_json.points[i].x``, ``prompt_json.boxes[i]`` ...): base64 that does not decode, JSON
that does not parse or is not an object, keys other than ``points`` / ``boxes``, non-finite
numbers, labels other than 0/1, boxes with ``x1 >= x2`` or ``y1 >= y2``, more than
:data:`DEFAULT_MAX_BOXES` boxes or more points than the session model takes with a box
(``max_points`` - 2), an image or a prompt larger than the bounds. Coordinates outside the
image are passed on as the official predictor takes them (not clipped), within the session
model's coordinate bound.
"""

from dataclasses import dataclass

from . import KIND_LAMBDA_JSON, KIND_PARAM

KIND = KIND_LAMBDA_JSON
DEFAULT_NAME = "sam2"  # the seed's model name: its users' URLs stay the same

IMAGE_B64 = "image_b64"  # BYTES [1]
PROMPT_JSON = "prompt_json"  # BYTES [1]
RESULT_JSON = "result_json"  # BYTES [1] output
PROMPT_KEYS = ("points", "boxes")
MASK_FORMAT = "png_base64"
MESSAGE = "sam2 inference"  # the seed's result_json "message"

# Config parameters (written by repository/lambda_config.py, read by serving/lambda_model.py).
PARAM_KIND = KIND_PARAM
PARAM_SESSION_MODEL = "session_model"
PARAM_MAX_IMAGE_BYTES = "max_image_bytes"  # the session model's bound on the decoded file
PARAM_MAX_POINTS = "max_points"  # the session model's, box corners and padding included
PARAM_MAX_BOXES = "max_boxes"
PARAM_MAX_PROMPT_BYTES = "max_prompt_bytes"
# The family's preprocessing (serving/intake.py JSON): the no-prompt answer's low-res logits
# are upsampled here, by the family's rule, as the session model does for pixel prompts.
PARAM_PREPROCESSING = "preprocessing"
PARAM_KEYS = (
    PARAM_KIND,
    PARAM_SESSION_MODEL,
    PARAM_MAX_IMAGE_BYTES,
    PARAM_MAX_POINTS,
    PARAM_MAX_BOXES,
    PARAM_MAX_PROMPT_BYTES,
    PARAM_PREPROCESSING,
)
# Boxes of one request: each is one decoder run on the cached features (a batch of clicks).
# 16 is the decoder's default batch (RepositoryOptions.decoder_max_batch_size), so all the
# boxes of one request fit one batch; each run holds 2 corner points, far below the decoder
# graph's own guard of 256 points per item.
DEFAULT_MAX_BOXES = 16
# The prompt text: 62 points and 16 boxes written out take a few KiB.
DEFAULT_MAX_PROMPT_BYTES = 64 * 2**10


@dataclass(frozen=True)
class LambdaSettings:
    """The ``sam2`` model's config parameters: rendered by ``repository/lambda_config.py``,
    read by ``serving/lambda_model.py`` (:mod:`.settings`; field names are the ``PARAM_*``
    keys). ``preprocessing``: the family's, as ``serving/intake.py`` JSON ("" = none)."""

    session_model: str
    max_image_bytes: int
    max_points: int
    max_boxes: int = DEFAULT_MAX_BOXES
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    preprocessing: str = ""


# Points beside a box: the session model counts the two box corners in its max_points.
BOX_CORNERS = 2
