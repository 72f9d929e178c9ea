"""The HDF5 feature cache: frozen CLIP image features, encoded once per image view and read by every later run.

One file per (dataset, backbone weights, transform) under a cache root (docs/cache.md); :class:`FeatureCache` is
the one object callers use, the sum of the modules' roles (errors, format, locking, space, build, read, inspect).
"""

from __future__ import annotations

from atlas_fast.cache.build import BuildReport, CacheBuilder
from atlas_fast.cache.errors import (CacheCorruptError, CacheError, CacheMismatchError, CacheReadOnlyError,
                                     CacheSpaceError, MissingFeaturesError)
from atlas_fast.cache.format import FORMAT, FORMAT_VERSION, MAX_VIEWS
from atlas_fast.cache.inspect import CacheEntry, CacheInspector
from atlas_fast.cache.read import CacheReader
from atlas_fast.vocabulary import STORAGE_DTYPES

__all__ = ["FeatureCache", "BuildReport", "CacheEntry", "CacheError", "CacheMismatchError", "CacheCorruptError",
           "CacheSpaceError", "CacheReadOnlyError", "MissingFeaturesError", "FORMAT", "FORMAT_VERSION", "MAX_VIEWS",
           "STORAGE_DTYPES", "CacheBuilder", "CacheReader", "CacheInspector"]


class FeatureCache(CacheBuilder, CacheReader, CacheInspector):
    """Image features of frozen CLIP backbones under ``root``, one HDF5 file per (dataset, backbone, transform).

    It is the sum of three roles, each usable alone (:class:`CacheBuilder`, :class:`CacheReader`,
    :class:`CacheInspector`) on one base, :class:`~atlas_fast.cache.format.CacheFiles`.

    ``storage_dtype`` and ``content_hash`` are :class:`~atlas_fast.cache.format.CacheFiles`'; building into an
    existing file with another dtype raises, and :meth:`load` always returns float32. ``content_hash`` is slower
    (every image is read on each build and load) but catches edits that keep size and mtime.
    """
