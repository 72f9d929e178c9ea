"""What a cache root holds, for ``atlas-fast cache info``: one entry per file, and ``--verify``'s checksum pass.

Listing reads only each file's attributes and row index; problems are reported in the entry, never raised, so one
damaged file does not hide the others. Verifying reads every chunk and names the rows whose checksum fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from atlas_fast.cache.errors import CacheError
from atlas_fast.cache.format import (FEATURE_CHUNK_ROWS, CacheFiles, bad_chunks, check_name, describe_rows, open_h5,
                                     read_rows)
from atlas_fast.cache.locking import flock, lock_path
from atlas_fast.cache.space import human_bytes


@dataclass
class CacheEntry:
    """One cache file as listed by :meth:`CacheInspector.entries`. ``view_counts[v]`` = images with view v done."""

    dataset: str
    path: Path
    backbone: str
    backbone_fingerprint: str
    transform_fingerprint: str
    transform: str
    aug_seed: int | None
    num_images: int
    view_counts: list[int] = field(default_factory=list)
    encode_precision: str = ""
    storage_dtype: str = ""
    embed_dim: int = 0
    size_bytes: int = 0
    problem: str | None = None


class CacheInspector(CacheFiles):
    """Lists and verifies the files under a cache root."""

    def verify_file(self, path: Path) -> list[str]:
        """Read every chunk of ``path`` and check every checksum; returns the problems found (empty = healthy)."""
        problems: list[str] = []
        try:
            with flock(lock_path(path), exclusive=False):
                with open_h5(path, "r") as f:
                    check_name(f, path)
                    keys, _, _ = read_rows(f, path)
                    features = f["features"]
                    step = FEATURE_CHUNK_ROWS
                    ranges = [(lo, min(lo + step, len(keys))) for lo in range(0, len(keys), step)]
                    for view in range(features.shape[1]):
                        bad = bad_chunks(features, ranges, view)
                        if bad:
                            problems.append(f"features of view {view}: rows {describe_rows(bad)} fail their checksum "
                                            f"(e.g. {keys[bad[0]]!r})")
        except (CacheError, OSError, KeyError, ValueError) as exc:
            problems.append(_named(exc, path))
        return problems

    def entries(self, verify: bool = False) -> list[CacheEntry]:
        """Every cache file under the root, with its size and what it holds (problems reported, not raised).
        ``verify`` also reads every chunk and checks its checksum (slow: reads the whole file). A root that is not
        a folder raises :class:`FileNotFoundError` naming it (a mistyped ``--cache-root`` is not an empty cache)."""
        if not self.root.is_dir():
            raise FileNotFoundError(f"Feature cache folder {self.root} does not exist"
                                    f"{' (it is a file)' if self.root.exists() else ''}; check the cache root.")
        found = []
        for path in sorted(self.root.glob("*/*.h5")):
            entry = CacheEntry(dataset=path.parent.name, path=path, backbone="?", backbone_fingerprint="",
                               transform_fingerprint="", transform="?", aug_seed=None, num_images=0,
                               size_bytes=path.stat().st_size)
            try:
                with flock(lock_path(path), exclusive=False):
                    with open_h5(path, "r") as f:
                        attrs = f.attrs
                        entry.backbone_fingerprint = str(attrs.get("backbone_fingerprint", ""))
                        entry.transform_fingerprint = str(attrs.get("transform_fingerprint", ""))
                        config = json.loads(attrs.get("backbone_config", "{}"))
                        entry.backbone = (f"{config.get('model', '?')} ({config.get('pretrained') or 'random init'})"
                                          f" [{entry.backbone_fingerprint[:12]}]")
                        transform = json.loads(attrs.get("transform", "{}"))
                        entry.aug_seed = transform.get("aug_seed")
                        view0 = transform.get("view0", {})
                        entry.transform = (f"{view0.get('size', '?')}px {view0.get('interpolation', '?')} "
                                           f"aug_seed={entry.aug_seed} [{entry.transform_fingerprint[:12]}]")
                        entry.encode_precision = str(attrs.get("encode_precision", ""))
                        entry.storage_dtype = str(attrs.get("storage_dtype", ""))
                        entry.embed_dim = int(attrs.get("embed_dim", 0))
                        entry.num_images = int(f["keys"].shape[0])
                        entry.view_counts = [int(c) for c in f["done"][...].sum(axis=0)]
                        check_name(f, path)
            except (CacheError, OSError, KeyError, ValueError) as exc:
                entry.problem = _named(exc, path)
            if verify and entry.problem is None:
                entry.problem = "; ".join(self.verify_file(path)) or None
            found.append(entry)
        return found

    def info(self, verify: bool = False, entries: list[CacheEntry] | None = None) -> str:
        """A table of :meth:`entries` (or of the given ``entries``) for humans: one line per file, the total size.
        A missing root raises :class:`FileNotFoundError` (see :meth:`entries`)."""
        entries = self.entries(verify) if entries is None else entries
        if not entries:
            return f"No feature cache files under {self.root}."
        header = ("dataset", "backbone", "transform", "images", "views done", "precision", "size")
        rows = [header]
        for e in entries:
            rows.append((e.dataset, e.backbone, e.transform, str(e.num_images),
                         _views_summary(e.view_counts), f"{e.encode_precision}->{e.storage_dtype}",
                         human_bytes(e.size_bytes)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        for e in entries:
            if e.problem:
                lines.append(f"PROBLEM {e.path}: {e.problem}")
        total = sum(e.size_bytes for e in entries)
        checked = ("; every chunk verified" + (" - no problem found" if not any(e.problem for e in entries) else "")
                   if verify else " (checksums not read: --verify reads every chunk)")
        lines.append(f"{len(entries)} file(s), {human_bytes(total)} under {self.root}{checked}")
        return "\n".join(lines)


def _views_summary(counts: list[int]) -> str:
    """``[100, 40, 40, 40]`` -> ``"v0:100 v1-3:40"``."""
    parts: list[str] = []
    start = 0
    for v in range(1, len(counts) + 1):
        if v == len(counts) or counts[v] != counts[start]:
            name = f"v{start}" if v - 1 == start else f"v{start}-{v - 1}"
            parts.append(f"{name}:{counts[start]}")
            start = v
    return " ".join(parts) or "-"


def _named(exc: BaseException, path: Path) -> str:
    """An exception's message, prefixed with ``path`` unless it names it already."""
    text = str(exc)
    return text if str(path) in text else f"{path}: {type(exc).__name__}: {text}"
