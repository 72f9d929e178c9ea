"""Reads of cached features: the (N, views, D) float32 tensor of some images, after every check of the format.

A read holds the file's lock shared (:mod:`atlas_fast.cache.locking`), so it sees only committed batches; features
that are not there, or whose image changed on disk since, raise :class:`MissingFeaturesError` with the command that
builds them, and bytes that fail their checksum raise :class:`CacheCorruptError` naming the rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import h5py
import numpy as np
import torch

from atlas_fast.cache.errors import CacheCorruptError, MissingFeaturesError
from atlas_fast.cache.format import (FEATURE_CHUNK_ROWS, MAX_VIEWS, CacheFiles, bad_chunks, check_attrs,
                                     describe_rows, expected_attrs, open_h5, read_rows, row_index)
from atlas_fast.cache.locking import flock, lock_path
from atlas_fast.cache.space import check_load_fits_memory
from atlas_fast.clip.backbones import Backbone
from atlas_fast.data.base import Datum
from atlas_fast.data.identity import image_identities


class CacheReader(CacheFiles):
    """Reads features of cache files; never writes (a complete cache in a read-only folder is read as it is)."""

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
        check_load_fits_memory(len(items), len(views), int(backbone.embed_dim))
        spec = backbone.transform_for(aug_seed)
        path = self.path_for(backbone, dataset, aug_seed)
        if not path.exists():
            missing = [(d.key, v) for d in items for v in views]
            raise self._missing_error(path, backbone, dataset, missing, len(missing), views, aug_seed)
        image_ids = image_identities(items, self.content_hash)
        expected = expected_attrs(backbone, dataset, spec)
        with flock(lock_path(path), exclusive=False):
            with open_h5(path, "r") as f:
                check_attrs(f, path, expected)
                keys, ids, done = read_rows(f, path)
                row_of = row_index(keys, ids)
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
                            out[:, j] = read_view(f["features"], rows, v)
                        except OSError as exc:
                            raise _corrupt_error(f, path, keys, rows, v) from exc
        return torch.from_numpy(out)

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


def read_view(ds: h5py.Dataset, rows: np.ndarray, view: int) -> np.ndarray:
    """``ds[rows, view]`` for any row order; reads one contiguous slab when the rows are dense, else fancy-indexes."""
    unique, inverse = np.unique(rows, return_inverse=True)
    lo, hi = int(unique[0]), int(unique[-1]) + 1
    if hi - lo <= 8 * len(unique) + 1024:
        data = ds[lo:hi, view][unique - lo]
    else:
        data = ds[unique, view]
    return data[inverse]


def _corrupt_error(f: h5py.File, path: Path, keys: list[str], rows: np.ndarray, view: int) -> CacheCorruptError:
    step = FEATURE_CHUNK_ROWS
    chunks = sorted({int(r) // step for r in rows.tolist()})
    bad = bad_chunks(f["features"], [(c * step, min((c + 1) * step, len(keys))) for c in chunks], view)
    where = f"rows {describe_rows(bad)} (e.g. {keys[bad[0]]!r})" if bad else "some rows"
    return CacheCorruptError(
        f"{path}: stored features of view {view}, {where}, fail their checksum: the file is damaged (disk "
        f"fault or an outside write). Delete it and build again; `atlas-fast cache info --verify` lists every "
        f"damaged row.", path, bad)
