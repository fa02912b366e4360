"""Concept tracking's answers written as OME-Zarr label volumes, section by section.

A z-stack tracked as a video (``frame_index`` = z) answers, per section, every instance of
each prompt with its object id (:class:`~triton_sam.serving.concept_video.results.FrameResult`).
:class:`OmeZarrLabelWriter` paints them into label images of an OME-Zarr image (NGFF 0.4,
zarr v2: what napari-ome-zarr, Fiji/MoBIE and ``ome-zarr-py`` read):

```
volume.zarr/                 the image (an existing OME-Zarr image, or one written here)
  labels/                    .zattrs {"labels": ["prompt-0", "prompt-1"]}
    prompt-0/                one label image per prompt: image-label + multiscales, and the
      0/                     prompt's phrase under "triton_sam"; uint32 (Z, Y, X),
                             object_id + 1 per voxel, 0 background, one chunk row per section
```

One label image per prompt because post-processing keeps the objects of *one* prompt apart
only: objects of two prompts may share voxels, and one volume per prompt keeps both. Label
images are named ``prompt-<id>`` (a phrase is not a safe path component); the phrase is in
their attributes. Each section is written whole when it arrives, so memory holds one
section per prompt, never the volume. zarr (the ``large`` extra) is imported when a writer
is opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from triton_sam.errors import InputValidationError
from triton_sam.serving.concept_video.results import FrameResult

NGFF_VERSION = "0.4"
LABEL_DTYPE = np.uint32  # object ids are ints from 0 up; id + 1 is the label (0 background)
AXES = [{"name": n, "type": "space"} for n in ("z", "y", "x")]
IMAGE_PATH = "0"  # the image's and each label image's full-resolution level
# chunk keys "z/y/x" (NGFF 0.4 asks for the "/" separator in zarr v2)
_NESTED = {"name": "v2", "separator": "/"}


def label_name(prompt_id: int) -> str:
    """The label image of a prompt: ``prompt-<id>``."""
    return f"prompt-{int(prompt_id)}"


class OmeZarrLabelWriter:
    """Writes per-section instance masks into one OME-Zarr label image per prompt.

    Args:
        root: the OME-Zarr image folder. If it holds an OME-Zarr image already, its level 0
            must be (Z, Y, X) = ``shape`` (channels aside) and the labels take its scale;
            otherwise ``image`` is written there as a new one-level image.
        prompts: prompt id -> phrase, for every prompt whose objects will be written.
        shape: (Z, Y, X) of the volume (for an existing image: checked against it).
        image: (Z, Y, X) pixels of the volume, for a root that is not an image yet
            (written chunk by chunk from any sliceable array).
        scale: (z, y, x) voxel size for a new image (default 1, 1, 1).
        chunk_yx: (y, x) chunk size of the label arrays (z chunks are one section).

    Raises:
        InputValidationError: ``shape`` not 3-d or not matching the existing image; no
            ``image`` for a new root, or one of another shape; no prompts; a ``root`` that
            holds something other than an OME-Zarr (NGFF 0.4) image.
    """

    def __init__(
        self,
        root: str | Path,
        prompts: Mapping[int, str],
        shape: tuple[int, int, int],
        *,
        image: Any = None,
        scale: tuple[float, float, float] = (1.0, 1.0, 1.0),
        chunk_yx: tuple[int, int] = (512, 512),
    ) -> None:
        import zarr  # the large extra: imported only when labels are written

        shape = tuple(int(v) for v in shape)
        if len(shape) != 3 or min(shape) < 1:
            raise InputValidationError("shape", f"got {shape}, expected (Z, Y, X), each >= 1")
        if not prompts:
            raise InputValidationError("prompts", "got none, expected at least one prompt")
        self.root = Path(root)
        self.shape = shape
        existing = None
        if (self.root / ".zattrs").is_file():
            existing = zarr.open_group(self.root, mode="r").attrs.get("multiscales")
        if not existing and self.root.exists() and any(self.root.iterdir()):
            # never write into a folder that holds something else (a zarr v3 / NGFF 0.5
            # image included: these labels are NGFF 0.4, zarr v2)
            raise InputValidationError(
                "root",
                f"{self.root} exists and is not an OME-Zarr (NGFF 0.4, zarr v2) image; "
                "expected such an image or a new folder",
            )
        if existing:
            scale = self._check_existing(zarr.open_group(self.root, mode="r"), existing)
        elif image is None or tuple(image.shape) != shape:
            got = "none" if image is None else f"shape {tuple(image.shape)}"
            raise InputValidationError(
                "image",
                f"got {got}, but {self.root} is not an OME-Zarr image yet; expected "
                f"the volume's {shape} pixels, or the path of an existing OME-Zarr image",
            )
        # checked first, written after: a refused writer leaves nothing behind
        group = zarr.open_group(self.root, mode="a", zarr_format=2)
        if not existing:
            self._write_image(group, image, scale)
        labels = group.require_group("labels")
        names = [label_name(p) for p in prompts]
        listed = [n for n in labels.attrs.get("labels", []) if n not in names]
        labels.attrs["labels"] = listed + names
        chunks = (1, min(chunk_yx[0], shape[1]), min(chunk_yx[1], shape[2]))
        self._arrays = {}
        for prompt_id, phrase in prompts.items():
            name = label_name(prompt_id)
            label = labels.require_group(name)
            label.attrs.update(
                {
                    "multiscales": [_multiscale(name, scale)],
                    "image-label": {"version": NGFF_VERSION, "source": {"image": "../../"}},
                    "triton_sam": {"prompt": phrase, "prompt_id": int(prompt_id)},
                }
            )
            self._arrays[int(prompt_id)] = label.create_array(
                IMAGE_PATH, shape=shape, chunks=chunks, dtype=LABEL_DTYPE, fill_value=0,
                overwrite=True, chunk_key_encoding=_NESTED,
            )  # fmt: skip

    def _check_existing(self, group: Any, multiscales: list) -> tuple[float, float, float]:
        """The existing image's level-0 scale (z, y, x), after checking its shape."""
        level = multiscales[0]["datasets"][0]
        names = [a if isinstance(a, str) else a.get("name") for a in multiscales[0]["axes"]]
        shape = dict(zip(names, group[level["path"]].shape, strict=True))
        found = tuple(shape.get(axis, 0) for axis in ("z", "y", "x"))
        if found != self.shape:
            raise InputValidationError(
                "shape",
                f"got {self.shape}, but the OME-Zarr image at {self.root} is "
                f"(Z, Y, X) = {found}; expected the same",
            )
        for transform in level.get("coordinateTransformations", []):
            if transform.get("type") == "scale":
                by_axis = dict(zip(names, transform["scale"], strict=True))
                return tuple(float(by_axis[a]) for a in ("z", "y", "x"))
        return (1.0, 1.0, 1.0)

    def _write_image(self, group: Any, image: Any, scale: tuple[float, float, float]) -> None:
        array = group.create_array(
            IMAGE_PATH, shape=self.shape, chunks=(1, *self.shape[1:]),
            dtype=np.dtype(image.dtype), overwrite=True, chunk_key_encoding=_NESTED,
        )  # fmt: skip
        for z in range(self.shape[0]):  # one section at a time: the volume may not fit in memory
            array[z] = np.asarray(image[z])
        group.attrs["multiscales"] = [_multiscale(self.root.stem, scale)]

    def write(self, z: int, result: FrameResult) -> None:
        """Paint one section's answer: each prompt's objects as ``object_id + 1``.

        Args:
            z: the section (the frame index of the answer, in a z-stack).
            result: its instances; masks bool [K, Y, X] at the volume's (Y, X).

        Raises:
            InputValidationError: ``z`` outside the volume, masks of another size, or an
                object of a prompt the writer was not opened with.
        """
        if not 0 <= z < self.shape[0]:
            raise InputValidationError("z", f"got {z}, expected 0 <= z < {self.shape[0]}")
        if result.masks.shape[1:] != self.shape[1:]:
            raise InputValidationError(
                "result.masks",
                f"got sections of {result.masks.shape[1:]}, expected {self.shape[1:]}",
            )
        unknown = sorted(set(result.prompt_ids.tolist()) - set(self._arrays))
        if unknown:
            raise InputValidationError(
                "result.prompt_ids",
                f"got prompts {unknown}, expected some of {sorted(self._arrays)}",
            )
        for prompt_id, array in self._arrays.items():
            section = np.zeros(self.shape[1:], LABEL_DTYPE)
            rows = np.flatnonzero(result.prompt_ids == prompt_id)
            for row in rows:  # objects of one prompt do not overlap after post-processing
                section[result.masks[row]] = LABEL_DTYPE(result.object_ids[row] + 1)
            array[z] = section


def _multiscale(name: str, scale: tuple[float, float, float]) -> dict:
    """One-level NGFF 0.4 ``multiscales`` entry for a (Z, Y, X) image."""
    return {
        "version": NGFF_VERSION,
        "name": name,
        "axes": AXES,
        "datasets": [
            {
                "path": IMAGE_PATH,
                "coordinateTransformations": [{"type": "scale", "scale": list(scale)}],
            }
        ],
    }
