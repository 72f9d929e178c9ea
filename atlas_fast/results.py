"""Result records: one JSON file per training run, plus the learned tensors beside it.

A record is named by a hash of the run's configuration and the backbone fingerprint, so an identical run finds its
finished record and is skipped (sweeps can be re-launched after a crash and only redo what is missing). Files are
written to a temporary name and renamed, so a crash never leaves a half-written record.

Layout under ``results_dir`` (default ``results/``)::

    <dataset>/<method>-<schedule>-<setting>-<shots>shot-seed<seed>-<hash12>.json   the record
    <dataset>/<method>-<schedule>-<setting>-<shots>shot-seed<seed>-<hash12>.pt     learned tensors (torch.save)

Record fields: ``key`` (full hash), ``status`` ("finished"), ``config`` (the run's configuration), ``backbone``
(fingerprint, architecture, description), ``metrics`` (final: base/new/all/H, zero-shot references), ``epochs``
(per-epoch loss, lr, soft-label flag and optional accuracies), ``timings`` (seconds per stage), ``versions``
(python/torch/open_clip/numpy/atlas_fast), ``created`` (UTC ISO time) and ``learned`` (file name of the ``.pt``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch


def record_key(config: dict[str, Any], backbone_fingerprint: str) -> str:
    """A stable hash of the (JSON-serialisable) configuration and the backbone fingerprint."""
    canonical = json.dumps({"config": config, "backbone": backbone_fingerprint}, sort_keys=True, default=str)
    return hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


def package_versions() -> dict[str, str]:
    """Versions of what determines the numbers, for the record."""
    import numpy
    import open_clip

    import atlas_fast

    return {"python": platform.python_version(), "torch": torch.__version__, "open_clip": open_clip.__version__,
            "numpy": numpy.__version__, "atlas_fast": atlas_fast.__version__}


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _atomic_write_bytes(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ResultStore:
    """Finished run records under ``root``, looked up by name stem (see the module docstring)."""

    def __init__(self, root: str | Path = "results") -> None:
        self.root = Path(root)

    def record_path(self, dataset: str, stem: str) -> Path:
        return self.root / dataset / f"{stem}.json"

    def learned_path(self, dataset: str, stem: str) -> Path:
        return self.root / dataset / f"{stem}.pt"

    def find(self, dataset: str, stem: str) -> dict[str, Any] | None:
        """The finished record with this name, or None (a record without its learned tensors counts as missing)."""
        path = self.record_path(dataset, stem)
        if not path.is_file():
            return None
        record = read_record(path)
        if record.get("status") != "finished" or not self.learned_path(dataset, stem).is_file():
            return None
        return record

    def save(self, dataset: str, stem: str, record: dict[str, Any], learned: dict[str, torch.Tensor]) -> Path:
        """Write the learned tensors, then the record (so a record never points at a missing ``.pt``)."""
        learned_path = self.learned_path(dataset, stem)
        _atomic_write_bytes(learned_path, lambda f: torch.save(learned, f))
        record = {**record, "status": "finished", "learned": learned_path.name}
        text = json.dumps(record, indent=2, sort_keys=False, default=str).encode()
        path = self.record_path(dataset, stem)
        _atomic_write_bytes(path, lambda f: f.write(text))
        return path


def build_record(key: str, described: dict[str, Any], backbone, paths: dict[str, str], data: dict[str, Any],
                 metrics: dict[str, Any], epochs: list[dict[str, Any]], timings: dict[str, float]) -> dict[str, Any]:
    """A run's record (the fields of the module docstring, less ``status`` and ``learned``, which :meth:`ResultStore.save`
    adds)."""
    return {
        "key": key, "created": utc_now(), "config": described,
        "backbone": {"fingerprint": backbone.fingerprint, "description": backbone.describe(),
                     "architecture": backbone.architecture},
        "paths": paths, "data": data, "metrics": metrics, "epochs": epochs, "timings": timings,
        "versions": package_versions(),
    }


def read_record(path: str | Path) -> dict[str, Any]:
    """Load a record JSON, with an error naming the file if it is not one."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a readable atlas_fast result record ({exc}).") from exc
    if not isinstance(record, dict) or "config" not in record:
        raise ValueError(f"{path} is not an atlas_fast result record (no 'config' field).")
    return record


def load_learned(record_path: str | Path) -> dict[str, torch.Tensor]:
    """The learned tensors saved beside a record."""
    record_path = Path(record_path)
    record = read_record(record_path)
    learned = record_path.with_name(record.get("learned", record_path.with_suffix(".pt").name))
    if not learned.is_file():
        raise FileNotFoundError(f"Learned tensors {learned} for record {record_path} are missing.")
    return torch.load(learned, map_location="cpu", weights_only=True)
