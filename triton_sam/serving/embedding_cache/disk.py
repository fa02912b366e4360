"""Image features past the session cache's bounds, kept on disk (the feature store).

A lab precomputing a 20,000 px section embeds ~500 tiles: far more than the in-memory cache
holds (``max_images``, ``max_bytes``). Features the cache evicts from its image area are
written here instead of being lost, and a later request for them (a click, a probe, the
same picture embedded again) reads them back instead of running the encoder: a disk read of
a few MiB against an encoder run of a second or more.

- **Bounded per tenant.** At most ``max_bytes`` on disk, shared fairly between the tenants
  holding files (the same rule as the cache, :class:`~triton_sam.serving.cache.LruCache`);
  the least recently used file of a tenant above its share is deleted first.
- **Tenants never meet.** A file lives under a directory named by a hash of its tenant, named
  by a hash of its image id (ids are content hashes: the same picture under the same models
  has the same id on every replica, never a name a client chose), so one tenant's request
  never reaches another's features.
- **Shared by replicas.** Put it on a volume that replicas mount: a file another replica
  wrote is found by its name and read (each replica bounds what it wrote and read itself).
  Files are written to a temporary name and renamed, so a reader never sees half a file.
- **Off the clicks' path.** Writes and reads run on the model's intake threads; a click on a
  cached image never touches the disk.

Files hold plain arrays (``numpy.savez``; read back with ``allow_pickle=False``), named by
the encoder's output names, plus the image's original size. A file that does not read back
as exactly those arrays is deleted and counts as a miss.

Standard library and numpy only: shipped with the session model.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
import zipfile

import numpy as np

from .. import cache

HW_KEY = "__original_size__"
MAX_FILES = 1 << 20  # files indexed per replica (the byte bound is the one that binds)
# Evicted images waiting for the disk: past this many, one more is dropped (a later request
# for it encodes again), so a disk slower than the encoder never grows the server's memory.
MAX_PENDING_WRITES = 8


class FeatureStore:
    """Evicted features on disk under ``root``, at most ``max_bytes`` (see the module doc).

    Args:
        root: a directory the operator gave (created if missing).
        max_bytes: bytes of files this replica keeps (fair per tenant).
        names: the encoder outputs a file must hold.
        pool: the executor file I/O runs on.
    """

    def __init__(self, root, max_bytes, names, pool):
        if max_bytes < 1:
            raise ValueError(f"feature_store_bytes: got {max_bytes}, expected >= 1")
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self.names, self.pool = tuple(names), pool
        self.index = cache.LruCache(MAX_FILES, int(max_bytes))
        self.writing = {}  # scoped -> (features, hw) while its write is in flight
        self.writes = self.reads = self.dropped = 0

    def path(self, scoped) -> str:
        """Where the features of ``scoped`` (tenant, image id) live."""
        tenant = hashlib.sha256(f"tenant:{scoped.tenant}".encode()).hexdigest()[:32]
        name = hashlib.sha256(f"image:{scoped.image_id}".encode()).hexdigest()[:40]
        return os.path.join(self.root, tenant, name[:2], name + ".npz")

    async def spill(self, scoped, features, hw) -> None:
        """Write evicted features (name -> host array) and drop the files past the bound."""
        if len(self.writing) >= MAX_PENDING_WRITES:
            self.dropped += 1
            return
        self.writing[scoped] = (features, hw)
        path = self.path(scoped)
        loop = asyncio.get_running_loop()
        try:
            size = await loop.run_in_executor(self.pool, _write, path, features, hw)
        finally:
            self.writing.pop(scoped, None)
        self.writes += 1
        for victim in self.index.put(scoped, path, size, owner=scoped.tenant):
            await loop.run_in_executor(self.pool, _remove, self.path(victim))

    async def restore(self, scoped):
        """``(features, hw)`` of ``scoped`` from disk (a write in flight included), or None."""
        held = self.writing.get(scoped)
        if held is not None:
            return held
        path = self.path(scoped)
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(self.pool, _read, path, self.names)
        if found is None:
            self.index.pop(scoped)
            return None
        self.reads += 1
        features, hw, size = found
        for victim in self.index.put(scoped, path, size, owner=scoped.tenant):
            if victim != scoped:
                await loop.run_in_executor(self.pool, _remove, self.path(victim))
        return features, hw


def host_arrays(features) -> dict | None:
    """The features as host numpy arrays (copied out of the stub's shared memory), or None
    when any of them lives on a GPU (kept in device memory: not spilled)."""
    out = {}
    for name, value in features.items():
        if isinstance(value, np.ndarray):
            out[name] = value
        elif value.is_cpu():
            out[name] = np.array(value.as_numpy())  # the shm block is freed with the entry
        else:
            return None
    return out


def _write(path, features, hw) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arrays = {name: np.ascontiguousarray(value) for name, value in features.items()}
    arrays[HW_KEY] = np.array([-1, -1] if hw is None else hw, np.int64)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)  # readers see the whole file or none
    except BaseException:
        _remove(tmp)
        raise
    return os.path.getsize(path)


def _read(path, names):
    """``(features, hw, size)`` of a file holding exactly ``names``, else None (a bad file
    is deleted: it would never read back)."""
    try:
        size = os.path.getsize(path)
        with np.load(path, allow_pickle=False) as data:
            if set(data.files) != {*names, HW_KEY}:
                raise ValueError(f"arrays {sorted(data.files)}")
            features = {name: np.array(data[name]) for name in names}
            hw = tuple(int(v) for v in data[HW_KEY])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        _remove(path)
        return None
    return features, (None if hw == (-1, -1) else hw), size


def _remove(path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
