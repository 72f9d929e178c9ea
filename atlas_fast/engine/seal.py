"""Seals and provenance of result records: what makes a record's numbers checkable and its origin known.

A record's ``seal`` is the BLAKE2b-256 of the canonical JSON of every other field of the record as written
(configuration, data and backbone fingerprints, metrics, per-epoch values, timings, versions, provenance and the
checksum of the learned tensors), so any change to the numbers a table quotes, by a disk fault or an edit, no
longer matches it. It is a checksum, not a signature: whoever edits a record and recomputes the seal with this
module is not detected (docs/guarantees.md, section Sealed records). An unsealed record is read with a warning
(:func:`seal_problem` returns None for it, :func:`is_sealed` tells it apart).

``provenance`` records what the versions do not (the code's git commit and dirty flag, torch's CUDA version, the
device's name), so tables made on two machines, or by two states of the code, can be told apart.
"""

from __future__ import annotations

import functools
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

from atlas_fast.files import blake2b_hex

SEAL_FIELD = "seal"
# Fields a run adds to the record it returns but never writes (they say where the file is and whether it was reused).
_NOT_WRITTEN = ("path", "skipped")


def canonical_json(record: dict[str, Any]) -> bytes:
    """The bytes a seal covers: every written field but the seal, with sorted keys and no whitespace."""
    content = {k: v for k, v in record.items() if k != SEAL_FIELD and k not in _NOT_WRITTEN}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def record_seal(record: dict[str, Any]) -> str:
    """The seal of a record's content (64 hex digits)."""
    return blake2b_hex(canonical_json(record))


def sealed(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as it will read back from its JSON file (paths and other objects as text), with its ``seal``."""
    written = json.loads(json.dumps({k: v for k, v in record.items() if k != SEAL_FIELD and k not in _NOT_WRITTEN},
                                    default=str, allow_nan=False))
    return {**written, SEAL_FIELD: record_seal(written)}


def is_sealed(record: dict[str, Any]) -> bool:
    return SEAL_FIELD in record


def seal_problem(record: dict[str, Any]) -> str | None:
    """Why a record's seal does not match its content, or None (a matching seal, or a record from before seals)."""
    if SEAL_FIELD not in record:
        return None
    seal = record[SEAL_FIELD]
    if not isinstance(seal, str):
        return "its seal is not a checksum"
    try:
        actual = record_seal(record)
    except (TypeError, ValueError) as exc:  # NaN, or values JSON cannot hold
        return f"its content cannot be sealed ({exc})"
    if actual != seal:
        return "its seal does not match its content (the record was edited or damaged after it was written)"
    return None


@functools.lru_cache(maxsize=1)
def code_commit() -> dict[str, Any]:
    """``{"git_commit": sha, "git_dirty": bool}`` of the git checkout the atlas_fast package was imported from, or
    ``{"git_commit": None, "git_dirty": None}`` for an installed copy (no checkout around it, or git missing).
    ``git_dirty`` counts changes to tracked files only (results and caches kept in the checkout do not count)."""
    import atlas_fast

    package = Path(atlas_fast.__file__).resolve().parent
    unknown = {"git_commit": None, "git_dirty": None}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(package), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel")).resolve()
        if top / "atlas_fast" != package:  # the package lies in some other repository (e.g. a venv inside one)
            return unknown
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return unknown
    return {"git_commit": commit, "git_dirty": dirty}


def device_name(device: Any) -> str:
    """The name of the device a run trained on: the GPU's (``NVIDIA H100 80GB HBM3``), else the CPU's model."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or device.type


def provenance(device: Any) -> dict[str, Any]:
    """The record's ``provenance``: code commit (and dirty flag), CUDA version torch was built with (None for a CPU
    build), the device type and name."""
    import torch

    return {**code_commit(), "cuda": torch.version.cuda, "device_type": torch.device(device).type,
            "device_name": device_name(device)}
