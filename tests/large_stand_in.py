"""Stand-ins for the large model's unit tests: the session model (a deterministic "SAM"
that segments bright pixels) and the readers' interface (``serving/datasets``), so the
ops are tested without Triton, models or the readers."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from triton_sam.serving import masks
from triton_sam.serving import protocol as envelope
from triton_sam.serving.bounds import RequestError


class Session:
    """``embed`` / ``probe`` / ``predict`` as ``serving/large/bls.py`` offers them. Its
    "mask" is the block's bright pixels (red channel > 127); ``multimask`` gives that mask
    three times with falling scores. ``forget()`` drops every embedding (an eviction)."""

    def __init__(self) -> None:
        self.images: dict[tuple[str, str], np.ndarray] = {}
        self.encoded = 0
        self.predicted: list[dict] = []

    async def embed(self, tenant, rgb):
        assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3
        image_id = hashlib.sha256(rgb.tobytes() + str(rgb.shape).encode()).hexdigest()[:32]
        ran = (tenant, image_id) not in self.images
        self.encoded += ran
        self.images[(tenant, image_id)] = rgb
        return image_id, ran

    async def probe(self, tenant, image_id):
        return (tenant, image_id) in self.images

    async def predict(self, tenant, image_id, points, labels, box, multimask):
        rgb = self.images.get((tenant, image_id))
        if rgb is None:
            raise envelope.ProtocolError(envelope.ERR_EMBEDDING_NOT_FOUND, "image_id: miss")
        self.predicted.append(
            {"points": points, "labels": labels, "box": box, "shape": rgb.shape[:2]}
        )
        mask = rgb[..., 0] > 127
        counts = masks.encode_rle(mask)
        return [(counts, 0.9 - 0.1 * i) for i in range(3 if multimask else 1)]

    def forget(self) -> None:
        self.images.clear()


class Pixels:
    """The mapping functions of ``serving/datasets/pixels.py`` for kinds none and range."""

    @staticmethod
    def parse_mapping(obj, dtype, field):
        obj = obj if obj is not None else {"kind": "none"}
        if not isinstance(obj, dict) or obj.get("kind") not in ("none", "range"):
            raise RequestError(field, f"got {obj!r}")
        return dict(obj)

    @staticmethod
    def resolve_mapping(mapping, source, sample_pixels, z):
        return {**mapping, "resolved": True}

    @staticmethod
    def to_rgb(block, mapping):
        if mapping["kind"] == "range":
            lo, hi = mapping["min"], mapping["max"]
            block = np.clip((block.astype(np.float64) - lo) / (hi - lo) * 255, 0, 255)
        block = block.astype(np.uint8)
        return np.repeat(block[..., None], 3, axis=2) if block.ndim == 2 else block

    @staticmethod
    def mapping_json(mapping):
        return json.loads(json.dumps(mapping))


class Source:
    """An in-memory dataset as the readers open one."""

    def __init__(self, array: np.ndarray, axes: str = "yx") -> None:
        self.array, self.axes = array, axes
        self.shape, self.dtype, self.levels = array.shape, array.dtype, (array.shape,)
        self.closed = False

    def read(self, rows, cols, z=None, level=0):
        return np.array(self.array[rows, cols] if z is None else self.array[z, rows, cols])

    def close(self):
        self.closed = True


class Datasets:
    """``DataRoots`` and ``open_source``: one root ``lab`` for tenant ``""`` and ``"a"``,
    holding the arrays of ``files``."""

    def __init__(self, files: dict[str, np.ndarray]) -> None:
        self.files, self.opened = files, []
        outer = self

        class DataRoots:
            @staticmethod
            def from_json(text):
                return Roots(json.loads(text) if text else {})

        class Roots:
            def __init__(self, roots):
                self.roots = roots

            def resolve(self, dataset, tenant, field):
                root, _, rest = dataset.partition("/")
                allowed = self.roots.get(root, {}).get("tenants")
                if root not in self.roots or (allowed is not None and tenant not in allowed):
                    raise RequestError(field, f"{dataset!r}: no such data root for you")
                if ".." in rest.split("/") or rest not in outer.files:
                    raise RequestError(field, f"{dataset!r}: refused")
                return rest

        self.DataRoots = DataRoots

    def open_source(self, path, key, field):
        source = Source(self.files[path])
        self.opened.append(source)
        return source
