"""Large images and volumes read where they live, under the operator's data roots.

- :func:`open_source`: zarr v2/v3, OME-Zarr, N5 and TIFF (BigTIFF, OME-TIFF, pyramidal
  slides) as one :class:`Source` whose reads decode only the chunks they touch;
- :class:`DataRoots`: where datasets may be read from, per tenant;
- :mod:`.pixels`: the one mapping of intensities to SAM's uint8 RGB.

Shipped into Triton's stub with the ``<family>_large`` model: standard library and numpy at
import; tensorstore (zarr, N5) and tifffile with zarr (TIFF), the ``large`` extra, are
imported when a dataset of their format is opened. They run on the project venv's Python 3.11
and the GPU container's 3.10 (requirements/lock-container.txt). docs/datasets.md has the
formats, roots and mappings for users.
"""

from .formats import open_source
from .roots import DataRoots
from .source import MAX_CHUNK_BYTES, Source

__all__ = ["MAX_CHUNK_BYTES", "DataRoots", "Source", "open_source"]
