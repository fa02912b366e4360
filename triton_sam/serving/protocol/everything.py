"""The ``<family>_everything`` model: segment everything (automatic mask generation), served.

One request, one job: every instance SAM finds in one image, as the official generators'
``coco_rle`` output mode gives them (``SamAutomaticMaskGenerator`` /
``SAM2AutomaticMaskGenerator``; the driver is :mod:`triton_sam.serving.everything`).

Transport: the model is **decoupled** and answers over gRPC's bidirectional stream
(``ModelStreamInfer``): zero or more progress responses, then one final response. Chosen
because it is what Triton 2.51's python backend offers for both needs at once (measured on the
embedded server): a decoupled model may send responses while it works (progress), and when
the client cancels its stream (``stop_stream(cancel_requests=True)``, or leaving a
``grpc.aio`` ``stream_infer`` iteration) ``request.is_cancelled()`` turns true inside the
model, which checks it between decoder batches and stops. Triton's HTTP endpoint refuses
decoupled models (``501 HTTP end point doesn't support models with decoupled transaction
policy``), so this model is gRPC-only; the clients open a gRPC stream for it.

Inputs (no batch dimension; every input ``optional``, one image source required):

- ``image_bytes`` (BYTES [1]: one encoded image file), ``image_rgb`` (UINT8 [H, W, 3]) or
  ``image_id`` (BYTES [1]: the id the session model answered for an image already embedded,
  by the same tenant). The image is embedded through the family's session model
  (``<family>_session``, which caches it: a later ``set_image`` + clicks on it, or a second
  job, reuse the features), and the features are read back from it over BLS. ``image_id``
  alone cannot crop (the pixels are not here): ``crop_n_layers`` > 0 needs the image.
- or a block of a large image the ``<family>_large`` model holds (:mod:`.large`): ``handle``
  (BYTES [1]: the handle it issued to this tenant), ``block`` (INT32 [4]: row0, col0, row1,
  col1 of the full image, at most its ``max_block`` pixels a side; a tile's outer block) and
  ``z`` (INT32 [1], volumes only). The job runs on that block's pixels as the large model
  maps them (read over BLS: no pixels travel through the client), and the instances are in
  the block's pixels: the client places them at ``block``'s corner and joins the pieces of
  objects that cross tiles (:mod:`triton_sam.serving.everything.stitch`).
- ``params`` (BYTES [1], optional): a JSON object of the official generator's parameters to
  override (``{"points_per_side": 16, "pred_iou_thresh": 0.7}``); unknown keys, wrong
  types, NaN / infinity and values out of bounds are refused naming ``params.<key>``.

Outputs:

- ``progress`` (INT32 [2]): ``(done_batches, total_batches)``; in every non-final response
  (one per decoder batch). ``total_batches`` is known before the first batch runs.
- ``instances`` (BYTES [1]): in the final response, a UTF-8 JSON object
  ``{"image_size": [H, W], "instances": [record, ...]}`` where each record is the official
  ``coco_rle`` record: ``segmentation`` ``{"size": [H, W], "counts": str}`` (COCO compressed
  RLE, column-major, as pycocotools writes it), ``bbox`` [x, y, w, h], ``area``,
  ``predicted_iou``, ``stability_score``, ``point_coords`` [[x, y]], ``crop_box`` [x, y, w, h].
  One JSON text: RLE counts are text already, and the records are what a COCO tool reads.

Errors: the envelope of :mod:`triton_sam.serving.protocol` (``InvalidInput`` naming the
field, ``EmbeddingNotFound`` for an ``image_id`` the tenant's cache does not hold,
``Overloaded`` beyond the admission bound, ``Cancelled`` for a job cancelled between batches).
"""

from dataclasses import dataclass

from . import KIND_EVERYTHING, KIND_PARAM

KIND = KIND_EVERYTHING

IMAGE_BYTES = "image_bytes"
IMAGE_RGB = "image_rgb"
IMAGE_ID = "image_id"
PARAMS = "params"
PROGRESS = "progress"  # INT32 [2] output of every non-final response
INSTANCES = "instances"  # BYTES [1] output of the final response
HANDLE = "handle"  # BYTES [1]: a large image's handle (with BLOCK, and Z for volumes)
BLOCK = "block"  # INT32 [4]: row0, col0, row1, col1
Z = "z"  # INT32 [1]
IMAGE_INPUTS = (IMAGE_BYTES, IMAGE_RGB, IMAGE_ID, HANDLE)
BLOCK_INPUTS = (BLOCK, Z)
OUTPUTS = (PROGRESS, INSTANCES)

# Config parameters (written by repository/everything_job.py, read by everything_model.py).
PARAM_KIND = KIND_PARAM
PARAM_FAMILY = "family"  # "sam1" / "sam2": the official generator it reproduces
PARAM_SESSION_MODEL = "session_model"
PARAM_DECODER_MODEL = "decoder_model"  # the <prefix>_everything_decoder graph
PARAM_EMBEDDING_NAMES = "embedding_names"  # comma-separated: the session model's features
PARAM_MAX_IMAGE_BYTES = "max_image_bytes"
PARAM_MAX_IMAGE_PIXELS = "max_image_pixels"
PARAM_MAX_PARAMS_BYTES = "max_params_bytes"
PARAM_MAX_CONCURRENT_JOBS = "max_concurrent_jobs"
PARAM_MAX_WAITING_JOBS = "max_waiting_jobs"
PARAM_LARGE_MODEL = "large_model"  # the <prefix>_large model a handle is read from
PARAM_KEYS = (
    PARAM_KIND,
    PARAM_FAMILY,
    PARAM_SESSION_MODEL,
    PARAM_DECODER_MODEL,
    PARAM_EMBEDDING_NAMES,
    PARAM_MAX_IMAGE_BYTES,
    PARAM_MAX_IMAGE_PIXELS,
    PARAM_MAX_PARAMS_BYTES,
    PARAM_MAX_CONCURRENT_JOBS,
    PARAM_MAX_WAITING_JOBS,
    PARAM_LARGE_MODEL,
)
# A job holds one image's pixels, one crop's features and one batch's masks at the crop's
# size (the params bounds of serving/everything.py bound that batch), so one job at a time
# per server is the memory bound; one more waits, the next is refused at once (Overloaded).
DEFAULT_MAX_CONCURRENT_JOBS = 1
DEFAULT_MAX_WAITING_JOBS = 1
DEFAULT_MAX_PARAMS_BYTES = 4096  # a JSON object of the 14 parameters takes a few hundred


@dataclass(frozen=True)
class JobSettings:
    """The job model's config parameters: rendered by ``repository/everything_job.py``, read
    by ``everything_model.py`` (:mod:`.settings`; field names are the ``PARAM_*`` keys).

    Attributes:
        family: ``"sam1"`` / ``"sam2"``, the official generator it reproduces.
        session_model: the model that embeds the image (and the crops).
        decoder_model: the ``<prefix>_everything_decoder`` graph.
        embedding_names: the session model's feature outputs, in the decoder's order.
        max_image_bytes, max_image_pixels: the session model's image bounds, checked first.
        max_params_bytes: the ``params`` JSON text's bound.
        max_concurrent_jobs, max_waiting_jobs: admission (``Overloaded`` beyond).
        large_model: the model a ``handle``'s block is read from ("": handles are refused).
    """

    family: str
    session_model: str
    decoder_model: str
    embedding_names: tuple[str, ...]
    max_image_bytes: int
    max_image_pixels: int
    max_params_bytes: int = DEFAULT_MAX_PARAMS_BYTES
    max_concurrent_jobs: int = DEFAULT_MAX_CONCURRENT_JOBS
    max_waiting_jobs: int = DEFAULT_MAX_WAITING_JOBS
    large_model: str = ""


def model_name(session_model: str) -> str:
    """The everything model beside a session model (``sam2_session``: ``sam2_everything``)."""
    prefix = session_model.removesuffix("_session")
    return f"{prefix}_everything"
