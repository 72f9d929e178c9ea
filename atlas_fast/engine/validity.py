"""What counts as a valid result record: the one validator. No heavy import (``atlas-fast report`` checks a folder
with it before torch is imported).

A record is valid when it reads back as JSON, is finished, holds its key, finite metrics with zero-shot references,
a data fingerprint and what evaluating its run needs, its config fields have the types the report groups by, and
its seal matches (:mod:`atlas_fast.engine.seal`; a record from before seals is valid, used with a warning). A
stored record is also checked against the run's key and the checksum of its learned tensors
(:func:`stored_record_problems`). Checking changes no file.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Sequence

from atlas_fast.engine.seal import is_sealed, seal_problem
from atlas_fast.files import JsonFileError, file_blake2b, read_json

# The entries of a record's metrics that hold a dict (per class set) rather than a number: the zero-shot references
# and the calibration figures (atlas_fast.engine.calibration).
CALIBRATION = "calibration"
NESTED_METRICS = ("zero_shot", CALIBRATION)

# What evaluating a saved run reads from its record.
SAVED_RUN_FIELDS = ("config.backbone", "config.method", "config.method_config", "config.shots", "config.seed",
                    "backbone.fingerprint")


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def read_record(path: str | Path) -> dict[str, Any]:
    """Load a record JSON, with an error naming the file if it is not one."""
    path = Path(path)
    try:  # bounded in size and depth: one stray file is an error naming it, never a RecursionError
        record = read_json(path, parse_constant=_refuse_constant)
    except JsonFileError as exc:
        raise ValueError(f"{path} is not a readable atlas_fast result record (it {exc.reason}).") from exc
    if not isinstance(record, dict) or "config" not in record:
        raise ValueError(f"{path} is not an atlas_fast result record (no 'config' field).")
    return record


def non_finite(metrics: Any, prefix: str = "") -> list[str]:
    """Names of the values in a (nested) metrics dict that are not finite numbers."""
    bad = []
    for name, value in metrics.items():
        if isinstance(value, dict):
            bad += non_finite(value, f"{prefix}{name}.")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            bad.append(f"{prefix}{name}={value!r}")
    return bad


def missing_fields(record: dict[str, Any], fields: Sequence[str]) -> list[str]:
    """The dotted ``fields`` (``"config.method"``) that ``record`` lacks."""
    missing = []
    for dotted in fields:
        value: Any = record
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            missing.append(dotted)
    return missing


def _config_types(config: Any) -> list[str]:
    """Config fields present with a type the grouping and sorting of runs cannot use (a foreign record may hold
    anything)."""
    if not isinstance(config, dict):
        return ["config is not an object"]
    problems = [f"config.{name} is {config[name]!r}, not a whole number" for name in ("seed", "shots")
                if name in config and (isinstance(config[name], bool) or not isinstance(config[name], int))]
    problems += [f"config.{name} is not text" for name in ("dataset", "method", "setting")
                 if name in config and not isinstance(config[name], str)]
    schedule = config.get("schedule")
    if schedule is not None and (not isinstance(schedule, dict) or not isinstance(schedule.get("name"), str)):
        problems.append("config.schedule.name is not text")
    soft = config.get("soft_labels")
    if soft is not None and not isinstance(soft, dict):
        problems.append("config.soft_labels is not an object")
    return problems


def record_problems(record: dict[str, Any], needs: Sequence[str] = ()) -> list[str]:
    """What is wrong with a finished record (empty = valid), the seal's problem first; ``needs``: dotted fields a
    reader needs beyond those every record holds (the report's grouping keys)."""
    problems = []
    if record.get("status") != "finished":
        problems.append(f"status is {record.get('status')!r}, not 'finished'")
    if not isinstance(record.get("key"), str):
        problems.append("no 'key'")
    metrics = record.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        problems.append("no 'metrics'")
    elif non_finite(metrics):
        problems.append(f"non-finite metrics {non_finite(metrics)[:3]}")
    elif not isinstance(metrics.get("zero_shot"), dict):
        problems.append("no 'metrics.zero_shot' references")
    elif any(isinstance(value, dict) for name, value in metrics.items() if name not in NESTED_METRICS):
        problems.append("a metric that is not a number")
    elif not all(isinstance(value, dict) for value in (metrics.get(CALIBRATION) or {}).values()):
        problems.append("a calibration entry that is not a class set's figures")
    data = record.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("fingerprint"), str):
        problems.append("no data fingerprint (made before records knew their data)")
    problems += [f"no '{field}'" for field in missing_fields(record, (*SAVED_RUN_FIELDS, *needs))]
    problems += _config_types(record.get("config"))
    sealing = seal_problem(record)
    if sealing:
        problems.insert(0, sealing)
    return problems


def is_record_file(path: str | Path) -> bool:
    """Whether ``path`` holds a valid record (its learned tensors are not read)."""
    try:
        return not record_problems(read_record(path))
    except ValueError:
        return False


def stored_record_problems(path: Path, key: str | None = None) -> tuple[dict[str, Any] | None, list[str], bool]:
    """``(record, problems, learned_damaged)`` of the record file ``path`` as a run's lookup sees it: the record's
    problems (:func:`record_problems`), a ``key`` other than the run's, and learned tensors beside it that fail the
    record's checksum (``learned_damaged``). The record is None when it cannot be read."""
    try:
        record = read_record(path)
    except ValueError as exc:
        return None, [str(exc)], False
    problems = record_problems(record)
    if key is not None and record.get("key") != key:
        problems.append(f"its key {str(record.get('key'))[:12]}... is not the run's {key[:12]}...")
    learned = path.with_suffix(".pt")
    damaged = bool(not problems and learned.is_file() and "learned_blake2b" in record
                   and file_blake2b(learned) != record["learned_blake2b"])  # OSError: names the file
    if damaged:
        problems.append(f"its learned tensors {learned} fail their checksum (the file is damaged or was replaced)")
    if not problems:
        problems += predictions_problems(path, record)
    return record, problems, damaged


def predictions_problems(path: Path, record: dict[str, Any]) -> list[str]:
    """What is wrong with the per-image predictions a record names (empty when it names none, or they match their
    checksum ``predictions_blake2b``, which the record's seal covers)."""
    name = record.get("predictions")
    if name is None:
        return []
    if not isinstance(name, str) or "/" in name or "\\" in name:
        return [f"its 'predictions' field {name!r} is not a file name beside it"]
    predictions = path.with_name(name)
    if not predictions.is_file():
        return [f"its predictions {predictions} are missing"]
    if file_blake2b(predictions) != record.get("predictions_blake2b"):
        return [f"its predictions {predictions} fail their checksum (the file is damaged or was replaced)"]
    return []


def warn_unsealed(path: str | Path) -> None:
    """The warning for a record written before records were sealed: its numbers are used unverified."""
    print(f"warning: result record {path} has no seal (written before atlas_fast sealed records); its numbers are "
          f"used unverified.", file=sys.stderr)


def check_seal(record: dict[str, Any], path: str | Path) -> None:
    """Refuse a record whose seal does not match (naming the file); warn about one from before seals."""
    problem = seal_problem(record)
    if problem:
        raise ValueError(f"Result record {path}: {problem}; train the run again (or restore the file).")
    if not is_sealed(record):
        warn_unsealed(path)
