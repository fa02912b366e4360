"""The session model's store of image features: an LRU of tenant-scoped entries, with kept
logits per image and a separate small area for crops (standard library and numpy only).

Driven from the model's one event loop, so no locks. Two areas, each an
:class:`~triton_sam.serving.cache.LruCache` shared fairly between tenants:

- **images**: what clients embed (and the everything model's whole image), bounded by
  ``max_images`` and ``max_bytes``;
- **crops**: what the everything model embeds for its crop layers (request parameter
  ``protocol.CACHE_AREA`` = ``CROPS_AREA``), at most ``protocol.CROP_AREA_IMAGES`` entries.
  A crop is used once per job, so crops churn among themselves and never displace an image
  a user is clicking on. The area holds one layer-1 job's crops, so a job run again with other
  thresholds encodes none of them again.

An id is looked up in both areas. An image embedded by a client while it is held as a crop
moves into the image area (no encoder run).
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

from .. import cache
from ..protocol import embedding_cache as protocol


class EmbeddingMiss(Exception):
    """An image id (or logits key) this instance does not hold."""


class Scoped(tuple):
    """(tenant, image id): what the cache, the embeds in flight and kept logits are keyed by."""

    __slots__ = ()

    def __new__(cls, tenant, image_id):
        return super().__new__(cls, (tenant, image_id))

    tenant = property(lambda self: self[0])
    image_id = property(lambda self: self[1])


class Entry:
    """One image's cached features, its original size and the logits kept on it."""

    __slots__ = ("features", "feature_bytes", "logits", "hw")

    def __init__(self, features, feature_bytes, hw=None):
        self.features = features  # name -> pb_utils.Tensor (GPU) or np.ndarray (CPU)
        self.feature_bytes = feature_bytes
        self.hw = hw  # (H, W) of the original image; None when embedded as a float tensor
        self.logits = OrderedDict()  # issued key -> np.ndarray [1, M, S, S], LRU order

    @property
    def nbytes(self):
        return self.feature_bytes + sum(a.nbytes for a in self.logits.values())


class EmbeddingCache:
    """LRU of image features (+ a few kept low-res logits per image), bounded in count and bytes.

    Keyed by :class:`Scoped` (tenant, image id); the bounds are shared fairly between tenants
    (``serving/cache.py``). The most recently inserted image is never evicted by its own
    insertion, so one image larger than ``max_bytes`` is still served (alone). Crops live in
    their own area of at most ``crop_images`` entries (module docstring).
    """

    def __init__(
        self,
        max_images,
        max_bytes=0,
        logits_per_image=4,
        crop_images=protocol.CROP_AREA_IMAGES,
    ):
        if max_images < 1:
            raise ValueError(f"max_images: got {max_images}, expected >= 1")
        self.max_images = int(max_images)
        self.max_bytes = int(max_bytes)  # 0 = no byte bound
        self.logits_per_image = int(logits_per_image)
        # an image evicted from the image area can go to the feature store (on_evict, disk.py);
        # crops are used once per job and are not kept past their area
        self._lru = cache.LruCache(self.max_images, self.max_bytes)
        self._crops = cache.LruCache(max(1, int(crop_images)))

    nbytes = property(lambda self: self._lru.nbytes + self._crops.nbytes)

    def on_evict(self, callback):
        """Call ``callback(scoped, entry)`` for each image the image area evicts."""
        self._lru.on_evict = callback

    evictions = property(lambda self: self._lru.evictions + self._crops.evictions)

    def __len__(self):
        return len(self._lru) + len(self._crops)

    def __contains__(self, scoped):
        return scoped in self._lru or scoped in self._crops

    def ids(self, *, crops=False):
        """Cached (tenant, image id) keys of one area, least recently used first."""
        return (self._crops if crops else self._lru).keys()

    def get(self, scoped):
        """The features of ``scoped`` (marked most recently used); EmbeddingMiss if absent."""
        return self.entry(scoped).features

    def entry(self, scoped):
        """The :class:`Entry` of ``scoped`` (marked most recently used); EmbeddingMiss if absent."""
        return self._entry(scoped, touch=True)

    def put(self, scoped, features, feature_bytes, hw=None, *, crop=False):
        """Keep ``features`` under ``scoped`` (in the crop area when ``crop``); returns the
        keys evicted to stay in bounds (from that area only)."""
        entry = Entry(features, int(feature_bytes), hw)
        area = self._crops if crop else self._lru
        (self._lru if crop else self._crops).pop(scoped)
        return area.put(scoped, entry, entry.nbytes, owner=scoped.tenant)

    def hit(self, scoped, *, crop=False):
        """An embed of an image already held: ``(entry, evicted)``, or ``(None, [])``.

        The entry is marked most recently used in its area; a client's embed (``crop``
        False) of an image held as a crop moves it into the image area.
        """
        if scoped in self._lru:
            return self._lru.get(scoped), []
        entry = self._crops.get(scoped)
        if entry is None or crop:
            return entry, []
        self._crops.pop(scoped)
        return entry, self._lru.put(scoped, entry, entry.nbytes, owner=scoped.tenant)

    def keep_logits(self, scoped, logits):
        """Keep low-res logits of a prediction on ``scoped`` under a fresh random key.

        Returns:
            ``(key, evicted)``: the key issued ("" when nothing is kept: the image was
            evicted meanwhile, or ``logits_per_image`` is 0) and the keys evicted.
        """
        area = self._crops if scoped in self._crops else self._lru
        entry = area.peek(scoped)
        if entry is None or self.logits_per_image < 1:
            return "", []
        key = secrets.token_hex(protocol.ISSUED_KEY_BYTES)
        entry.logits[key] = logits
        while len(entry.logits) > self.logits_per_image:
            entry.logits.popitem(last=False)
        return key, area.put(scoped, entry, entry.nbytes, owner=scoped.tenant)

    def original_size(self, scoped):
        """(H, W) of the image embedded under ``scoped``, or None (float-tensor embed)."""
        return self._entry(scoped, touch=False).hw

    def get_logits(self, scoped, key):
        """Logits this cache issued ``key`` for on ``scoped``; EmbeddingMiss otherwise."""
        entry = self._peek(scoped)
        logits = None if entry is None or not key else entry.logits.get(key)
        if logits is None:  # the key itself stays out of messages: it is a capability
            raise EmbeddingMiss(
                f"{protocol.PREVIOUS_KEY}: no low-res logits kept under this key for image_id "
                f"{scoped.image_id!r}"
            )
        entry.logits.move_to_end(key)
        return logits

    def _peek(self, scoped):
        entry = self._lru.peek(scoped)
        return self._crops.peek(scoped) if entry is None else entry

    def _entry(self, scoped, *, touch):
        if not touch:
            entry = self._peek(scoped)
        else:
            entry = self._lru.get(scoped)
            entry = self._crops.get(scoped) if entry is None else entry
        if entry is None:
            raise EmbeddingMiss(f"image_id {scoped.image_id!r} is not cached")
        return entry
