"""Atomic file writes and checksums shared by the result records, the stored few-shot subsets and soft labels.

A file is written under a temporary name in its folder, flushed to disk and renamed over the target, so a crash or
a concurrent reader never sees half a file. The temporary file is created private (``mkstemp``) and then given the
permissions an ordinary ``open()`` would: ``0o666`` less the user's umask.

Stored artefacts that are read back carry a BLAKE2b checksum (:func:`blake2b_hex`, :func:`file_blake2b`) so that
bytes changed on disk (a disk fault, an outside write) are detected instead of silently loaded: ``torch.load``
does not check the CRCs of its zip entries, and JSON that still parses says nothing about its values.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def umask_mode(mode: int = 0o666) -> int:
    """``mode`` less the process's umask (read without changing it, where /proc allows)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return mode & ~int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mode & ~mask


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` with ``write(file)`` atomically (temporary file + fsync + rename), with the umask's mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def blake2b_hex(data: bytes) -> str:
    """The checksum stored beside an artefact: BLAKE2b-256 of ``data``, as 64 hex digits."""
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def file_blake2b(path: Path, block: int = 1 << 20) -> str:
    """:func:`blake2b_hex` of a file's bytes, read in blocks (memory stays bounded for large files)."""
    digest = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def check_writable(folder: Path, what: str) -> None:
    """Create ``folder`` if needed and prove that a file can be created in it; the error names the folder and
    ``what`` it is for."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".write-check.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise PermissionError(f"{what} {folder} is not writable ({exc.strerror or exc}); fix its permissions or "
                              f"choose another folder before any compute is spent.") from exc


def check_folder_name(name: str, root: Path) -> None:
    """``name`` becomes a folder under ``root`` (cache, results): it must be one plain path component."""
    if not name or "/" in name or os.sep in name or name.startswith("."):
        raise ValueError(f"Invalid dataset name {name!r} for a folder under {root}: use a plain name such as "
                         f"'OxfordPets' (no path separators, not starting with '.').")
