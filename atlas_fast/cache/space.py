"""Disk and memory budgets of the feature cache: refuse what cannot fit before any work, reserve before each write.

A build first compares the space its missing features need with the free space and refuses before encoding; each
write transaction then reserves the bytes it may add (``posix_fallocate``) *before* HDF5 touches the file, so running
out of space (or into a file-size limit) mid-build raises :class:`CacheSpaceError` with every finished batch intact
and readable. A load refuses up front a request larger than the available memory.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from atlas_fast.cache.errors import CacheSpaceError
from atlas_fast.cache.format import DONE_CHUNK, FEATURE_CHUNK_ROWS, MAX_VIEWS


def check_views_fit(num_views: int, num_images: int, dim: int, storage_dtype: str, path: Path) -> None:
    """Refuse views 0..``num_views`` beyond :data:`MAX_VIEWS` or beyond what the free disk space (plus what the
    file holds already) can store for ``num_images`` images, before anything is sized by ``num_views``."""
    if num_views > MAX_VIEWS:
        raise ValueError(f"views {num_views} is out of range for the feature cache: the valid range is "
                         f"0..{MAX_VIEWS} augmented views per image.")
    per_view = max(num_images, 1) * dim * np.dtype(storage_dtype).itemsize
    room = free_bytes(path.parent) + (path.stat().st_size if path.exists() else 0)
    fit = room // per_view - 1
    if num_views > max(fit, 0):
        raise ValueError(
            f"views {num_views} is out of range for {num_images} images: the valid range is 0..{max(fit, 0)} "
            f"(views 0..{num_views} of {dim}-dim {storage_dtype} features need "
            f"{human_bytes((num_views + 1) * per_view)}; {human_bytes(room)} fit under {path.parent}).")


def check_free_space(path: Path, count: int, dim: int, storage_dtype: str) -> None:
    """Refuse a build whose ``count`` missing features cannot fit in the free space, before encoding anything
    (an estimate: 25 % + 1 MiB over the raw bytes, for partly filled chunks and metadata)."""
    needed = int(count * dim * np.dtype(storage_dtype).itemsize * 1.25) + (1 << 20)
    free = shutil.disk_usage(path.parent).free
    if needed > free:
        raise CacheSpaceError(
            f"Encoding {count} features into {path} needs about {human_bytes(needed)}, but only "
            f"{human_bytes(free)} is free there. Free some space or use another --cache-root; nothing was "
            f"encoded.")


def check_load_fits_memory(num_images: int, num_views: int, dim: int) -> None:
    """Refuse loading ``num_views`` views of ``num_images`` float32 features when they exceed the available memory."""
    needed = num_images * num_views * dim * 4
    available = available_memory()
    if available is not None and needed > available:
        raise ValueError(f"views: loading {num_views} views of {num_images} images needs "
                         f"{human_bytes(needed)} of memory, but {human_bytes(available)} is available; the "
                         f"valid range is at most {available // max(num_images * dim * 4, 1)} "
                         f"views per load: load fewer views or images at a time.")


def reserve(path: Path, nbytes: int, kept: str) -> None:
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


def chunk_bytes(rows: np.ndarray, views: np.ndarray, dim: int, itemsize: int) -> int:
    """An upper bound of the bytes that writing cells (rows[i], views[i]) adds: every chunk touched, plus slack."""
    feature_chunks = len(set(zip((rows // FEATURE_CHUNK_ROWS).tolist(), views.tolist())))
    done_chunks = len(set(zip((rows // DONE_CHUNK[0]).tolist(), (views // DONE_CHUNK[1]).tolist())))
    return (feature_chunks * (FEATURE_CHUNK_ROWS * dim * itemsize + 64)
            + done_chunks * (DONE_CHUNK[0] * DONE_CHUNK[1] + 64) + (64 << 10))


def free_bytes(folder: Path) -> int:
    """Free space of the file system that holds ``folder`` (or its nearest existing parent)."""
    folder = folder.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def available_memory() -> int | None:
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


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
