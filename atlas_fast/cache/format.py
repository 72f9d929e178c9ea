"""The on-disk format of a feature cache file: its name, layout and attributes, and the checks every open makes.

The layout (datasets ``keys``, ``image_ids``, ``features`` (N, 1+V, D), ``done`` (N, 1+V)) and the file attributes
are described, with how to read a file with h5py alone, in docs/cache.md (section File format). One file per
(dataset, backbone weights, transform)::

    <cache root>/<dataset>/<backbone fingerprint[:12]>-<transform fingerprint[:12]>.h5

A row is found by its (key, image id) pair, so an image replaced in place, or another dataset that shares the name
and a relative path, gets a row of its own; features are never reused across files that differ. ``features`` and
``done`` carry fletcher32 per chunk; ``keys_digest`` is a BLAKE2b of the keys and image ids, which HDF5 cannot
checksum (variable-length strings take no filters). The default HDF5 file format is kept: the 1.10 format checksums
its headers too, but marks a file "open for writing" while a writer has it, so a killed writer would leave a file no
reader can open.

Self-checking: the attributes are compared on every open with what the caller's backbone and transform produce
(and with the file's own name); any disagreement raises :class:`CacheMismatchError`, so features of other weights,
another transform or another augmentation seed are never silently reused.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import h5py
import numpy as np
import torch

import atlas_fast
from atlas_fast.cache.errors import CacheCorruptError, CacheError, CacheMismatchError
from atlas_fast.clip.backbones import Backbone
from atlas_fast.clip.transforms import TransformSpec
from atlas_fast.files import check_folder_name
from atlas_fast.vocabulary import STORAGE_DTYPES

FORMAT = "atlas_fast.feature_cache"
FORMAT_VERSION = 2  # 2: image_ids, fletcher32 checksums, keys_digest
FEATURE_CHUNK_ROWS = 64
DONE_CHUNK = (1024, 8)
# Augmented views per image: a sanity cap (CoOp's longest schedule is 200 epochs, one view each); below it, a build
# must also fit the free disk space and a load the available memory.
MAX_VIEWS = 10_000
REQUIRED_ATTRS = ("format", "format_version", "dataset", "backbone_fingerprint", "transform_fingerprint", "transform",
                  "preprocessing", "embed_dim", "encode_precision", "storage_dtype", "keys_digest")
REQUIRED_DATASETS = ("keys", "image_ids", "features", "done")


class CacheFiles:
    """A cache root: where the file of each (dataset, backbone, transform) lies, and how new files store features.

    ``storage_dtype`` ("float16" default, or "float32") applies to files created through this object; an existing
    file keeps its own dtype. ``content_hash`` identifies images by a hash of their bytes instead of (size, mtime).
    """

    def __init__(self, root: str | Path = "cache", storage_dtype: str = "float16", content_hash: bool = False):
        if storage_dtype not in STORAGE_DTYPES:
            raise ValueError(f"storage_dtype must be one of {STORAGE_DTYPES}, got {storage_dtype!r}.")
        self.root = Path(root)
        self.storage_dtype = storage_dtype
        self.content_hash = content_hash

    def path_for(self, backbone: Backbone, dataset: str, aug_seed: int = 0) -> Path:
        """The file holding ``dataset``'s features for this backbone and the transforms with ``aug_seed``."""
        check_folder_name(dataset, self.root)
        if not backbone.fingerprint:
            raise ValueError("The backbone has no fingerprint; load it with atlas_fast.clip.backbones.load_backbone.")
        spec = backbone.transform_for(aug_seed)
        return self.root / dataset / f"{backbone.fingerprint[:12]}-{spec.fingerprint()[:12]}.h5"


def open_h5(path: Path, mode: str) -> h5py.File:
    """Open a cache file without HDF5's own locking (see :mod:`atlas_fast.cache.locking`); failures name the file."""
    try:
        return h5py.File(path, mode, locking=False)
    except OSError as exc:
        raise CacheError(f"Cannot open feature cache file {path} ({exc}). If it is damaged (e.g. a build was killed "
                         f"while writing), delete it and build again.") from exc


def expected_attrs(backbone: Backbone, dataset: str, spec: TransformSpec) -> dict[str, object]:
    """The attributes a file for ``backbone``, ``dataset`` and ``spec`` must carry (written at creation, compared on
    every open)."""
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


def create_layout(f: h5py.File, backbone: Backbone, expected: dict[str, object], precision: str,
                  device: torch.device, storage_dtype: str) -> None:
    """Write the empty datasets and every attribute into a new file (no rows, view axis of 1)."""
    dim = int(backbone.embed_dim)
    for name in ("keys", "image_ids"):
        f.create_dataset(name, shape=(0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8"), chunks=(1024,))
    f.create_dataset("features", shape=(0, 1, dim), maxshape=(None, None, dim), dtype=storage_dtype,
                     chunks=(FEATURE_CHUNK_ROWS, 1, dim), fletcher32=True)
    f.create_dataset("done", shape=(0, 1), maxshape=(None, None), dtype=bool, chunks=DONE_CHUNK, fletcher32=True)
    for name, value in expected.items():
        f.attrs[name] = value
    f.attrs["backbone_config"] = json.dumps(backbone.config.to_dict(), sort_keys=True)
    f.attrs["backbone_architecture"] = json.dumps(backbone.architecture, sort_keys=True)
    f.attrs["encode_precision"] = precision if precision != "auto" else (
        "fp16" if device.type == "cuda" else "fp32")
    f.attrs["storage_dtype"] = storage_dtype
    f.attrs["keys_digest"] = keys_digest([], [])
    f.attrs["created_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    f.attrs["atlas_fast_version"] = atlas_fast.__version__


def keys_digest(keys: Sequence[str], image_ids: Sequence[str]) -> str:
    """BLAKE2b of the rows' (key, image id) strings: HDF5 checksums neither (variable-length strings)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update("\n".join(keys).encode("utf-8", "surrogateescape"))
    digest.update(b"\0")
    digest.update("\n".join(image_ids).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def row_index(keys: Sequence[str], image_ids: Sequence[str]) -> dict[tuple[str, str], int]:
    """The row of each (key, image id) pair."""
    return {pair: i for i, pair in enumerate(zip(keys, image_ids))}


def check_name(f: h5py.File, path: Path) -> None:
    """The file's own attributes must agree with its folder and file name."""
    if f.attrs.get("format") != FORMAT:
        raise CacheMismatchError(f"{path} is not an atlas_fast feature cache (attribute format="
                                 f"{f.attrs.get('format')!r}, expected {FORMAT!r}).")
    if int(f.attrs.get("format_version", -1)) != FORMAT_VERSION:
        raise CacheMismatchError(
            f"{path} has cache format_version {f.attrs.get('format_version')}, this code reads version "
            f"{FORMAT_VERSION} (which adds checksums and image identities); delete the file and build again.")
    check_structure(f, path)
    expected_stem = f"{str(f.attrs['backbone_fingerprint'])[:12]}-{str(f.attrs['transform_fingerprint'])[:12]}"
    if path.stem != expected_stem or path.parent.name != f.attrs.get("dataset"):
        raise CacheMismatchError(
            f"{path}: its attributes (dataset={f.attrs.get('dataset')!r}, backbone/transform fingerprints "
            f"{expected_stem}) disagree with its location; the file was renamed, moved or tampered with. "
            f"Delete it and build again.")


def check_structure(f: h5py.File, path: Path) -> None:
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


def check_attrs(f: h5py.File, path: Path, expected: dict[str, object]) -> None:
    """:func:`check_name`, then every attribute in ``expected`` (see :func:`expected_attrs`) must match."""
    check_name(f, path)
    for name, value in expected.items():
        stored = f.attrs.get(name)
        stored = stored.item() if isinstance(stored, np.generic) else stored
        if stored != value:
            raise CacheMismatchError(
                f"{path}: attribute {name!r} is {stored!r} but the requested backbone/transform gives {value!r}. "
                f"These features were made with other weights, preprocessing or transform and cannot be reused; "
                f"delete the file and build again.")


def read_rows(f: h5py.File, path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """Keys, image ids and done flags, checked against ``keys_digest`` and the chunk checksums."""
    try:
        keys = list(f["keys"].asstr()[...])
        image_ids = list(f["image_ids"].asstr()[...])
        done = f["done"][...]
    except (OSError, UnicodeDecodeError) as exc:
        raise CacheCorruptError(f"{path}: the row index (keys, image ids or done flags) is damaged ({exc}). "
                                f"Delete the file and build again.", path) from exc
    if len(keys) != len(image_ids) or len(keys) != done.shape[0] or keys_digest(keys, image_ids) != str(
            f.attrs.get("keys_digest", "")):
        raise CacheCorruptError(f"{path}: the row index does not match its checksum (keys_digest); the file "
                                f"was damaged or edited. Delete it and build again.", path)
    return keys, image_ids, done


def bad_chunks(ds: h5py.Dataset, row_ranges: Sequence[tuple[int, int]], view: int | None) -> list[int]:
    """Rows in chunks of ``ds`` that fail their checksum, among ``row_ranges`` (one view, or all)."""
    bad: list[int] = []
    for lo, hi in row_ranges:
        try:
            ds[lo:hi] if view is None else ds[lo:hi, view]
        except OSError:
            bad.extend(range(lo, hi))
    return bad


def describe_rows(rows: Sequence[int]) -> str:
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
