"""Data identity: what a list of images *is*, independent of where the data root lies.

Features, few-shot subsets and result records are keyed by these fingerprints together with the dataset name, so
two datasets that share a name (``folder:projA/data`` and ``folder:projB/data``) or an image replaced in place
never share features or records, while moving or renaming the data root changes nothing.

The functions that take ``memo`` (a dict kept with a listing while a sweep is planned) compute what the sweep's runs
share (the listing's fingerprint, each file's identity) once instead of once per run; the values are the same.
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterable, Sequence

from atlas_fast.data.base import DatasetSplits, Datum
from atlas_fast.files import file_blake2b

_CONTENT_PREFIX = "b2:"
# Content hashes already computed in this process, by (path, inode, size, mtime_ns, ctime_ns): a run fingerprints its
# images when it is planned and the cache checks the same images when it builds and loads; the bytes are read once.
# Any write to a file moves its ctime (which no tool can set back), so an edit that restores size and mtime is seen.
_CONTENT_HASHES: dict[tuple[str, int, int, int, int], str] = {}
_CONTENT_HASHES_MAX = 1 << 21


def image_identity(path: str, content: bool = False) -> str:
    """``"<size>:<mtime_ns>"`` of the file, or ``"b2:<32 hex>"`` (BLAKE2b of its bytes) with ``content``.

    Raises ``FileNotFoundError`` naming the file when it is gone. Within one process a file whose inode, size, mtime and
    ctime have not changed is hashed once (planning, cache build and cache load all ask for the same images)."""
    stat = os.stat(path)
    if not content:
        return f"{stat.st_size}:{stat.st_mtime_ns}"
    memo = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if memo not in _CONTENT_HASHES:
        if len(_CONTENT_HASHES) >= _CONTENT_HASHES_MAX:
            _CONTENT_HASHES.clear()
        _CONTENT_HASHES[memo] = _CONTENT_PREFIX + file_blake2b(path, digest_size=16)
    return _CONTENT_HASHES[memo]


def image_identities(items: Iterable[Datum], content: bool = False) -> list[str]:
    """:func:`image_identity` of each item's file, in order."""
    return [image_identity(d.impath, content) for d in items]


def _hash_lines(lines: Iterable[str]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for line in lines:
        digest.update(line.encode("utf-8", "surrogateescape"))
        digest.update(b"\n")
    return digest.hexdigest()


def _listing_lines(splits: DatasetSplits) -> Iterable[str]:
    for name in ("train", "val", "test"):
        yield f"[{name}]"
        for d in getattr(splits, name):
            yield f"{d.key}\t{d.label}\t{d.classname}"


def listing_fingerprint(splits: DatasetSplits) -> str:
    """BLAKE2b (32 hex) of the ordered (key, label, class name) lists of train, val and test (no file access)."""
    return _hash_lines(_listing_lines(splits))


def items_fingerprint(items: Sequence[Datum]) -> str:
    """BLAKE2b (32 hex) of one ordered list's (key, label) pairs: what a few-shot draw from it depends on."""
    return _hash_lines(f"{d.key}\t{d.label}" for d in items)


def _memo_identity(datum: Datum, content: bool, memo: dict | None) -> str:
    """:func:`image_identity` of one item, taken once per ``memo`` (one sweep's planning)."""
    if memo is None:
        return image_identity(datum.impath, content)
    identities = memo.setdefault(("image_identity", content), {})
    if datum.impath not in identities:
        identities[datum.impath] = image_identity(datum.impath, content)
    return identities[datum.impath]


def dataset_fingerprint(splits: DatasetSplits, content: bool = False, memo: dict | None = None) -> str:
    """BLAKE2b (32 hex) of the listing and of every listed file's identity (see :func:`image_identity`).

    Independent of the data root's location; changes when an image is added, removed, relabelled, reordered or
    replaced (by size or mtime, or by content with ``content=True``). ``memo``: file identities already taken while
    planning the same sweep (each file is looked at once per sweep)."""
    seen: dict[str, str] = {}
    for name in ("train", "val", "test"):
        for d in getattr(splits, name):
            if d.key not in seen:
                seen[d.key] = _memo_identity(d, content, memo)
    files = (f"{key}\t{identity}" for key, identity in sorted(seen.items()))
    return _hash_lines([listing_fingerprint(splits), *files])


def subset_fingerprint(full: DatasetSplits, subset: DatasetSplits, content: bool = False,
                       memo: dict | None = None) -> str:
    """Fingerprint of a run's inputs: the full dataset's listing (which fixes the few-shot draw) and the listing and
    file identities of the subset the run reads (its few-shot train/val lists and the test list). ``memo``: kept
    with ``full`` while a sweep is planned, so the full listing is hashed and each file looked at once per sweep."""
    if memo is None:
        full_listing = listing_fingerprint(full)
    else:
        if memo.get("listing_of") is not full:  # the memo belongs to one listing
            memo["listing_of"], memo["listing_fingerprint"] = full, listing_fingerprint(full)
        full_listing = memo["listing_fingerprint"]
    return _hash_lines([full_listing, dataset_fingerprint(subset, content, memo)])
