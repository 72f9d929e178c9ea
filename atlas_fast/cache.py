"""The HDF5 feature cache: frozen CLIP image features, encoded once per image view and read by every later run.

Layout (plain HDF5, readable with h5py alone)
---------------------------------------------
One file per (dataset, backbone weights, transform)::

    <cache root>/<dataset>/<backbone fingerprint[:12]>-<transform fingerprint[:12]>.h5

==================  =================  ===================================================================
name                shape / type       meaning
==================  =================  ===================================================================
``keys``            (N,) utf-8 str     image path relative to the dataset folder (``Datum.key``); row i
``features``        (N, 1+V, D)        un-normalised image features (``encode_image`` output) of row i,
                    float16/float32    view v; view 0 = test transform, views 1..V = seeded augmentations
``done``            (N, 1+V) bool      True once ``features[i, v]`` is written; anything else is garbage
==================  =================  ===================================================================

File attributes: ``format`` ("atlas_fast.feature_cache"), ``format_version``, ``dataset``,
``backbone_fingerprint``, ``backbone_config`` / ``backbone_architecture`` (JSON), ``transform_fingerprint``,
``transform`` (JSON, see :mod:`atlas_fast.transforms`), ``preprocessing`` (JSON), ``encode_precision``
(fp32/fp16/bf16 autocast), ``storage_dtype``, ``embed_dim``, ``created_utc``, ``atlas_fast_version``.
Reading view 0 of some images with h5py alone::

    with h5py.File(path, "r") as f:
        row = {k: i for i, k in enumerate(f["keys"].asstr()[...])}
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
"""

from __future__ import annotations

import fcntl
import json
import os
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
from tqdm.auto import tqdm

import atlas_fast
from atlas_fast.backbones import Backbone
from atlas_fast.data.base import Datum
from atlas_fast.transforms import TransformSpec, load_views

FORMAT = "atlas_fast.feature_cache"
FORMAT_VERSION = 1
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
STORAGE_DTYPES = ("float16", "float32")
_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class CacheError(RuntimeError):
    """Base class of feature-cache errors."""


class CacheMismatchError(CacheError):
    """A cache file whose attributes disagree with its name or with the requested backbone/transform."""


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


def _unique_by_key(items: Sequence[Datum]) -> list[Datum]:
    seen: dict[str, Datum] = {}
    for d in items:
        seen.setdefault(d.key, d)
    return list(seen.values())


def _check_dataset_name(dataset: str) -> None:
    if not dataset or "/" in dataset or os.sep in dataset or dataset.startswith("."):
        raise ValueError(f"Invalid dataset name {dataset!r} for the cache: use a plain folder name such as "
                         f"'OxfordPets' (no path separators, not starting with '.').")


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
    """

    def __init__(self, root: str | Path = "cache", storage_dtype: str = "float16"):
        if storage_dtype not in STORAGE_DTYPES:
            raise ValueError(f"storage_dtype must be one of {STORAGE_DTYPES}, got {storage_dtype!r}.")
        self.root = Path(root)
        self.storage_dtype = storage_dtype

    # ----------------------------------------------------------------------------------------------- naming
    def path_for(self, backbone: Backbone, dataset: str, aug_seed: int = 0) -> Path:
        """The file holding ``dataset``'s features for this backbone and the transforms with ``aug_seed``."""
        _check_dataset_name(dataset)
        if not backbone.fingerprint:
            raise ValueError("The backbone has no fingerprint; load it with atlas_fast.backbones.load_backbone.")
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
            raise CacheMismatchError(f"{path} has cache format_version {f.attrs.get('format_version')}, this code "
                                     f"reads version {FORMAT_VERSION}; delete the file and build again.")
        expected_stem = f"{str(f.attrs['backbone_fingerprint'])[:12]}-{str(f.attrs['transform_fingerprint'])[:12]}"
        if path.stem != expected_stem or path.parent.name != f.attrs.get("dataset"):
            raise CacheMismatchError(
                f"{path}: its attributes (dataset={f.attrs.get('dataset')!r}, backbone/transform fingerprints "
                f"{expected_stem}) disagree with its location; the file was renamed, moved or tampered with. "
                f"Delete it and build again.")

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

    # ------------------------------------------------------------------------------------------------ build
    def build(self, backbone: Backbone, dataset: str, items: Sequence[Datum], num_views: int = 0,
              aug_seed: int = 0, batch_size: int = 64, num_workers: int | None = None, device: str | None = None,
              precision: str = "auto", progress: bool = True) -> BuildReport:
        """Encode views 0..``num_views`` of every item, only those not cached yet (moves the backbone to ``device``).

        ``precision``: "auto" (the file's recorded precision, else fp16 autocast on CUDA and fp32 on CPU), "fp32",
        "fp16" or "bf16". ``num_workers`` DataLoader decoding processes (None: up to 8, by CPU count)."""
        start = time.perf_counter()
        if num_views < 0:
            raise ValueError(f"num_views must be >= 0 (0 = only the test-transform view), got {num_views}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}.")
        items = _unique_by_key(items)
        spec = TransformSpec.for_backbone(backbone.preprocessing, aug_seed)
        path = self.path_for(backbone, dataset, aug_seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        run_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        views = list(range(num_views + 1))

        with _flock(path.with_name(path.name + ".build.lock"), exclusive=True,
                    wait_message=f"Waiting for another process that is building {path} ..."):
            with _flock(self._lock_path(path), exclusive=True):
                units, precision = self._prepare(path, backbone, dataset, spec, items, views, precision, run_device)
            todo = sum(len(u[2]) for u in units)
            reused = len(items) * len(views) - todo
            if todo:
                backbone.to(run_device)
                self._encode_all(backbone, path, spec, units, todo, batch_size, num_workers, run_device, precision,
                                 progress, desc=f"Encoding {dataset} ({path.name})")
        seconds = time.perf_counter() - start
        return BuildReport(encoded=todo, reused=reused, seconds=seconds,
                           images_per_s=todo / seconds if todo and seconds > 0 else 0.0, path=path)

    @staticmethod
    def _lock_path(path: Path) -> Path:
        return path.with_name(path.name + ".lock")

    def _prepare(self, path: Path, backbone: Backbone, dataset: str, spec: TransformSpec, items: list[Datum],
                 views: list[int], precision: str, device: torch.device
                 ) -> tuple[list[tuple[Datum, int, list[int]]], str]:
        """Create or check the file, append rows for new keys, widen the views axis; return what must be encoded."""
        expected = self._expected_attrs(backbone, dataset, spec)
        with _open_h5(path, "a") as f:
            if "format" not in f.attrs:
                if len(f):
                    raise CacheMismatchError(f"{path} holds HDF5 data but is not an atlas_fast feature cache (no "
                                             f"'format' attribute; a build killed while creating it?). Delete it.")
                self._create(f, backbone, expected, precision, device)
            self._check(f, path, expected)
            recorded = str(f.attrs["encode_precision"])
            if precision not in ("auto", recorded):
                raise CacheMismatchError(
                    f"{path} was encoded with precision {recorded!r}; building into it with {precision!r} would mix "
                    f"precisions. Use precision 'auto' or {recorded!r}, or another cache root.")
            if str(f.attrs["storage_dtype"]) != self.storage_dtype:
                raise CacheMismatchError(
                    f"{path} stores {f.attrs['storage_dtype']} features; this FeatureCache was asked for "
                    f"{self.storage_dtype}. Use storage_dtype={str(f.attrs['storage_dtype'])!r} or another cache root.")
            keys, features, done = f["keys"], f["features"], f["done"]
            row_of = {k: i for i, k in enumerate(keys.asstr()[...])}
            new_keys = [d.key for d in items if d.key not in row_of]
            n_old = len(row_of)
            if new_keys:
                n = n_old + len(new_keys)
                keys.resize((n,))
                keys[n_old:n] = np.array(new_keys, dtype=object)
                features.resize(n, axis=0)
                done.resize(n, axis=0)
                row_of.update({k: n_old + i for i, k in enumerate(new_keys)})
            if len(views) > features.shape[1]:
                features.resize(len(views), axis=1)
                done.resize(len(views), axis=1)
            done_now = done[...]
        units = []
        for d in items:
            row = row_of[d.key]
            todo = [v for v in views if not done_now[row, v]]
            if todo:
                units.append((d, row, todo))
        units.sort(key=lambda u: u[1])
        return units, recorded

    def _create(self, f: h5py.File, backbone: Backbone, expected: dict[str, object], precision: str,
                device: torch.device) -> None:
        dim = int(backbone.embed_dim)
        f.create_dataset("keys", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8"), chunks=(1024,))
        f.create_dataset("features", shape=(0, 1, dim), maxshape=(None, None, dim), dtype=self.storage_dtype,
                         chunks=(64, 1, dim))
        f.create_dataset("done", shape=(0, 1), maxshape=(None, None), dtype=bool, chunks=(1024, 8))
        for name, value in expected.items():
            f.attrs[name] = value
        f.attrs["backbone_config"] = json.dumps(backbone.config.to_dict(), sort_keys=True)
        f.attrs["backbone_architecture"] = json.dumps(backbone.architecture, sort_keys=True)
        f.attrs["encode_precision"] = precision if precision != "auto" else (
            "fp16" if device.type == "cuda" else "fp32")
        f.attrs["storage_dtype"] = self.storage_dtype
        f.attrs["created_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        f.attrs["atlas_fast_version"] = atlas_fast.__version__

    def _encode_all(self, backbone: Backbone, path: Path, spec: TransformSpec,
                    units: list[tuple[Datum, int, list[int]]], todo: int, batch_size: int, num_workers: int | None,
                    device: torch.device, precision: str, progress: bool, desc: str) -> None:
        if num_workers is None:
            num_workers = min(8, os.cpu_count() or 1) if todo > batch_size else 0
        loader = DataLoader(_ViewDataset(units, spec), batch_sampler=_batches(units, batch_size),
                            num_workers=num_workers, collate_fn=_collate, pin_memory=device.type == "cuda")
        with tqdm(total=todo, unit="img", desc=desc, disable=not progress, dynamic_ncols=True) as bar:
            for pixels, rows, views in loader:
                features = self._encode(backbone, pixels, device, precision)
                self._commit(path, rows, views, features)
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

    def _commit(self, path: Path, rows: np.ndarray, views: np.ndarray, features: np.ndarray) -> None:
        """One write transaction: features, flush, then their done flags (closing flushes again)."""
        with _flock(self._lock_path(path), exclusive=True):
            with _open_h5(path, "a") as f:
                _write_cells(f["features"], rows, views, features.astype(f["features"].dtype))
                f.flush()
                _write_cells(f["done"], rows, views, True)

    # ------------------------------------------------------------------------------------------------- load
    def load(self, backbone: Backbone, dataset: str, items: Sequence[Datum], views: Sequence[int],
             aug_seed: int = 0) -> torch.Tensor:
        """Features (N, len(views), D) float32 of ``items`` in their order; raises :class:`MissingFeaturesError`."""
        views = [int(v) for v in views]
        if not views or min(views) < 0:
            raise ValueError(f"views must be a non-empty list of indices >= 0 (0 = test transform), got {views}.")
        spec = TransformSpec.for_backbone(backbone.preprocessing, aug_seed)
        path = self.path_for(backbone, dataset, aug_seed)
        if not path.exists():
            missing = [(d.key, v) for d in items for v in views]
            raise self._missing_error(path, backbone, dataset, missing, len(missing), views, aug_seed)
        expected = self._expected_attrs(backbone, dataset, spec)
        with _flock(self._lock_path(path), exclusive=False):
            with _open_h5(path, "r") as f:
                self._check(f, path, expected)
                row_of = {k: i for i, k in enumerate(f["keys"].asstr()[...])}
                done = f["done"][...]
                rows = np.array([row_of.get(d.key, -1) for d in items], dtype=np.int64)
                missing = [(d.key, v) for d, r in zip(items, rows.tolist()) for v in views
                           if r < 0 or v >= done.shape[1] or not done[r, v]]
                if missing:
                    raise self._missing_error(path, backbone, dataset, missing, len(items) * len(views), views,
                                              aug_seed)
                out = np.empty((len(items), len(views), f["features"].shape[2]), dtype=np.float32)
                if len(items):
                    for j, v in enumerate(views):
                        out[:, j] = _read_view(f["features"], rows, v)
        return torch.from_numpy(out)

    def _missing_error(self, path: Path, backbone: Backbone, dataset: str, missing: list[tuple[str, int]],
                       total: int, views: list[int], aug_seed: int) -> MissingFeaturesError:
        examples = ", ".join(f"{k!r} view {v}" for k, v in missing[:3])
        cfg = backbone.config
        command = (f"atlas-fast cache build --dataset {dataset} --model {cfg.model} "
                   f"--pretrained {cfg.pretrained or 'none'} --views {max(views)} --aug-seed {aug_seed} "
                   f"--cache-root {self.root} [--shots K --seed S | --split train,val,test]")
        return MissingFeaturesError(
            f"{len(missing)} of {total} requested features (image x view) are not in the cache {path} "
            f"(e.g. {examples}). Build them with:\n  {command}\nor FeatureCache.build(...) with the same items.",
            missing, path)

    # ------------------------------------------------------------------------------------------------- info
    def entries(self) -> list[CacheEntry]:
        """Every cache file under the root, with its size and what it holds (problems reported, not raised)."""
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
                entry.problem = str(exc)
            found.append(entry)
        return found

    def info(self) -> str:
        """A table of :meth:`entries` for humans (one line per file, plus the total size)."""
        entries = self.entries()
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
        lines.append(f"{len(entries)} file(s), {_human_bytes(total)} under {self.root}")
        return "\n".join(lines)
