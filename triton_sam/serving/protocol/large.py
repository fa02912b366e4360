"""The ``<family>_large`` model: images larger than SAM's input, clicked at full resolution.

An EM section, a slide or a volume's slice is 10,000-100,000 px a side; SAM's encoder sees
1024. The large model holds such an image on the server under a handle it issues, cuts it into
tiles (:mod:`triton_sam.serving.tiles`), embeds a tile only when a prompt or a precompute
needs it (each tile is one image to the family's session model, ``<family>_session``, over
BLS: its cache, admission and tenancy apply unchanged) and answers masks in full-image pixels
as a crop and its offset, so the bytes of a click never grow with the image.

Transport: one request, one answer (not decoupled: HTTP and gRPC both work, curl too).

Inputs (no batch dimension):

- ``request`` (BYTES [1]): a UTF-8 JSON object, its ``op`` one of :data:`OPS`.
- ``pixels`` (UINT8 / UINT16 / FLOAT32 [h, w, c], optional): the piece a ``put`` writes
  (``c`` = 1 for a grey image); refused with any other op. A Triton input has one datatype,
  so the piece goes in the input of its dtype, :data:`PIXEL_INPUTS` (``pixels`` for uint8).

Outputs: ``answer`` (BYTES [1]): a UTF-8 JSON object, fields by op below; ``rgb`` (UINT8
[h, w, 3]): the pixels a ``read`` answers (asked for by name; absent otherwise).

Ops (``field``: meaning; every request may carry ``"op"`` only once):

- ``open``: ``dataset`` (``"<root>/<path inside it>"``, a data root the operator configured,
  ``data_roots``), optional ``key`` (an array inside a zarr/N5 group, or an OME-Zarr
  multiscale level as ``"0"``), ``mapping`` (:data:`MAPPING_KINDS`, below), ``tile`` and
  ``halo`` ([rows, cols]: the server's defaults when absent; a tile at least
  :data:`MIN_TILE`, a tile plus twice its halo at most ``max_block`` a side). Nothing is
  embedded. Answers :data:`IMAGE_FIELDS`.
- ``create``: an image the client holds, sent once in pieces: ``shape`` ([rows, cols] or
  [rows, cols, channels], or [z, rows, cols(, channels)]), ``dtype`` (:data:`DTYPES`),
  ``mapping``, ``tile``, ``halo``, optional ``axes`` (``"yxc"`` or ``"zyx"`` when three
  sides are ambiguous; by default 3 sides are [rows, cols, channels] when the last is 1 or
  3). Answers :data:`IMAGE_FIELDS`; ``complete`` stays false
  until every pixel has been put.
- ``put``: ``handle``, ``offset`` ([row, col] or [z, row, col]) + the ``pixels`` input: one
  piece, inside the shape, at most ``max_piece_pixels`` pixels. Answers ``received`` (pixels
  written so far) and ``complete``.
- ``predict``: ``handle``, optional ``z`` (volumes), ``points`` ([[x, y], ...] full-image
  pixels, x = column), ``labels`` ([1/0, ...]), ``box`` ([x0, y0, x1, y1]),
  ``multimask_output`` (bool, default false), ``mode`` (:data:`MODES`, default ``auto``).
  Answers ``image_size`` [rows, cols], ``masks`` (a list of :data:`MASK_FIELDS` objects,
  best first when ``multimask_output``), ``tiles`` (the ids of the tiles or windows the
  masks were computed on), ``embedded`` (how many encoder runs this request caused),
  ``mode`` (the rule that answered: ``tile`` or ``window``), ``block`` ([row0, col0, row1,
  col1): the pixels it was computed on), ``dropped`` (points outside that block, left out),
  ``image_id`` (the session model's id of that block: a client may send a later click on the
  same tile to ``<family>_session`` with it, and cut the crop itself, as
  ``client/large_clicks.py`` does; the id is bound to the tenant, like every image id).
- ``embed``: ``handle``, optional ``z``, ``tiles`` (a list of tile ids, at most
  ``max_tiles_per_request``): embeds those tiles (precompute). Answers ``embedded`` (ids
  the encoder ran for) and ``held`` (ids already cached).
- ``status``: ``handle``, optional ``z``: answers :data:`IMAGE_FIELDS` plus ``held`` (the tile
  ids whose features the session model holds now: a precompute resumes from them).
- ``read``: ``handle``, optional ``z``, ``block`` ([row0, col0, row1, col1] full-image
  pixels), optional ``level`` (a pyramid level of the source, default 0; ``block`` stays in
  level-0 pixels): answers the block's pixels as SAM sees them (the mapping applied), in the
  ``rgb`` output (UINT8 [h, w, 3]), and ``size`` [h, w] in the JSON. At most ``max_block``
  pixels a side are read: what the everything model reads a tile by, and the page's tile
  pyramid.
- ``close``: ``handle``: forgets it (its uploaded pixels are deleted).

Modes of a prediction:

- ``tile``: micro-sam's rule (``micro_sam/prompt_based_segmentation.py``, ``_points_to_tile``;
  :meth:`~triton_sam.serving.tiles.TileGrid.tile_of`): the tile under the prompts' centre,
  embedded with its halo; points outside that block are dropped and the mask ends at it.
- ``window``: a window of ``window`` pixels a side centred on the prompts
  (:func:`~triton_sam.serving.tiles.window_around`), embedded as its own image.
- ``auto`` (the default): ``tile``, unless its mask touches the edge of its block where the
  image goes on; then ``window``, centred on the prompts and that mask: an object that crosses
  tile edges comes back whole when it fits in a window.

Mappings (intensities -> SAM's uint8 RGB; one function does it in the server, the Python
client and the page, :mod:`triton_sam.serving.datasets.pixels`), ``mapping`` an object:

- ``{"kind": "none"}``: uint8 pixels as they are (grey replicated to 3 channels); the default
  for uint8 images, and exactly what the session model does with a small image.
- ``{"kind": "range", "min": a, "max": b}``: linear, a -> 0, b -> 255, clipped.
- ``{"kind": "percentile", "low": 1.0, "high": 99.0}``: ``range`` with a and b the
  percentiles of the image, estimated at ``open`` from at most ``sample_pixels`` pixels
  (the coarsest pyramid level, or a strided read); the default for other dtypes.
- ``{"kind": "tile_minmax"}``: each embedded block stretched from its own min to max per
  channel, as micro-sam does (``micro_sam/util.py`` ``_to_image``): what parity with
  micro-sam's tiled embeddings needs.

Handles are capabilities: 128 random bits as 32 hex characters, issued by the server, bound
to the tenant that opened them; any other value is a miss (``NotFound`` code
:data:`ERR_HANDLE_NOT_FOUND`, as a restart or eviction gives). Errors: the envelope of
:mod:`triton_sam.serving.protocol` (``InvalidInput`` naming the JSON field as ``request.<name>``,
``LimitExceeded`` past a bound, ``Overloaded`` past admission).
"""

from dataclasses import dataclass

from . import ERR_HANDLE_NOT_FOUND, KIND_LARGE_IMAGE, KIND_PARAM

__all__ = ["ERR_HANDLE_NOT_FOUND"]  # re-exported: the code this model answers a miss with

KIND = KIND_LARGE_IMAGE

REQUEST = "request"  # BYTES [1] input: the JSON request
PIXELS = "pixels"  # UINT8 input: one piece of a put
# The input a put's piece goes in, by the image's dtype (a Triton input has one datatype).
PIXEL_INPUTS = {"uint8": PIXELS, "uint16": "pixels_uint16", "float32": "pixels_float32"}
ANSWER = "answer"  # BYTES [1] output: the JSON answer
RGB = "rgb"  # UINT8 [h, w, 3] output: the pixels of a read

OPS = ("open", "create", "put", "predict", "embed", "status", "read", "close")
MODES = ("auto", "tile", "window")
MAPPING_KINDS = ("none", "range", "percentile", "tile_minmax")
DTYPES = ("uint8", "uint16", "float32")
# What open, create and status answer about an image.
IMAGE_FIELDS = (
    "handle",  # the server-issued capability
    "shape",  # the full shape, as opened (z first for volumes, channels last)
    "dtype",
    "axes",  # "yx", "yxc", "zyx" or "zyxc"
    "tile",  # [rows, cols] of a tile's core
    "halo",  # [rows, cols] of context around a tile
    "grid",  # [tile rows, tile cols]
    "window",  # [rows, cols] of a window
    "mapping",  # the mapping as resolved (percentiles turned into min/max)
    "complete",  # every pixel is there (a created image: every piece put)
)
# One mask of a prediction: the pixels of its bounding box as COCO compressed RLE
# (column-major, as pycocotools writes it) of ``size``, placed at ``offset`` in the image.
MASK_FIELDS = (
    "offset",  # [row, col] of the crop's top-left pixel in the full image
    "size",  # [rows, cols] of the crop (0, 0 for an empty mask)
    "counts",  # COCO compressed RLE of the crop
    "box",  # [x0, y0, x1, y1] in full-image pixels, inclusive ends as the session's boxes
    "score",  # SAM's predicted IoU
    "area",  # pixels in the mask
    "cut",  # true when the mask touches its block's edge where the image goes on
)

# The data roots at serve time: the tritonserver process's environment (JSON as the
# ``data_roots`` parameter), set by `triton-sam serve --data-root` or compose; it wins over
# the parameter.
DATA_ROOTS_ENV = "TRITON_SAM_DATA_ROOTS"

# Config parameters (written by repository/large_config.py, read by large_model.py).
PARAM_KIND = KIND_PARAM
DEFAULT_TILE = 768  # core; with the halo the outer block is 1024: SAM's input, no resampling
DEFAULT_HALO = 128
DEFAULT_WINDOW = 1024
MIN_TILE = 64
DEFAULT_MAX_BLOCK = 2048  # a tile with its halo, or a window: pixels a side read per embed
DEFAULT_MAX_HANDLES = 64  # per tenant; the least recently used goes first
DEFAULT_MAX_UPLOAD_BYTES = 8 * 2**30  # per tenant, on disk (the spool)
DEFAULT_MAX_PIECE_PIXELS = 4096 * 4096
DEFAULT_MAX_TILES_PER_REQUEST = 16
DEFAULT_SAMPLE_PIXELS = 4 * 2**20
DEFAULT_MAX_REQUEST_BYTES = 64 * 2**10
DEFAULT_MAX_CONCURRENT_OPENS = 2
DEFAULT_MAX_WAITING_OPENS = 8
# A put's piece is held in memory from its arrival until it is on disk: pieces in work at once
# are bounded, so a burst of uploads never grows the server's memory past a few pieces.
DEFAULT_MAX_CONCURRENT_PUTS = 2
DEFAULT_MAX_WAITING_PUTS = 4


@dataclass(frozen=True)
class LargeSettings:
    """The large model's config parameters (field names are the parameter keys).

    Attributes:
        family: ``"sam1"`` / ``"sam2"``.
        session_model: the model each tile is embedded and decoded by.
        data_roots: JSON ``{"<name>": {"path": "/abs/dir", "tenants": ["a", ...]}}``; a root
            without ``tenants`` is every tenant's. Empty: no dataset can be opened.
        spool_dir: where created images' pixels are written (empty: a private temporary
            directory, removed at shutdown).
        tile, halo, window: pixels a side (core, context, window), the defaults.
        max_block: the largest tile-plus-halo or window a request may ask for, a side.
        max_handles: open images per tenant.
        max_upload_bytes: created images' pixels per tenant, on disk.
        max_piece_pixels: pixels of one ``put``.
        max_tiles_per_request: tiles of one ``embed``.
        sample_pixels: pixels read to estimate a percentile mapping.
        max_request_bytes: the JSON request's bound.
        max_concurrent_opens, max_waiting_opens: admission of opens and creates.
        max_concurrent_puts, max_waiting_puts: admission of puts (each holds its piece in
            memory until it is written); beyond them ``Overloaded``, which clients retry.
    """

    family: str
    session_model: str
    data_roots: str = ""
    spool_dir: str = ""
    tile: int = DEFAULT_TILE
    halo: int = DEFAULT_HALO
    window: int = DEFAULT_WINDOW
    max_block: int = DEFAULT_MAX_BLOCK
    max_handles: int = DEFAULT_MAX_HANDLES
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    max_piece_pixels: int = DEFAULT_MAX_PIECE_PIXELS
    max_tiles_per_request: int = DEFAULT_MAX_TILES_PER_REQUEST
    sample_pixels: int = DEFAULT_SAMPLE_PIXELS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_concurrent_opens: int = DEFAULT_MAX_CONCURRENT_OPENS
    max_waiting_opens: int = DEFAULT_MAX_WAITING_OPENS
    max_concurrent_puts: int = DEFAULT_MAX_CONCURRENT_PUTS
    max_waiting_puts: int = DEFAULT_MAX_WAITING_PUTS


def model_name(session_model: str) -> str:
    """The large model beside a session model (``sam2_session``: ``sam2_large``)."""
    return f"{session_model.removesuffix('_session')}_large"
