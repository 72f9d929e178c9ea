"""Encoding what a cache file lacks: decode the images' views, encode them, write them in committed transactions.

Resumability: every batch is a committed transaction (space reserved, features written and flushed before their
``done`` flags), so a build that is interrupted keeps every batch finished before the one in flight; rebuilding
encodes only the rest. (A hard kill in the middle of a transaction's few milliseconds can damage the file; opening it
then raises an error naming it and telling to delete it.) A second builder of the same file waits for the first
(:mod:`atlas_fast.cache.locking`), then encodes only what is still missing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from atlas_fast.cache.errors import CacheMismatchError, CacheReadOnlyError, CacheSpaceError
from atlas_fast.cache.format import (CacheFiles, check_attrs, create_layout, expected_attrs, keys_digest, open_h5,
                                     read_rows, row_index)
from atlas_fast.cache.locking import build_lock_path, flock, lock_path
from atlas_fast.cache.space import check_free_space, check_views_fit, chunk_bytes, reserve
from atlas_fast.clip.backbones import Backbone
from atlas_fast.clip.transforms import TransformSpec, load_views
from atlas_fast.data.base import Datum
from atlas_fast.data.identity import image_identities
from atlas_fast.progress import progress_bar, say
from atlas_fast.vocabulary import CACHE_PRECISIONS

_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# (item, its row or -1 for none yet, the views of it to encode)
Unit = tuple[Datum, int, list[int]]


@dataclass
class BuildReport:
    """What one :meth:`CacheBuilder.build` call did. ``encoded``/``reused`` count (image, view) features."""

    encoded: int
    reused: int
    seconds: float
    images_per_s: float
    path: Path


class CacheBuilder(CacheFiles):
    """Builds cache files: creates them, appends rows for new images, encodes only the missing (image, view) pairs."""

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
        if precision not in CACHE_PRECISIONS:
            raise ValueError(f"precision must be one of {CACHE_PRECISIONS}, got {precision!r}.")
        items = _unique_by_key(items)
        path = self.path_for(backbone, dataset, aug_seed)
        check_views_fit(num_views, len(items), int(backbone.embed_dim), self.storage_dtype, path)
        image_ids = image_identities(items, self.content_hash)
        spec = backbone.transform_for(aug_seed)
        expected = expected_attrs(backbone, dataset, spec)
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
            check_free_space(path, sum(len(u[2]) for u in missing), int(backbone.embed_dim), self.storage_dtype)
        with flock(build_lock_path(path), exclusive=True,
                   wait_message=f"Waiting for another process that is building {path} ..."):
            with flock(lock_path(path), exclusive=True):
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

    def _missing_units(self, path: Path, expected: dict[str, object], items: list[Datum], image_ids: list[str],
                       views: list[int], precision: str) -> list[Unit]:
        """What a build would have to encode, read under a shared lock without writing anything."""
        with flock(lock_path(path), exclusive=False):
            with open_h5(path, "r") as f:
                check_attrs(f, path, expected)
                self._check_build(f, path, precision)
                keys, ids, done = read_rows(f, path)
        return _units(row_index(keys, ids), done, items, image_ids, views)

    def _prepare(self, path: Path, backbone: Backbone, expected: dict[str, object], items: list[Datum],
                 image_ids: list[str], views: list[int], precision: str, device: torch.device
                 ) -> tuple[list[Unit], str]:
        """Create or check the file, append rows for new (key, image id) pairs, widen the views axis; return what
        must be encoded."""
        if not path.exists():
            try:
                with open_h5(path, "a") as f:
                    create_layout(f, backbone, expected, precision, device, self.storage_dtype)
            except BaseException as exc:  # nothing was cached in it yet: leave no half-made file behind
                path.unlink(missing_ok=True)
                if isinstance(exc, (OSError, RuntimeError)):
                    raise CacheSpaceError(f"Could not create the cache file {path} ({exc}); is the disk full?") from exc
                raise
        reserve(path, 2 * sum(len(d.key) + len(i) + 48 for d, i in zip(items, image_ids)) + (256 << 10),
                "Nothing was changed; the features cached before are kept and readable.")
        with open_h5(path, "a") as f:
            if "format" not in f.attrs:
                if len(f):
                    raise CacheMismatchError(f"{path} holds HDF5 data but is not an atlas_fast feature cache (no "
                                             f"'format' attribute; a build killed while creating it?). Delete it.")
                create_layout(f, backbone, expected, precision, device, self.storage_dtype)
            check_attrs(f, path, expected)
            recorded = self._check_build(f, path, precision)
            keys, ids, done_now = read_rows(f, path)
            row_of = row_index(keys, ids)
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
                f.attrs["keys_digest"] = keys_digest(keys, ids)
            if len(views) > features.shape[1]:
                features.resize(len(views), axis=1)
                done.resize(len(views), axis=1)
            if new or len(views) > done_now.shape[1]:
                done_now = done[...]
        units = _units(row_of, done_now, items, image_ids, views)
        units.sort(key=lambda u: u[1])
        return units, recorded

    def _encode_all(self, backbone: Backbone, path: Path, spec: TransformSpec, units: list[Unit], todo: int,
                    batch_size: int, num_workers: int | None, device: torch.device, precision: str, progress: bool,
                    desc: str) -> None:
        if num_workers is None:
            num_workers = min(8, os.cpu_count() or 1) if todo > batch_size else 0
        loader = DataLoader(_ViewDataset(units, spec), batch_sampler=_batches(units, batch_size),
                            num_workers=num_workers, collate_fn=_collate, pin_memory=device.type == "cuda")
        committed = 0
        with progress_bar(total=todo, unit="img", desc=desc, enabled=progress, dynamic_ncols=True) as bar:
            for pixels, rows, views in loader:
                features = _encode(backbone, pixels, device, precision)
                self._commit(path, rows, views, features, committed)
                committed += len(rows)
                bar.update(len(rows))

    def _commit(self, path: Path, rows: np.ndarray, views: np.ndarray, features: np.ndarray,
                committed: int = 0) -> None:
        """One write transaction: reserve its space, write the features, flush, then their done flags (closing
        flushes again). A failed reservation leaves the file as the previous transaction left it."""
        with flock(lock_path(path), exclusive=True):
            reserve(path, chunk_bytes(rows, views, features.shape[-1], np.dtype(self.storage_dtype).itemsize),
                    f"The {committed} features encoded before in this build, and all earlier ones, are kept and "
                    f"readable.")
            with open_h5(path, "a") as f:
                write_cells(f["features"], rows, views, features.astype(f["features"].dtype))
                f.flush()
                write_cells(f["done"], rows, views, True)


def _encode(backbone: Backbone, pixels: torch.Tensor, device: torch.device, precision: str) -> np.ndarray:
    pixels = pixels.to(device, non_blocking=True)
    with torch.no_grad():
        if precision == "fp32":
            features = backbone.encode_image(pixels)
        else:
            with torch.autocast(device_type=device.type, dtype=_AUTOCAST_DTYPES[precision]):
                features = backbone.encode_image(pixels)
    return features.float().cpu().numpy()


def write_cells(ds: h5py.Dataset, rows: np.ndarray, views: np.ndarray, values: np.ndarray | bool) -> None:
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


def _units(row_of: dict[tuple[str, str], int], done: np.ndarray, items: list[Datum], image_ids: list[str],
           views: list[int]) -> list[Unit]:
    """(item, row, views to encode) for every item with something missing; row -1 = no row yet."""
    units = []
    for d, image_id in zip(items, image_ids):
        row = row_of.get((d.key, image_id), -1)
        todo = [v for v in views if row < 0 or v >= done.shape[1] or not done[row, v]]
        if todo:
            units.append((d, row, todo))
    return units


def _unique_by_key(items: Sequence[Datum]) -> list[Datum]:
    seen: dict[str, Datum] = {}
    for d in items:
        seen.setdefault(d.key, d)
    return list(seen.values())


class _ViewDataset(Dataset):
    """Decodes one image per index and returns the requested views of it (DataLoader workers decode in parallel)."""

    def __init__(self, units: list[Unit], spec: TransformSpec):
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


def _batches(units: list[Unit], batch_size: int) -> list[list[int]]:
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
