"""The HDF5 feature cache: frozen CLIP image features, encoded once per image view and read by every later run.

Layout (plain HDF5, readable with h5py alone)
---------------------------------------------
One file per (dataset, backbone weights, transform)::

    <cache root>/<dataset>/<backbone fingerprint[:12]>-<transform fingerprint[:12]>.h5

==================  =================  ===================================================================
name                shape / type       meaning
==================  =================  ===================================================================
``keys``            (N,) utf-8 str     image path relative to the dataset folder (``Datum.key``); row i
``image_ids``       (N,) utf-8 str     identity of the file row i was encoded from: ``"<size>:<mtime_ns>"``
                                       or ``"b2:<content hash>"`` (:mod:`atlas_fast.data.identity`)
``features``        (N, 1+V, D)        un-normalised image features (``encode_image`` output) of row i,
                    float16/float32    view v; view 0 = test transform, views 1..V = seeded augmentations
``done``            (N, 1+V) bool      True once ``features[i, v]`` is written; anything else is garbage
==================  =================  ===================================================================

A row is found by its (key, image id) pair, so an image replaced in place, or another dataset that shares the name
and a relative path, gets a row of its own and is encoded afresh; features are never reused across files that
differ. ``features`` and ``done`` carry HDF5's fletcher32 checksum per chunk; ``keys_digest`` (file attribute) is
a BLAKE2b of the keys and image ids, which HDF5 cannot checksum (variable-length strings take no filters); the other
attributes are compared with what the caller expects on every open. (The default HDF5 file format is kept: the
1.10 format checksums its headers too, but marks a file "open for writing" while a writer has it, so a writer killed
at the wrong millisecond would leave a file no reader can open.)

File attributes: ``format`` ("atlas_fast.feature_cache"), ``format_version``, ``dataset``,
``backbone_fingerprint``, ``backbone_config`` / ``backbone_architecture`` (JSON), ``transform_fingerprint``,
``transform`` (JSON, see :mod:`atlas_fast.clip.transforms`), ``preprocessing`` (JSON), ``encode_precision``
(fp32/fp16/bf16 autocast), ``storage_dtype``, ``embed_dim``, ``keys_digest``, ``created_utc``,
``atlas_fast_version``. Reading view 0 of some images with h5py alone::

    with h5py.File(path, "r") as f:
        row = {k: i for i, k in enumerate(f["keys"].asstr()[...])}  # the last row of a key is the newest
        i = row["images/abyssinian_1.jpg"]; assert f["done"][i, 0]
        feature = f["features"][i, 0].astype("float32")

Self-checking: the attributes are compared on every open with what the caller's backbone and transform produce
(and with the file's own name); any disagreement raises :class:`CacheMismatchError`, so features of other weights,
another transform or another augmentation seed are never silently reused.

Concurrency: ``fcntl.flock`` on two side files. ``<file>.lock`` is taken *shared* by readers and *exclusive* by a
writer for the few milliseconds of one write transaction (open, write a batch of features, flush, mark them done,
close), so a reader sees only committed batches. ``<file>.build.lock`` is held exclusively for a whole build, so a
second builder waits, then encodes only what the first one left missing (no duplicate work, no interleaved
writes). HDF5's SWMR mode was not used: it admits a single writer for the file's lifetime, forbids creating
datasets or attributes while readers are open, and needs ``libver="latest"``; flock works with the default format
and lets successive processes extend a file. HDF5's own file locking is switched off (our locks supersede it and
it fails on some network file systems).

Resumability: every batch is a committed transaction (features written and flushed before their ``done`` flags),
so a build that is interrupted keeps every batch finished before the one in flight; rebuilding encodes only the
rest. (A hard kill in the middle of a transaction's few milliseconds can damage the file; opening it then raises an
error naming it and telling to delete it.)

Disk space: a build first compares the space its missing features need with the free space and refuses before
encoding; each transaction then reserves the bytes it may add (``posix_fallocate``) *before* HDF5 touches the file,
so running out of space (or into a file-size limit) mid-build raises :class:`CacheSpaceError` with every finished
batch intact and readable. A complete cache in a read-only folder is read without any lock file or write.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Sequence

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from atlas_fast.progress import progress_bar, say

import atlas_fast
from atlas_fast.clip.backbones import Backbone
from atlas_fast.data.base import Datum
from atlas_fast.data.identity import image_identities
from atlas_fast.files import check_folder_name
from atlas_fast.clip.transforms import TransformSpec, load_views

FORMAT = "atlas_fast.feature_cache"
FORMAT_VERSION = 2  # 2: image_ids, fletcher32 checksums, keys_digest
FEATURE_CHUNK_ROWS = 64
DONE_CHUNK = (1024, 8)
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
STORAGE_DTYPES = ("float16", "float32")
_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Augmented views per image: a sanity cap (CoOp's longest schedule is 200 epochs, one view each); below it, a build
# must also fit the free disk space and a load the available memory.
MAX_VIEWS = 10_000
REQUIRED_ATTRS = ("format", "format_version", "dataset", "backbone_fingerprint", "transform_fingerprint", "transform",
                  "preprocessing", "embed_dim", "encode_precision", "storage_dtype", "keys_digest")
REQUIRED_DATASETS = ("keys", "image_ids", "features", "done")


class CacheError(RuntimeError):
    """Base class of feature-cache errors."""


class CacheMismatchError(CacheError):
    """A cache file whose attributes disagree with its name or with the requested backbone/transform."""


class CacheCorruptError(CacheError):
    """Stored bytes that fail their checksum (``rows`` are the affected row indices, when known)."""

    def __init__(self, message: str, path: Path, rows: list[int] | None = None):
        super().__init__(message)
        self.path = path
        self.rows = rows or []


class CacheSpaceError(CacheError):
    """Not enough free space (or a file-size limit) to write the features; finished batches are kept."""


class CacheReadOnlyError(CacheError):
    """Features are missing from a cache file that this process may not write."""


class MissingFeaturesError(CacheError):
    """Requested (image, view) features that are not in the cache yet. ``missing`` lists (key, view) pairs."""

    def __init__(self, message: str, missing: list[tuple[str, int]], path: Path):
        super().__init__(message)
        self.missing = missing
        self.path = path


@dataclass
class BuildReport:
    """What one :meth:`FeatureCache.build` call did. ``encoded``/``reused`` count (image, view) features."""

    encoded: int
    reused: int
    seconds: float
    images_per_s: float
    path: Path


@dataclass
class CacheEntry:
    """One cache file as listed by :meth:`FeatureCache.entries`. ``view_counts[v]`` = images with view v done."""

    dataset: str
    path: Path
    backbone: str
    backbone_fingerprint: str
    transform_fingerprint: str
    transform: str
    aug_seed: int | None
    num_images: int
    view_counts: list[int] = field(default_factory=list)
    encode_precision: str = ""
    storage_dtype: str = ""
    embed_dim: int = 0
    size_bytes: int = 0
    problem: str | None = None


@contextmanager
def _flock(path: Path, exclusive: bool, wait_message: str | None = None) -> Iterator[None]:
    """Hold an flock on ``path`` (created if needed). Read-only cache folders are read without a lock."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        if exclusive or not path.exists():
            if exclusive:
                raise
            yield
            return
        fd = os.open(path, os.O_RDONLY)
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait_message:
                print(wait_message, file=sys.stderr, flush=True)
            fcntl.flock(fd, mode)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _open_h5(path: Path, mode: str) -> h5py.File:
    try:
        return h5py.File(path, mode, locking=False)
    except OSError as exc:
        raise CacheError(f"Cannot open feature cache file {path} ({exc}). If it is damaged (e.g. a build was killed "
                         f"while writing), delete it and build again.") from exc


class _ViewDataset(Dataset):
    """Decodes one image per index and returns the requested views of it (DataLoader workers decode in parallel)."""

    def __init__(self, units: list[tuple[Datum, int, list[int]]], spec: TransformSpec):
        self.units = units
        self.spec = spec

    def __len__(self) -> int:
        return len(self.units)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, list[int]]:
        datum, row, views = self.units[index]
        return load_views(datum.impath, datum.key, views, self.spec), row, views


def _collate(samples: list[tuple[torch.Tensor, int, list[int]]]) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    pixels = torch.cat([s[0] for s in samples])
    rows = np.array([s[1] for s in samples for _ in s[2]], dtype=np.int64)
    views = np.array([v for s in samples for v in s[2]], dtype=np.int64)
    return pixels, rows, views


def _batches(units: list[tuple[Datum, int, list[int]]], batch_size: int) -> list[list[int]]:
    """Group images so that each batch holds about ``batch_size`` views (at least one image)."""
    batches: list[list[int]] = []
    current: list[int] = []
    count = 0
    for index, (_, _, views) in enumerate(units):
        if current and count + len(views) > batch_size:
            batches.append(current)
            current, count = [], 0
        current.append(index)
        count += len(views)
    if current:
        batches.append(current)
    return batches


def _write_cells(ds: h5py.Dataset, rows: np.ndarray, views: np.ndarray, values: np.ndarray | bool) -> None:
    """``ds[rows[i], views[i]] = values[i]``, as one block read-modify-write when the cells are dense enough."""
    lo, hi = int(rows.min()), int(rows.max()) + 1
    vlo, vhi = int(views.min()), int(views.max()) + 1
    if (hi - lo) * (vhi - vlo) <= 4 * len(rows) + 64:
        block = ds[lo:hi, vlo:vhi]
        block[rows - lo, views - vlo] = values
        ds[lo:hi, vlo:vhi] = block
        return
    for i, (r, v) in enumerate(zip(rows.tolist(), views.tolist())):
        ds[r, v] = values if isinstance(values, bool) else values[i]


def _read_view(ds: h5py.Dataset, rows: np.ndarray, view: int) -> np.ndarray:
    """``ds[rows, view]`` for any row order; reads one contiguous slab when the rows are dense, else fancy-indexes."""
    unique, inverse = np.unique(rows, return_inverse=True)
    lo, hi = int(unique[0]), int(unique[-1]) + 1
    if hi - lo <= 8 * len(unique) + 1024:
        data = ds[lo:hi, view][unique - lo]
    else:
        data = ds[unique, view]
    return data[inverse]


def _keys_digest(keys: Sequence[str], image_ids: Sequence[str]) -> str:
    """BLAKE2b of the rows' (key, image id) strings: HDF5 checksums neither (variable-length strings)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update("\n".join(keys).encode("utf-8", "surrogateescape"))
    digest.update(b"\0")
    digest.update("\n".join(image_ids).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _row_index(keys: Sequence[str], image_ids: Sequence[str]) -> dict[tuple[str, str], int]:
    return {pair: i for i, pair in enumerate(zip(keys, image_ids))}


def _row_ranges(rows: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts: list[str] = []
    ordered = sorted(set(rows))
    start = prev = ordered[0] if ordered else 0
    for r in ordered[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def _reserve(path: Path, nbytes: int, kept: str) -> None:
    """Allocate ``nbytes`` beyond the end of ``path`` before HDF5 writes there (HDF5 truncates the file back to what
    it used on close). Out of space, or over a file-size limit, fails here with :class:`CacheSpaceError`, before the
    file is touched; ``kept`` says what the file still holds."""
    if not hasattr(os, "posix_fallocate"):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, os.fstat(fd).st_size, nbytes)
    except OSError as exc:
        raise CacheSpaceError(f"Out of space writing features into {path} ({exc.strerror or exc}). {kept} Free some "
                              f"space and build again: only the missing features are encoded.") from exc
    finally:
        os.close(fd)


def _chunk_bytes(rows: np.ndarray, views: np.ndarray, dim: int, itemsize: int) -> int:
    """An upper bound of the bytes that writing cells (rows[i], views[i]) adds: every chunk touched, plus slack."""
    feature_chunks = len(set(zip((rows // FEATURE_CHUNK_ROWS).tolist(), views.tolist())))
    done_chunks = len(set(zip((rows // DONE_CHUNK[0]).tolist(), (views // DONE_CHUNK[1]).tolist())))
    return (feature_chunks * (FEATURE_CHUNK_ROWS * dim * itemsize + 64)
            + done_chunks * (DONE_CHUNK[0] * DONE_CHUNK[1] + 64) + (64 << 10))


def _unique_by_key(items: Sequence[Datum]) -> list[Datum]:
    seen: dict[str, Datum] = {}
    for d in items:
        seen.setdefault(d.key, d)
    return list(seen.values())


def _views_summary(counts: list[int]) -> str:
    """``[100, 40, 40, 40]`` -> ``"v0:100 v1-3:40"``."""
    parts: list[str] = []
    start = 0
    for v in range(1, len(counts) + 1):
        if v == len(counts) or counts[v] != counts[start]:
            name = f"v{start}" if v - 1 == start else f"v{start}-{v - 1}"
            parts.append(f"{name}:{counts[start]}")
            start = v
    return " ".join(parts) or "-"


def _free_bytes(folder: Path) -> int:
    """Free space of the file system that holds ``folder`` (or its nearest existing parent)."""
    folder = folder.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def _available_memory() -> int | None:
    """Memory available to a new allocation without swapping (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _named(exc: BaseException, path: Path) -> str:
    """An exception's message, prefixed with ``path`` unless it names it already."""
    text = str(exc)
    return text if str(path) in text else f"{path}: {type(exc).__name__}: {text}"


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


class FeatureCache:
    """Image features of frozen CLIP backbones under ``root``, one HDF5 file per (dataset, backbone, transform).

    ``storage_dtype`` ("float16" default, or "float32") applies to files this instance creates; an existing file
    keeps its own dtype (building into it with another dtype raises), and :meth:`load` always returns float32.
    ``content_hash`` identifies images by a hash of their bytes instead of (size, mtime): slower (every image is
    read on each build and load), but it also catches edits that keep size and mtime, and survives copies that
    reset the mtime.
    """

    def __init__(self, root: str | Path = "cache", storage_dtype: str = "float16", content_hash: bool = False):
        if storage_dtype not in STORAGE_DTYPES:
            raise ValueError(f"storage_dtype must be one of {STORAGE_DTYPES}, got {storage_dtype!r}.")
        self.root = Path(root)
        self.storage_dtype = storage_dtype
        self.content_hash = content_hash

    # ----------------------------------------------------------------------------------------------- naming
    def path_for(self, backbone: Backbone, dataset: str, aug_seed: int = 0) -> Path:
        """The file holding ``dataset``'s features for this backbone and the transforms with ``aug_seed``."""
        check_folder_name(dataset, self.root)
        if not backbone.fingerprint:
            raise ValueError("The backbone has no fingerprint; load it with atlas_fast.clip.backbones.load_backbone.")
        spec = TransformSpec.for_backbone(backbone.preprocessing, aug_seed)
        return self.root / dataset / f"{backbone.fingerprint[:12]}-{spec.fingerprint()[:12]}.h5"

    @staticmethod
    def _expected_attrs(backbone: Backbone, dataset: str, spec: TransformSpec) -> dict[str, object]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "dataset": dataset,
            "backbone_fingerprint": backbone.fingerprint,
            "transform_fingerprint": spec.fingerprint(),
            "transform": json.dumps(spec.describe(), sort_keys=True),
            "preprocessing": json.dumps(backbone.preprocessing.to_dict(), sort_keys=True),
            "embed_dim": int(backbone.embed_dim),
        }

    @staticmethod
    def _check_name(f: h5py.File, path: Path) -> None:
        """The file's own attributes must agree with its folder and file name."""
        if f.attrs.get("format") != FORMAT:
            raise CacheMismatchError(f"{path} is not an atlas_fast feature cache (attribute format="
                                     f"{f.attrs.get('format')!r}, expected {FORMAT!r}).")
        if int(f.attrs.get("format_version", -1)) != FORMAT_VERSION:
            raise CacheMismatchError(
                f"{path} has cache format_version {f.attrs.get('format_version')}, this code reads version "
                f"{FORMAT_VERSION} (which adds checksums and image identities); delete the file and build again.")
        FeatureCache._check_structure(f, path)
        expected_stem = f"{str(f.attrs['backbone_fingerprint'])[:12]}-{str(f.attrs['transform_fingerprint'])[:12]}"
        if path.stem != expected_stem or path.parent.name != f.attrs.get("dataset"):
            raise CacheMismatchError(
                f"{path}: its attributes (dataset={f.attrs.get('dataset')!r}, backbone/transform fingerprints "
                f"{expected_stem}) disagree with its location; the file was renamed, moved or tampered with. "
                f"Delete it and build again.")

    @staticmethod
    def _check_structure(f: h5py.File, path: Path) -> None:
        """Every attribute and dataset of the format is there, with shapes that agree: keys (N,), image_ids (N,),
        features (N, 1+V, embed_dim), done (N, 1+V). Anything else is a damaged or foreign file, named."""
        missing = [name for name in REQUIRED_ATTRS if name not in f.attrs]
        missing += [name for name in REQUIRED_DATASETS if not isinstance(f.get(name), h5py.Dataset)]
        if missing:
            raise CacheCorruptError(f"{path} lacks {', '.join(missing)}: the file is damaged or was not written by "
                                    f"atlas_fast. Delete it and build again.", path)
        shapes = {name: f[name].shape for name in REQUIRED_DATASETS}
        rows = shapes["keys"][0] if len(shapes["keys"]) == 1 else -1
        try:
            dim = int(f.attrs["embed_dim"])
        except (TypeError, ValueError):
            dim = -1
        if (len(shapes["keys"]) != 1 or shapes["image_ids"] != (rows,) or len(shapes["features"]) != 3
                or shapes["features"][0] != rows or shapes["features"][2] != dim
                or shapes["done"] != shapes["features"][:2]):
            raise CacheCorruptError(
                f"{path}: its datasets do not fit together (shapes {shapes}, embed_dim {f.attrs['embed_dim']}): the "
                f"file is damaged or was edited. Delete it and build again.", path)
        # Every row stores its key, so a file holds at least a byte per row: a declared size beyond that (or views
        # beyond the cap) would only size the arrays read next, never describe real features.
        if rows > max(path.stat().st_size, 1) or shapes["done"][1] > MAX_VIEWS + 1:
            raise CacheCorruptError(
                f"{path} declares {rows} rows x {shapes['done'][1]} views, more than its "
                f"{path.stat().st_size} bytes or the cap of {MAX_VIEWS + 1} views can hold: the file is damaged "
                f"or crafted. Delete it and build again.", path)

    def _check(self, f: h5py.File, path: Path, expected: dict[str, object]) -> None:
        self._check_name(f, path)
        for name, value in expected.items():
            stored = f.attrs.get(name)
            stored = stored.item() if isinstance(stored, np.generic) else stored
            if stored != value:
                raise CacheMismatchError(
                    f"{path}: attribute {name!r} is {stored!r} but the requested backbone/transform gives {value!r}. "
                    f"These features were made with other weights, preprocessing or transform and cannot be reused; "
                    f"delete the file and build again.")

    def _check_build(self, f: h5py.File, path: Path, precision: str) -> str:
        """Building into ``f`` must not mix precisions or storage dtypes; returns the file's precision."""
        recorded = str(f.attrs["encode_precision"])
        if precision not in ("auto", recorded):
            raise CacheMismatchError(
                f"{path} was encoded with precision {recorded!r}; building into it with {precision!r} would mix "
                f"precisions. Use precision 'auto' or {recorded!r}, or another cache root.")
        if str(f.attrs["storage_dtype"]) != self.storage_dtype:
            raise CacheMismatchError(
                f"{path} stores {f.attrs['storage_dtype']} features; this FeatureCache was asked for "
                f"{self.storage_dtype}. Use storage_dtype={str(f.attrs['storage_dtype'])!r} or another cache root.")
        return recorded

    @staticmethod
    def _read_rows(f: h5py.File, path: Path) -> tuple[list[str], list[str], np.ndarray]:
        """Keys, image ids and done flags, checked against ``keys_digest`` and the chunk checksums."""
        try:
            keys = list(f["keys"].asstr()[...])
            image_ids = list(f["image_ids"].asstr()[...])
            done = f["done"][...]
        except (OSError, UnicodeDecodeError) as exc:
            raise CacheCorruptError(f"{path}: the row index (keys, image ids or done flags) is damaged ({exc}). "
                                    f"Delete the file and build again.", path) from exc
        if len(keys) != len(image_ids) or len(keys) != done.shape[0] or _keys_digest(keys, image_ids) != str(
                f.attrs.get("keys_digest", "")):
            raise CacheCorruptError(f"{path}: the row index does not match its checksum (keys_digest); the file "
                                    f"was damaged or edited. Delete it and build again.", path)
        return keys, image_ids, done

    # ------------------------------------------------------------------------------------------------ build
    def build(self, backbone: Backbone, dataset: str, items: Sequence[Datum], num_views: int = 0,
              aug_seed: int = 0, batch_size: int = 64, num_workers: int | None = None, device: str | None = None,
              precision: str = "auto", progress: bool = True) -> BuildReport:
        """Encode views 0..``num_views`` of every item, only those not cached yet (moves the backbone to ``device``).

        ``precision``: "auto" (the file's recorded precision, else fp16 autocast on CUDA and fp32 on CPU), "fp32",
        "fp16" or "bf16". ``num_workers`` DataLoader decoding processes (None: up to 8, by CPU count).
        When everything is cached already, nothing is written (a read-only cache folder works)."""
        start = time.perf_counter()
        if num_views < 0:
            raise ValueError(f"num_views must be >= 0 (0 = only the test-transform view), got {num_views}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}.")
        items = _unique_by_key(items)
        path = self.path_for(backbone, dataset, aug_seed)
        self._check_views_fit(num_views, len(items), int(backbone.embed_dim), path)
        image_ids = image_identities(items, self.content_hash)
        spec = TransformSpec.for_backbone(backbone.preprocessing, aug_seed)
        expected = self._expected_attrs(backbone, dataset, spec)
        run_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        views = list(range(num_views + 1))
        total = len(items) * len(views)

        if path.exists():  # the common case of a complete file needs neither write access nor the build lock
            missing = self._missing_units(path, expected, items, image_ids, views, precision)
            if not missing:
                return BuildReport(encoded=0, reused=total, seconds=time.perf_counter() - start,
                                   images_per_s=0.0, path=path)
            if not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
                count = sum(len(u[2]) for u in missing)
                raise CacheReadOnlyError(
                    f"{path} lacks {count} of the {total} requested features (e.g. {missing[0][0].key!r}) and is "
                    f"read-only for this process. Build them where the cache is writable, or use a writable "
                    f"--cache-root.")
        else:
            missing = [(d, -1, views) for d in items]
        path.parent.mkdir(parents=True, exist_ok=True)
        if missing:
            self._check_free_space(path, sum(len(u[2]) for u in missing), int(backbone.embed_dim))
        with _flock(path.with_name(path.name + ".build.lock"), exclusive=True,
                    wait_message=f"Waiting for another process that is building {path} ..."):
            with _flock(self._lock_path(path), exclusive=True):
                units, precision = self._prepare(path, backbone, expected, items, image_ids, views, precision,
                                                 run_device)
            todo = sum(len(u[2]) for u in units)
            if todo:
                backbone.to(run_device)
                self._encode_all(backbone, path, spec, units, todo, batch_size, num_workers, run_device, precision,
                                 progress, desc=f"Encoding {dataset} ({path.name})")
        seconds = time.perf_counter() - start
        report = BuildReport(encoded=todo, reused=total - todo, seconds=seconds,
                             images_per_s=todo / seconds if todo and seconds > 0 else 0.0, path=path)
        if progress and todo:
            say(f"cache: encoded {todo} feature(s) of {dataset} in {seconds:.1f} s ({report.images_per_s:.1f} img/s), "
                f"reused {report.reused} -> {path}")
        return report

    @staticmethod
    def _lock_path(path: Path) -> Path:
        return path.with_name(path.name + ".lock")

    @staticmethod
    def _units(row_of: dict[tuple[str, str], int], done: np.ndarray, items: list[Datum], image_ids: list[str],
               views: list[int]) -> list[tuple[Datum, int, list[int]]]:
        """(item, row, views to encode) for every item with something missing; row -1 = no row yet."""
        units = []
        for d, image_id in zip(items, image_ids):
            row = row_of.get((d.key, image_id), -1)
            todo = [v for v in views if row < 0 or v >= done.shape[1] or not done[row, v]]
            if todo:
                units.append((d, row, todo))
        return units

    def _missing_units(self, path: Path, expected: dict[str, object], items: list[Datum], image_ids: list[str],
                       views: list[int], precision: str) -> list[tuple[Datum, int, list[int]]]:
        """What a build would have to encode, read under a shared lock without writing anything."""
        with _flock(self._lock_path(path), exclusive=False):
            with _open_h5(path, "r") as f:
                self._check(f, path, expected)
                self._check_build(f, path, precision)
                keys, ids, done = self._read_rows(f, path)
        return self._units(_row_index(keys, ids), done, items, image_ids, views)

    def _prepare(self, path: Path, backbone: Backbone, expected: dict[str, object], items: list[Datum],
                 image_ids: list[str], views: list[int], precision: str, device: torch.device
                 ) -> tuple[list[tuple[Datum, int, list[int]]], str]:
        """Create or check the file, append rows for new (key, image id) pairs, widen the views axis; return what
        must be encoded."""
        if not path.exists():
            try:
                with _open_h5(path, "a") as f:
                    self._create(f, backbone, expected, precision, device)
            except BaseException as exc:  # nothing was cached in it yet: leave no half-made file behind
                path.unlink(missing_ok=True)
                if isinstance(exc, (OSError, RuntimeError)):
                    raise CacheSpaceError(f"Could not create the cache file {path} ({exc}); is the disk full?") from exc
                raise
        _reserve(path, 2 * sum(len(d.key) + len(i) + 48 for d, i in zip(items, image_ids)) + (256 << 10),
                 "Nothing was changed; the features cached before are kept and readable.")
        with _open_h5(path, "a") as f:
            if "format" not in f.attrs:
                if len(f):
                    raise CacheMismatchError(f"{path} holds HDF5 data but is not an atlas_fast feature cache (no "
                                             f"'format' attribute; a build killed while creating it?). Delete it.")
                self._create(f, backbone, expected, precision, device)
            self._check(f, path, expected)
            recorded = self._check_build(f, path, precision)
            keys, ids, done_now = self._read_rows(f, path)
            row_of = _row_index(keys, ids)
            new = [(d.key, i) for d, i in zip(items, image_ids) if (d.key, i) not in row_of]
            features, done = f["features"], f["done"]
            if new:
                n_old, n = len(keys), len(keys) + len(new)
                for name, column in (("keys", 0), ("image_ids", 1)):
                    f[name].resize((n,))
                    f[name][n_old:n] = np.array([pair[column] for pair in new], dtype=object)
                features.resize(n, axis=0)
                done.resize(n, axis=0)
                row_of.update({pair: n_old + i for i, pair in enumerate(new)})
                keys += [k for k, _ in new]
                ids += [i for _, i in new]
                f.attrs["keys_digest"] = _keys_digest(keys, ids)
            if len(views) > features.shape[1]:
                features.resize(len(views), axis=1)
                done.resize(len(views), axis=1)
            if new or len(views) > done_now.shape[1]:
                done_now = done[...]
        units = self._units(row_of, done_now, items, image_ids, views)
        units.sort(key=lambda u: u[1])
        return units, recorded

    def _create(self, f: h5py.File, backbone: Backbone, expected: dict[str, object], precision: str,
                device: torch.device) -> None:
        dim = int(backbone.embed_dim)
        for name in ("keys", "image_ids"):
            f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8"), chunks=(1024,))
        f.create_dataset("features", shape=(0, 1, dim), maxshape=(None, None, dim), dtype=self.storage_dtype,
                         chunks=(FEATURE_CHUNK_ROWS, 1, dim), fletcher32=True)
        f.create_dataset("done", shape=(0, 1), maxshape=(None, None), dtype=bool, chunks=DONE_CHUNK, fletcher32=True)
        for name, value in expected.items():
            f.attrs[name] = value
        f.attrs["backbone_config"] = json.dumps(backbone.config.to_dict(), sort_keys=True)
        f.attrs["backbone_architecture"] = json.dumps(backbone.architecture, sort_keys=True)
        f.attrs["encode_precision"] = precision if precision != "auto" else (
            "fp16" if device.type == "cuda" else "fp32")
        f.attrs["storage_dtype"] = self.storage_dtype
        f.attrs["keys_digest"] = _keys_digest([], [])
        f.attrs["created_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        f.attrs["atlas_fast_version"] = atlas_fast.__version__

    def _check_views_fit(self, num_views: int, num_images: int, dim: int, path: Path) -> None:
        """Refuse views 0..``num_views`` beyond :data:`MAX_VIEWS` or beyond what the free disk space (plus what the
        file holds already) can store for ``num_images`` images, before anything is sized by ``num_views``."""
        if num_views > MAX_VIEWS:
            raise ValueError(f"views {num_views} is out of range for the feature cache: the valid range is "
                             f"0..{MAX_VIEWS} augmented views per image.")
        per_view = max(num_images, 1) * dim * np.dtype(self.storage_dtype).itemsize
        room = _free_bytes(path.parent) + (path.stat().st_size if path.exists() else 0)
        fit = room // per_view - 1
        if num_views > max(fit, 0):
            raise ValueError(
                f"views {num_views} is out of range for {num_images} images: the valid range is 0..{max(fit, 0)} "
                f"(views 0..{num_views} of {dim}-dim {self.storage_dtype} features need "
                f"{_human_bytes((num_views + 1) * per_view)}; {_human_bytes(room)} fit under {path.parent}).")

    def _check_free_space(self, path: Path, count: int, dim: int) -> None:
        """Refuse a build whose ``count`` missing features cannot fit in the free space, before encoding anything
        (an estimate: 25 % + 1 MiB over the raw bytes, for partly filled chunks and metadata)."""
        needed = int(count * dim * np.dtype(self.storage_dtype).itemsize * 1.25) + (1 << 20)
        free = shutil.disk_usage(path.parent).free
        if needed > free:
            raise CacheSpaceError(
                f"Encoding {count} features into {path} needs about {_human_bytes(needed)}, but only "
                f"{_human_bytes(free)} is free there. Free some space or use another --cache-root; nothing was "
                f"encoded.")

    def _encode_all(self, backbone: Backbone, path: Path, spec: TransformSpec,
                    units: list[tuple[Datum, int, list[int]]], todo: int, batch_size: int, num_workers: int | None,
                    device: torch.device, precision: str, progress: bool, desc: str) -> None:
        if num_workers is None:
            num_workers = min(8, os.cpu_count() or 1) if todo > batch_size else 0
        loader = DataLoader(_ViewDataset(units, spec), batch_sampler=_batches(units, batch_size),
                            num_workers=num_workers, collate_fn=_collate, pin_memory=device.type == "cuda")
        committed = 0
        with progress_bar(total=todo, unit="img", desc=desc, enabled=progress, dynamic_ncols=True) as bar:
            for pixels, rows, views in loader:
                features = self._encode(backbone, pixels, device, precision)
                self._commit(path, rows, views, features, committed)
                committed += len(rows)
                bar.update(len(rows))

    @staticmethod
    def _encode(backbone: Backbone, pixels: torch.Tensor, device: torch.device, precision: str) -> np.ndarray:
        pixels = pixels.to(device, non_blocking=True)
        with torch.no_grad():
            if precision == "fp32":
                features = backbone.encode_image(pixels)
            else:
                with torch.autocast(device_type=device.type, dtype=_AUTOCAST_DTYPES[precision]):
                    features = backbone.encode_image(pixels)
        return features.float().cpu().numpy()

    def _commit(self, path: Path, rows: np.ndarray, views: np.ndarray, features: np.ndarray,
                committed: int = 0) -> None:
        """One write transaction: reserve its space, write the features, flush, then their done flags (closing
        flushes again). A failed reservation leaves the file as the previous transaction left it."""
        with _flock(self._lock_path(path), exclusive=True):
            _reserve(path, _chunk_bytes(rows, views, features.shape[-1], np.dtype(self.storage_dtype).itemsize),
                     f"The {committed} features encoded before in this build, and all earlier ones, are kept and "
                     f"readable.")
            with _open_h5(path, "a") as f:
                _write_cells(f["features"], rows, views, features.astype(f["features"].dtype))
                f.flush()
                _write_cells(f["done"], rows, views, True)

    # ------------------------------------------------------------------------------------------------- load
    def load(self, backbone: Backbone, dataset: str, items: Sequence[Datum], views: Sequence[int],
             aug_seed: int = 0) -> torch.Tensor:
        """Features (N, len(views), D) float32 of ``items`` in their order; raises :class:`MissingFeaturesError`
        (also for images changed on disk since they were encoded) and :class:`CacheCorruptError`."""
        if not hasattr(views, "__len__"):
            views = list(views)
        if len(views) > MAX_VIEWS + 1:
            raise ValueError(f"views: {len(views)} view indices requested; the valid range is 0..{MAX_VIEWS}, each "
                             f"index once.")
        views = [int(v) for v in views]
        if not views or min(views) < 0:
            raise ValueError(f"views must be a non-empty list of indices >= 0 (0 = test transform), got {views}.")
        if max(views) > MAX_VIEWS:
            raise ValueError(f"view {max(views)} is out of range for the feature cache: the valid range is "
                             f"0..{MAX_VIEWS}.")
        needed = len(items) * len(views) * int(backbone.embed_dim) * 4
        available = _available_memory()
        if available is not None and needed > available:
            raise ValueError(f"views: loading {len(views)} views of {len(items)} images needs "
                             f"{_human_bytes(needed)} of memory, but {_human_bytes(available)} is available; the "
                             f"valid range is at most {available // max(len(items) * int(backbone.embed_dim) * 4, 1)} "
                             f"views per load: load fewer views or images at a time.")
        spec = TransformSpec.for_backbone(backbone.preprocessing, aug_seed)
        path = self.path_for(backbone, dataset, aug_seed)
        if not path.exists():
            missing = [(d.key, v) for d in items for v in views]
            raise self._missing_error(path, backbone, dataset, missing, len(missing), views, aug_seed)
        image_ids = image_identities(items, self.content_hash)
        expected = self._expected_attrs(backbone, dataset, spec)
        with _flock(self._lock_path(path), exclusive=False):
            with _open_h5(path, "r") as f:
                self._check(f, path, expected)
                keys, ids, done = self._read_rows(f, path)
                row_of = _row_index(keys, ids)
                rows = np.array([row_of.get((d.key, i), -1) for d, i in zip(items, image_ids)], dtype=np.int64)
                missing = [(d.key, v) for d, r in zip(items, rows.tolist()) for v in views
                           if r < 0 or v >= done.shape[1] or not done[r, v]]
                if missing:
                    changed = sorted({d.key for d, r in zip(items, rows.tolist()) if r < 0} & set(keys))
                    raise self._missing_error(path, backbone, dataset, missing, len(items) * len(views), views,
                                              aug_seed, changed)
                out = np.empty((len(items), len(views), f["features"].shape[2]), dtype=np.float32)
                if len(items):
                    for j, v in enumerate(views):
                        try:
                            out[:, j] = _read_view(f["features"], rows, v)
                        except OSError as exc:
                            raise self._corrupt_error(f, path, keys, rows, v) from exc
        return torch.from_numpy(out)

    @staticmethod
    def _bad_chunks(ds: h5py.Dataset, row_ranges: Sequence[tuple[int, int]], view: int | None) -> list[int]:
        """Rows in chunks of ``ds`` that fail their checksum, among ``row_ranges`` (one view, or all)."""
        bad: list[int] = []
        for lo, hi in row_ranges:
            try:
                ds[lo:hi] if view is None else ds[lo:hi, view]
            except OSError:
                bad.extend(range(lo, hi))
        return bad

    def _corrupt_error(self, f: h5py.File, path: Path, keys: list[str], rows: np.ndarray,
                       view: int) -> CacheCorruptError:
        step = FEATURE_CHUNK_ROWS
        chunks = sorted({int(r) // step for r in rows.tolist()})
        bad = self._bad_chunks(f["features"], [(c * step, min((c + 1) * step, len(keys))) for c in chunks], view)
        where = f"rows {_row_ranges(bad)} (e.g. {keys[bad[0]]!r})" if bad else "some rows"
        return CacheCorruptError(
            f"{path}: stored features of view {view}, {where}, fail their checksum: the file is damaged (disk "
            f"fault or an outside write). Delete it and build again; `atlas-fast cache info --verify` lists every "
            f"damaged row.", path, bad)

    def _missing_error(self, path: Path, backbone: Backbone, dataset: str, missing: list[tuple[str, int]],
                       total: int, views: list[int], aug_seed: int,
                       changed: Sequence[str] = ()) -> MissingFeaturesError:
        examples = ", ".join(f"{k!r} view {v}" for k, v in missing[:3])
        cfg = backbone.config
        command = (f"atlas-fast cache build --dataset {dataset} --model {cfg.model} "
                   f"--pretrained {cfg.pretrained or 'none'} --views {max(views)} --aug-seed {aug_seed} "
                   f"--cache-root {self.root} [--shots K --seed S | --split train,val,test]")
        note = (f" {len(changed)} of these images changed on disk since they were encoded (e.g. {changed[0]!r}); "
                f"their old features are not used." if changed else "")
        return MissingFeaturesError(
            f"{len(missing)} of {total} requested features (image x view) are not in the cache {path} "
            f"(e.g. {examples}).{note} Build them with: {command} (or FeatureCache.build(...) with the same items).",
            missing, path)

    # ------------------------------------------------------------------------------------------ info/verify
    def verify_file(self, path: Path) -> list[str]:
        """Read every chunk of ``path`` and check every checksum; returns the problems found (empty = healthy)."""
        problems: list[str] = []
        try:
            with _flock(self._lock_path(path), exclusive=False):
                with _open_h5(path, "r") as f:
                    self._check_name(f, path)
                    keys, _, _ = self._read_rows(f, path)
                    features = f["features"]
                    step = FEATURE_CHUNK_ROWS
                    ranges = [(lo, min(lo + step, len(keys))) for lo in range(0, len(keys), step)]
                    for view in range(features.shape[1]):
                        bad = self._bad_chunks(features, ranges, view)
                        if bad:
                            problems.append(f"features of view {view}: rows {_row_ranges(bad)} fail their checksum "
                                            f"(e.g. {keys[bad[0]]!r})")
        except (CacheError, OSError, KeyError, ValueError) as exc:
            problems.append(_named(exc, path))
        return problems

    def entries(self, verify: bool = False) -> list[CacheEntry]:
        """Every cache file under the root, with its size and what it holds (problems reported, not raised).
        ``verify`` also reads every chunk and checks its checksum (slow: reads the whole file). A root that is not
        a folder raises :class:`FileNotFoundError` naming it (a mistyped ``--cache-root`` is not an empty cache)."""
        if not self.root.is_dir():
            raise FileNotFoundError(f"Feature cache folder {self.root} does not exist"
                                    f"{' (it is a file)' if self.root.exists() else ''}; check the cache root.")
        found = []
        for path in sorted(self.root.glob("*/*.h5")):
            entry = CacheEntry(dataset=path.parent.name, path=path, backbone="?", backbone_fingerprint="",
                               transform_fingerprint="", transform="?", aug_seed=None, num_images=0,
                               size_bytes=path.stat().st_size)
            try:
                with _flock(self._lock_path(path), exclusive=False):
                    with _open_h5(path, "r") as f:
                        attrs = f.attrs
                        entry.backbone_fingerprint = str(attrs.get("backbone_fingerprint", ""))
                        entry.transform_fingerprint = str(attrs.get("transform_fingerprint", ""))
                        config = json.loads(attrs.get("backbone_config", "{}"))
                        entry.backbone = (f"{config.get('model', '?')} ({config.get('pretrained') or 'random init'})"
                                          f" [{entry.backbone_fingerprint[:12]}]")
                        transform = json.loads(attrs.get("transform", "{}"))
                        entry.aug_seed = transform.get("aug_seed")
                        view0 = transform.get("view0", {})
                        entry.transform = (f"{view0.get('size', '?')}px {view0.get('interpolation', '?')} "
                                           f"aug_seed={entry.aug_seed} [{entry.transform_fingerprint[:12]}]")
                        entry.encode_precision = str(attrs.get("encode_precision", ""))
                        entry.storage_dtype = str(attrs.get("storage_dtype", ""))
                        entry.embed_dim = int(attrs.get("embed_dim", 0))
                        entry.num_images = int(f["keys"].shape[0])
                        entry.view_counts = [int(c) for c in f["done"][...].sum(axis=0)]
                        self._check_name(f, path)
            except (CacheError, OSError, KeyError, ValueError) as exc:
                entry.problem = _named(exc, path)
            if verify and entry.problem is None:
                entry.problem = "; ".join(self.verify_file(path)) or None
            found.append(entry)
        return found

    def info(self, verify: bool = False, entries: list[CacheEntry] | None = None) -> str:
        """A table of :meth:`entries` (or of the given ``entries``) for humans: one line per file, the total size.
        A missing root raises :class:`FileNotFoundError` (see :meth:`entries`)."""
        entries = self.entries(verify) if entries is None else entries
        if not entries:
            return f"No feature cache files under {self.root}."
        header = ("dataset", "backbone", "transform", "images", "views done", "precision", "size")
        rows = [header]
        for e in entries:
            rows.append((e.dataset, e.backbone, e.transform, str(e.num_images),
                         _views_summary(e.view_counts), f"{e.encode_precision}->{e.storage_dtype}",
                         _human_bytes(e.size_bytes)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        for e in entries:
            if e.problem:
                lines.append(f"PROBLEM {e.path}: {e.problem}")
        total = sum(e.size_bytes for e in entries)
        checked = ("; every chunk verified" + (" - no problem found" if not any(e.problem for e in entries) else "")
                   if verify else " (checksums not read: --verify reads every chunk)")
        lines.append(f"{len(entries)} file(s), {_human_bytes(total)} under {self.root}{checked}")
        return "\n".join(lines)
