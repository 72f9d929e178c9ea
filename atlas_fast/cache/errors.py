"""The feature cache's error classes: every failure a caller may want to tell apart derives from :class:`CacheError`."""

from __future__ import annotations

from pathlib import Path


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
