"""Atomic file writes and checksums shared by the result records, the stored few-shot subsets and soft labels.

A file is written under a temporary name in its folder, flushed and renamed over the target
(:func:`atomic_write`), so a crash or a concurrent reader never sees half a file; a killed writer's temporary file is
removed by the next write once its process is gone (:func:`remove_stale_temporaries`). Stored artefacts that are
read back carry a BLAKE2b checksum (:func:`blake2b_hex`, :func:`file_blake2b`): ``torch.load`` does not check the
CRCs of its zip entries, and JSON that still parses says nothing about its values. JSON that may be damaged or come
from elsewhere is read with :func:`read_json`, bounded in size and nesting depth, so one stray file is a
:class:`JsonFileError` naming it, never a ``RecursionError`` or a read of gigabytes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

#: The most bytes :func:`read_json` reads (a record is kilobytes; a report's sources of 10,000 records ~2 MB).
MAX_JSON_BYTES = 64 << 20
#: The deepest nesting :func:`read_json` accepts (atlas_fast's own files nest less than 10 levels).
MAX_JSON_DEPTH = 64
# This machine in temporary file names: a short digest of the host name (host names may hold dots).
_HOST = hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()


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


def file_in_the_way(folder: Path) -> Path | None:
    """The file that lies where ``folder`` or a folder above it should be (so it cannot be made), or None."""
    return next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)


def make_folder(folder: Path) -> None:
    """``folder.mkdir(parents=True, exist_ok=True)``; where a part of the path is a file, a ``NotADirectoryError``
    naming that file (not the folder that could not be made below it)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (NotADirectoryError, FileExistsError) as exc:
        file = file_in_the_way(folder)
        if file is None:
            raise
        raise NotADirectoryError(f"{file} is a file, not a folder: {folder} cannot be made in it.") from exc


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if needed) for the ``with`` block: a second process waits."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def temporary_path(path: Path, pid: int | None = None) -> Path:
    """The temporary name a writer of ``path`` (process ``pid``, default this one) writes before its rename:
    ``.<name>.<host>-<pid>.tmp`` beside it (:func:`atomic_write` adds ``-<random>``)."""
    return path.with_name(f".{path.name}.{_HOST}-{os.getpid() if pid is None else pid}.tmp")


def temporary_target(name: str) -> str | None:
    """The file a temporary file named ``name`` was written for (``.<target>.<tag>.tmp``, the tag without dots:
    this module's names and those of earlier versions), or None when ``name`` is not one."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    target, dot, tag = name[1:-len(".tmp")].rpartition(".")
    return target if dot and target and tag else None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):  # another user's (alive), or not a pid at all
        return pid > 0
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files of ``path`` (:func:`temporary_path`) that writers on this machine left when they
    were killed before their rename (their process is gone); returns them. Others' are left alone."""
    removed = []
    prefix = f".{path.name}.{_HOST}-"
    try:
        names = [entry.name for entry in os.scandir(path.parent) if entry.name.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        pid = name[len(prefix):-len(".tmp")].split("-")[0]
        if name.endswith(".tmp") and pid.isdigit() and not _process_alive(int(pid)):
            stale = path.with_name(name)
            try:
                stale.unlink()
                removed.append(stale)
            except OSError:
                pass
    return removed


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` with ``write(file)`` atomically (temporary file + fsync + rename), with the umask's mode; the
    temporary files a killed writer of ``path`` left on this machine are removed first. A folder with less than
    :data:`MIN_FREE_BYTES` free is refused before anything is written, and every OS error (out of space, a file-size
    limit, no permission, a read-only file system) names ``path`` (:func:`os_error_naming`); the file is then as
    it was."""
    try:
        make_folder(path.parent)
        check_free_space(path)
        remove_stale_temporaries(path)
        fd, tmp = tempfile.mkstemp(prefix=temporary_path(path).name[:-len(".tmp")] + "-", suffix=".tmp",
                                   dir=path.parent)
    except OSError as exc:
        raise os_error_naming(exc, path) from None
    try:
        os.fchmod(fd, umask_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise os_error_naming(exc, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: The least free space a folder must have for :func:`atomic_write` to start a file there: below it a write is
#: refused at once, naming the file, instead of failing part way (records and subsets are kilobytes).
MIN_FREE_BYTES = 1 << 20
# What to do about an OS error of a write, by errno.
_WRITE_ADVICE = {errno.ENOSPC: "free some space or write elsewhere",
                 errno.EDQUOT: "the disk quota is used up; free some space or write elsewhere",
                 errno.EFBIG: "the file is over a file-size limit (ulimit -f); raise it or write elsewhere",
                 errno.EROFS: "the file system is read-only; write elsewhere",
                 errno.EACCES: "no permission to write there; write elsewhere or change its permissions",
                 errno.EPERM: "no permission to write there; write elsewhere or change its permissions"}


def check_free_space(path: Path, needed: int = MIN_FREE_BYTES) -> None:
    """Refuse (``OSError`` ENOSPC naming ``path``) to write ``path`` where its folder has less than ``needed``
    bytes free; a folder whose free space cannot be read is let through (the write names any error)."""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return
    if free < needed:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: cannot write {path} (only {free} bytes are free "
                                    f"in {path.parent}; {_WRITE_ADVICE[errno.ENOSPC]})")


def os_error_naming(exc: OSError, path: Path) -> OSError:
    """``exc`` (an OSError of a write to ``path``) as an error of its type whose message names ``path`` and what to
    do: an error raised by a write to an open file descriptor (out of space, a file-size limit) names no file."""
    if str(path) in str(exc):
        return exc
    reason = exc.strerror or str(exc) or type(exc).__name__
    advice = _WRITE_ADVICE.get(exc.errno, "") if exc.errno is not None else ""
    message = f"{reason}: cannot write {path}" + (f" ({advice})" if advice else "")
    return type(exc)(exc.errno, message) if exc.errno is not None else type(exc)(message)


def blake2b_hex(data: bytes) -> str:
    """The checksum stored beside an artefact: BLAKE2b-256 of ``data``, as 64 hex digits."""
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def file_blake2b(path: str | Path, digest_size: int = 32) -> str:
    """:func:`blake2b_hex` of a file's bytes (``digest_size`` bytes of it), read in blocks of a MiB (memory stays
    bounded for large files)."""
    digest = hashlib.blake2b(digest_size=digest_size)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class JsonFileError(ValueError):
    """A JSON file that cannot be used: unreadable, not UTF-8 JSON, larger or more deeply nested than the bounds.
    ``path`` is the file, ``reason`` what is wrong (the message is both); ``position``: (line, column, what the
    parser says) where invalid JSON breaks."""

    def __init__(self, path: Path, reason: str, position: tuple[int, int, str] | None = None) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.position = path, reason, position


def json_depth(value: Any, limit: int) -> int:
    """The nesting depth of a parsed JSON value (a scalar: 0, ``[]``: 1), counted without recursion and no further
    than ``limit + 1``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def read_json(path: str | Path, max_bytes: float | None = None, **loads: Any) -> Any:
    """The JSON value in ``path``, or a :class:`JsonFileError` naming the file when it cannot be read, is not a
    regular file of UTF-8 JSON, holds more than ``max_bytes`` (None: :data:`MAX_JSON_BYTES`; ``math.inf``: no bound,
    for a file the caller keeps in memory anyway; a larger file is not read) or nests deeper than
    :data:`MAX_JSON_DEPTH`. ``loads``: passed to ``json.loads``."""
    path = Path(path)
    max_bytes = MAX_JSON_BYTES if max_bytes is None else max_bytes
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno())
            if not stat.S_ISREG(size.st_mode):
                raise JsonFileError(path, "is not a regular file")
            if size.st_size > max_bytes:
                raise JsonFileError(path, f"is larger than {max_bytes:,} bytes, more than such a file ever holds; "
                                          f"not read")
            data = f.read(size.st_size + 1)  # (a file that grew meanwhile: no more than one byte beyond)
    except OSError as exc:
        raise JsonFileError(path, f"cannot be read ({exc.strerror or exc})") from exc
    try:
        value = json.loads(data.decode("utf-8"), **loads)
    except UnicodeDecodeError as exc:
        raise JsonFileError(path, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise JsonFileError(path, f"is invalid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                            (exc.lineno, exc.colno, exc.msg)) from None
    except RecursionError:
        raise JsonFileError(path, f"is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # e.g. a parse_constant hook refusing NaN
        raise JsonFileError(path, f"is not valid JSON ({exc})") from None
    if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise JsonFileError(path, f"is nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def check_writable(folder: Path, what: str) -> None:
    """Create ``folder`` if needed and prove that a file can be created in it, with at least
    :data:`MIN_FREE_BYTES` free; the error names the folder and ``what`` it is for."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".write-check.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise PermissionError(f"{what} {folder} is not writable ({exc.strerror or exc}); fix its permissions or "
                              f"choose another folder before any compute is spent.") from exc
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if free < MIN_FREE_BYTES:  # the files written after the work would not fit: say so before it
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {what} {folder} has only {free} bytes free; "
                                    f"{_WRITE_ADVICE[errno.ENOSPC]} before any compute is spent")


def check_folder_name(name: str, root: Path) -> None:
    """``name`` becomes a folder under ``root`` (cache, results): it must be one plain path component."""
    if not name or "/" in name or os.sep in name or name.startswith("."):
        raise ValueError(f"Invalid dataset name {name!r} for a folder under {root}: use a plain name such as "
                         f"'OxfordPets' (no path separators, not starting with '.').")
