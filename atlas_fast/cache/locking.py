"""Locks that let readers and builders of one cache file share it safely across processes.

``fcntl.flock`` on two side files: ``<file>.lock``, *shared* by readers and *exclusive* for one write transaction,
so a reader sees only committed batches; ``<file>.build.lock``, exclusive for a whole build, so a second builder
waits, then encodes only what is left. HDF5's SWMR mode was not used: it admits a single writer for the file's
lifetime, forbids creating datasets or attributes while readers are open, and needs ``libver="latest"``. HDF5's own
file locking is switched off (it fails on some network file systems). A complete cache in a read-only folder is read
without any lock file.
"""

from __future__ import annotations

import fcntl
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def lock_path(path: Path) -> Path:
    """The side file that readers share and a write transaction holds alone."""
    return path.with_name(path.name + ".lock")


def build_lock_path(path: Path) -> Path:
    """The side file a build holds alone from start to end."""
    return path.with_name(path.name + ".build.lock")


@contextmanager
def flock(path: Path, exclusive: bool, wait_message: str | None = None) -> Iterator[None]:
    """Hold an flock on ``path`` (created if needed). Read-only cache folders are read without a lock."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        if exclusive or not path.exists():
            if exclusive:
                raise
            yield
            return
        fd = os.open(path, os.O_RDONLY)
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait_message:
                print(wait_message, file=sys.stderr, flush=True)
            fcntl.flock(fd, mode)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
