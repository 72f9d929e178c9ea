"""Encoding what a cache file lacks: decode the images' views, encode them, write them in committed transactions.

Three stages run side by side: worker processes decode each image once and cut its views as 8-bit pixels
(:func:`~atlas_fast.clip.transforms.load_view_pixels`; as many workers as the process may use CPUs beside the encoder
on a GPU, one on the CPU, where the encoder needs the cores); the caller's thread normalises them on the encoder's
device and encodes them in batches; a writer thread (:class:`Writer`) commits the features in transactions of many
images. A transaction covers whole blocks of :data:`~atlas_fast.cache.format.FEATURE_CHUNK_ROWS` rows, so every HDF5
chunk of new rows is written once, whole, and never read back.

Resumability (docs/cache.md, Properties): every transaction is committed (space reserved, features written and
flushed before their ``done`` flags) at least every :attr:`CacheBuilder.transaction_seconds` and before an error or
an interruption propagates. A hard kill in the middle of a transaction can damage the file; opening it then raises an
error naming it. A second builder of the same file waits for the first (:mod:`atlas_fast.cache.locking`).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from atlas_fast.cache.errors import CacheMismatchError, CacheReadOnlyError, CacheSpaceError
from atlas_fast.cache.format import (FEATURE_CHUNK_ROWS, CacheFiles, check_attrs, create_layout, expected_attrs,
                                     keys_digest, open_h5, read_rows, row_index)
from atlas_fast.cache.locking import build_lock_path, flock, lock_path
from atlas_fast.cache.space import check_free_space, check_views_fit, chunk_bytes, reserve
from atlas_fast.clip.backbones import Backbone
from atlas_fast.clip.transforms import TransformSpec, load_view_pixels, normalize_pixels
from atlas_fast.data.base import Datum
from atlas_fast.data.identity import image_identities
from atlas_fast.progress import ProgressLines, progress_bar, say
from atlas_fast.threads import available_cpus
from atlas_fast.vocabulary import CACHE_PRECISIONS

_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
BATCH_VIEWS = 64  # views per encoder batch (about: an image's views stay together, :func:`batch_views`)

# (item, its row or -1 for none yet, the views of it to encode)
Unit = tuple[Datum, int, list[int]]


@dataclass
class BuildReport:
    """What one :meth:`CacheBuilder.build` call did. ``encoded``/``reused`` count (image, view) features."""

    encoded: int
    reused: int
    seconds: float
    images_per_s: float  # features (image x view) encoded per second of the whole call
    path: Path
    # where the time of the encoding went: the caller's thread normalising and encoding, the same thread waiting for
    # decoded views, the writer thread inside transactions (beside the encoder); and how it was split
    encode_seconds: float = 0.0
    input_wait_seconds: float = 0.0
    write_seconds: float = 0.0
    transactions: int = 0
    workers: int = 0


class CacheBuilder(CacheFiles):
    """Builds cache files: creates them, appends rows for new images, encodes only the missing (image, view) pairs.

    ``transaction_bytes`` and ``transaction_seconds`` size the writer's transactions: whole row blocks are committed
    once that many bytes of features wait, and everything waiting once the oldest has waited that long (what a killed
    build can lose)."""

    transaction_bytes: int = 16 << 20
    transaction_seconds: float = 5.0

    def build(self, backbone: Backbone, dataset: str, items: Sequence[Datum], num_views: int = 0,
              aug_seed: int = 0, batch_size: int = BATCH_VIEWS, num_workers: int | None = None,
              device: str | None = None, precision: str = "auto", progress: bool = True) -> BuildReport:
        """Encode views 0..``num_views`` of every item, only those not cached yet (moves the backbone to ``device``).

        ``precision``: "auto" (the file's recorded precision, else fp16 autocast on CUDA and fp32 on CPU), "fp32",
        "fp16" or "bf16". ``num_workers``: None is :func:`default_workers`. When everything is cached already,
        nothing is written (a read-only cache folder works)."""
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
            timings: dict[str, float] = {}
            if todo:
                backbone.to(run_device)
                timings = self._encode_all(backbone, path, spec, units, todo, batch_size, num_workers, run_device,
                                           precision, progress, desc=f"Encoding {dataset} ({path.name})")
        seconds = time.perf_counter() - start
        report = BuildReport(encoded=todo, reused=total - todo, seconds=seconds,
                             images_per_s=todo / seconds if todo and seconds > 0 else 0.0, path=path, **timings)
        if progress and todo:
            say(f"cache: encoded {todo} feature(s) of {dataset} in {seconds:.1f} s ({report.images_per_s:.1f} "
                f"views/s), reused {report.reused} -> {path}")
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
                    desc: str) -> dict[str, float]:
        """Decode, encode and write every unit; returns the stages' seconds (see :class:`BuildReport`)."""
        if num_workers is None:
            num_workers = default_workers(device) if todo > batch_size else 0
        loader = DataLoader(_ViewDataset(units, spec), batch_sampler=_batches(units, batch_size),
                            num_workers=num_workers, collate_fn=_collate, pin_memory=device.type == "cuda")
        writer = Writer(self._commit, path, self.transaction_bytes, self.transaction_seconds)
        encoding = waiting = 0.0
        with progress_bar(total=todo, unit="view", desc=desc, enabled=progress, dynamic_ncols=True) as bar, \
                ProgressLines(todo, desc, "view", enabled=progress) as lines, writer:
            clock = time.perf_counter()
            for pixels, rows, views in loader:
                now = time.perf_counter()
                waiting += now - clock
                features = _encode(backbone, normalize_pixels(pixels, spec, device), device, precision)
                clock = time.perf_counter()
                encoding += clock - now
                writer.put(rows, views, features)
                bar.update(len(rows))
                lines.update(len(rows))
        return {"encode_seconds": encoding, "input_wait_seconds": waiting, "write_seconds": writer.busy_seconds,
                "transactions": writer.transactions, "workers": num_workers}

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


def default_workers(device: torch.device) -> int:
    """Decoding processes of a build: on a GPU every CPU this process may use but one (which feeds the GPU and
    writes); on the CPU one, since the encoder needs the cores and cutting a view costs tens of times less than
    encoding it (``benchmarks/cache_build.py`` measures both)."""
    return max(1, available_cpus().count - 1) if device.type == "cuda" else 1


class Writer:
    """Commits encoded batches in a thread beside the encoder, in transactions of whole row blocks.

    :meth:`put` hands over a batch (waiting while a few are queued, so memory stays bounded); whole blocks of
    :data:`FEATURE_CHUNK_ROWS` rows are committed once ``transaction_bytes`` of them wait (cells arrive in row order),
    and everything kept once the oldest batch has waited ``transaction_seconds``. Leaving the ``with`` block commits
    the rest, also when the encoder failed or was interrupted; a failed transaction is raised in the caller's thread
    at its next :meth:`put` or on leaving the block."""

    def __init__(self, commit, path: Path, transaction_bytes: int, transaction_seconds: float, depth: int = 8):
        self.commit, self.path = commit, path
        self.transaction_bytes, self.transaction_seconds = transaction_bytes, transaction_seconds
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._run, name=f"cache writer {path.name}", daemon=True)
        self.error: BaseException | None = None
        self.committed = self.transactions = 0
        self.busy_seconds = 0.0

    def __enter__(self) -> "Writer":
        self.thread.start()
        return self

    def put(self, rows: np.ndarray, views: np.ndarray, features: torch.Tensor | np.ndarray) -> None:
        self._raise_failure()
        self.queue.put((rows, views, features))

    def __exit__(self, *exc) -> None:
        self.queue.put(None)
        self.thread.join()
        if exc[0] is None:
            self._raise_failure()

    def _raise_failure(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which may still be putting
            self.error = exc
            while self.queue.get() is not None:
                pass

    def _loop(self) -> None:
        kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        kept_bytes, since, block = 0, 0.0, -1
        while True:
            try:  # with cells kept, wake up when the oldest has waited long enough even if no batch comes
                item = self.queue.get(timeout=max(0.0, since + self.transaction_seconds - time.perf_counter())
                                      if kept else None)
            except queue.Empty:
                kept, kept_bytes = self._write(kept, everything=True), 0
                continue
            if item is None:
                break
            if self.error is not None:
                continue  # drain: the caller raises the failure at its next put
            rows, views, features = item
            if isinstance(features, torch.Tensor):
                features = features.cpu().numpy()  # on a GPU: waits here for the batch, not in the encoder's thread
            if not kept:
                since = time.perf_counter()
            kept.append((rows, views, features))
            kept_bytes += features.nbytes
            newest = int(rows.max()) // FEATURE_CHUNK_ROWS
            if time.perf_counter() - since >= self.transaction_seconds:
                kept = self._write(kept, everything=True)
            elif kept_bytes >= self.transaction_bytes and newest > block:  # a row block was completed
                kept = self._write(kept, everything=False)
                since = time.perf_counter()
            block = max(block, newest)
            kept_bytes = sum(f.nbytes for _, _, f in kept)
        if kept and self.error is None:
            self._write(kept, everything=True)

    def _write(self, kept: list, everything: bool) -> list:
        """Commit the kept cells (all, or those of whole row blocks); returns what is kept for later."""
        rows = np.concatenate([r for r, _, _ in kept])
        views = np.concatenate([v for _, v, _ in kept])
        features = np.concatenate([f for _, _, f in kept])
        ready = np.ones(len(rows), dtype=bool) if everything else (
            rows < int(rows.max()) // FEATURE_CHUNK_ROWS * FEATURE_CHUNK_ROWS)
        if ready.any():
            clock = time.perf_counter()
            try:
                self.commit(self.path, rows[ready], views[ready], features[ready], self.committed)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                self.error = exc
                return []
            self.busy_seconds += time.perf_counter() - clock
            self.committed += int(ready.sum())
            self.transactions += 1
        rest = ~ready
        return [(rows[rest], views[rest], features[rest])] if rest.any() else []


def _encode(backbone: Backbone, pixels: torch.Tensor, device: torch.device, precision: str) -> torch.Tensor:
    """Features (B, D) float32 on ``device`` (not waited for on a GPU: the writer thread copies them out)."""
    with torch.no_grad():
        if precision == "fp32":
            features = backbone.encode_image(pixels)
        else:
            with torch.autocast(device_type=device.type, dtype=_AUTOCAST_DTYPES[precision]):
                features = backbone.encode_image(pixels)
    return features.float()


def write_cells(ds: h5py.Dataset, rows: np.ndarray, views: np.ndarray, values: np.ndarray | bool) -> None:
    """``ds[rows[i], views[i]] = values[i]`` for distinct cells. Cells that fill their bounding block are written as
    that block (HDF5 then writes each whole chunk without reading it); a block they fill densely enough is read,
    updated and written back; scattered cells are written one view at a time."""
    lo, hi = int(rows.min()), int(rows.max()) + 1
    vlo, vhi = int(views.min()), int(views.max()) + 1
    area = (hi - lo) * (vhi - vlo)
    if area == len(rows) or area <= 4 * len(rows) + 64:
        if area == len(rows):
            block = np.empty((hi - lo, vhi - vlo) + ds.shape[2:], dtype=ds.dtype)
        else:
            block = ds[lo:hi, vlo:vhi]
        block[rows - lo, views - vlo] = values
        ds[lo:hi, vlo:vhi] = block
        return
    for view in np.unique(views).tolist():
        at = np.flatnonzero(views == view)
        order = at[np.argsort(rows[at], kind="stable")]
        ds[rows[order], view] = values if isinstance(values, bool) else values[order]


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
    """Decodes one image per index and returns the 8-bit pixels of the requested views (workers decode in parallel)."""

    def __init__(self, units: list[Unit], spec: TransformSpec):
        self.units = units
        self.spec = spec

    def __len__(self) -> int:
        return len(self.units)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int, list[int]]:
        datum, row, views = self.units[index]
        return load_view_pixels(datum.impath, datum.key, views, self.spec), row, views


def _collate(samples: list[tuple[np.ndarray, int, list[int]]]) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    pixels = torch.from_numpy(np.concatenate([s[0] for s in samples]))
    rows = np.array([s[1] for s in samples for _ in s[2]], dtype=np.int64)
    views = np.array([v for s in samples for v in s[2]], dtype=np.int64)
    return pixels, rows, views


def batch_views(views: int, batch_size: int = BATCH_VIEWS) -> int:
    """Views per encoder batch (:func:`_batches`) of images lacking ``views`` each: whole images, one at least."""
    return views * max(1, batch_size // views)


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
