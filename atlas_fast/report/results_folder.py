"""A results folder's records as the report reads them: which files are records
(``<results_dir>/<dataset>/<stem>.json``), which are finished, valid and sealed, which are left out and why, and the
failure notes of runs that have no record. Nothing here moves or changes a file, and nothing imports torch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

SOURCES_FILE = "sources.json"  # beside a report's tables: the records its cells come from, and those left out
# What the report reads of a record beyond what every valid record holds (atlas_fast.engine.validity).
_REQUIRED = ("config.dataset", "config.method", "config.setting", "config.shots", "config.seed",
             "config.schedule.name")


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def matches(value: str, wanted: Sequence[str] | None) -> bool:
    return wanted is None or value.lower() in {w.lower() for w in wanted}


def read_valid(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the record of ``path``, "") when it is a finished, valid record the report can use, else (None, why not)."""
    from atlas_fast.engine.validity import read_record, record_problems

    try:
        record = read_record(path)
        problems = record_problems(record, needs=_REQUIRED)
    except ValueError as exc:
        return None, str(exc).removeprefix(f"{path} is ")
    if problems:
        return None, f"not a valid finished record ({'; '.join(problems[:3])})."
    return record, ""


def collect_records(results_dir: str | Path, datasets: Sequence[str] | None = None,
                    methods: Sequence[str] | None = None,
                    paths: Sequence[str | Path] | None = None,
                    left_out: list[tuple[Path, str]] | None = None) -> list[dict[str, Any]]:
    """Every finished, valid record under ``results_dir`` (``<dataset>/*.json``), in file-name order, optionally
    only those of ``datasets`` and ``methods`` (registry names such as ``coop``, ``dept-coop``; case-insensitive)
    or only the files ``paths`` (relative to ``results_dir``, as a report's ``sources.json`` lists them). Each record
    gets ``path`` (its file). A file that cannot be read, is not finished, fails its seal, or lacks what the report
    needs is skipped with a warning naming it (``(path, why)`` appended to ``left_out`` when given); an unsealed one
    is used with a warning. A run with several records is listed once."""
    from atlas_fast.engine.run_identity import one_record_per_run
    from atlas_fast.engine.seal import is_sealed

    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"Results folder {root} does not exist (runs write <results_dir>/<dataset>/*.json).")
    records = []
    unsealed: list[Path] = []
    files = sorted(root.glob("*/*.json")) if paths is None else [root / p for p in paths]
    for path in files:
        if not matches(path.parent.name, datasets):  # the folder is named by the dataset
            continue
        if paths is None and path.name == SOURCES_FILE and (path.parent / "report.csv").is_file():
            continue  # a report written inside the results folder (its default place) is not a record
        record, why = read_valid(path)
        if record is None:
            warn(f"skipped {path}: {why}")
            if left_out is not None:
                left_out.append((path, why))
            continue
        if not is_sealed(record):
            unsealed.append(path)
        config = record["config"]
        if matches(config["dataset"], datasets) and matches(config["method"], methods):
            records.append({**record, "path": str(path)})
    if unsealed:
        others = f" and {len(unsealed) - 1} more" if len(unsealed) > 1 else ""
        warn(f"result record {unsealed[0]}{others} have no seal (written before atlas_fast sealed records); their "
              f"numbers are used unverified.")
    kept = one_record_per_run(records)
    if left_out is not None and len(kept) < len(records):  # another file of a run (a copy, a link): named too
        used = {record_identity_or_path(r): r["path"] for r in kept}
        for record in records:
            if not any(record is k for k in kept):
                left_out.append((Path(record["path"]), f"another record of the same run is used: "
                                                       f"{used.get(record_identity_or_path(record))}"))
    return kept


def record_identity_or_path(record: dict[str, Any]) -> str:
    """The run a record describes (:func:`atlas_fast.engine.run_identity.record_identity`), or its path."""
    from atlas_fast.engine.run_identity import record_identity

    try:
        return record_identity(record)
    except (KeyError, TypeError):
        return record["path"]


def failure_notes(root: Path, datasets: Sequence[str] | None) -> list[tuple[Path, str]]:
    """The failure notes (``<dataset>/<stem>.json.failed``, :func:`atlas_fast.engine.record.save_failure`) under
    ``root`` of ``datasets``, each with its printed name and reason (the note's path alone where it cannot be read)."""
    from atlas_fast.files import JsonFileError, read_json

    notes = []
    for path in sorted(root.glob("*/*.json.failed")):
        if not matches(path.parent.name, datasets):
            continue
        try:
            note = read_json(path)
            reason = f"{note.get('name', '?')}: {note.get('reason', '?')}"
        except (JsonFileError, AttributeError):
            reason = "a failure note that cannot be read"
        notes.append((path, reason))
    return notes
