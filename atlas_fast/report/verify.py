"""``atlas-fast report --verify``: a written report checked against the folder it was made from: every record it
names there and sealed as it was, every cell of ``report.csv`` made again from exactly those records, and no record
in the folder damaged, unsealed or written since."""

from __future__ import annotations

import contextlib
import csv
import io
import tempfile
from pathlib import Path
from typing import Collection, Sequence

from atlas_fast.report.results_folder import SOURCES_FILE, matches, read_valid


def folder_problems(root: Path, skip: Path | None = None, checked: Collection[Path] = ()) -> list[str]:
    """Every record file under ``root`` (``<dataset>/*.json``; not those in ``skip``, the report's own folder, nor
    the files ``checked`` already) that cannot be read, is not a finished valid record, fails its seal or has none,
    each named: what makes a folder unverifiable whatever its report says."""
    from atlas_fast.engine.seal import is_sealed

    problems = []
    for path in sorted(root.glob("*/*.json")):
        if path in checked or (skip is not None and path.parent.resolve() == skip.resolve()):
            continue
        record, why = read_valid(path)
        if record is None:
            problems.append(f"{path}: {why.rstrip('.')} (in the folder; the report left it out)")
        elif not is_sealed(record):
            problems.append(f"{path} has no seal (written before atlas_fast sealed records): its numbers cannot be "
                            f"verified")
    return problems


def _unlisted(root: Path, out: Path, seen: Collection[Path], datasets: Sequence[str] | None,
              methods: Sequence[str] | None) -> list[str]:
    """Every valid record file under ``root`` (a symbolic link too, named with its target) of the report's datasets
    and methods that the report neither used nor left out: written after it. A damaged one is named by
    :func:`folder_problems`."""
    problems = []
    for path in sorted(root.glob("*/*.json")):
        if path in seen or path.parent.resolve() == out.resolve() or not matches(path.parent.name, datasets):
            continue
        record, _ = read_valid(path)
        if record is None or not matches(record["config"]["method"], methods):
            continue
        link = f" (a symbolic link to {path.readlink()})" if path.is_symlink() else ""
        problems.append(f"{path}{link} is not in the report (written after it?): run atlas-fast report {root} again")
    return problems


def verify_report(results_dir: str | Path, out: str | Path | None = None) -> list[str]:
    """Check a written report and the folder it was made from: every record named in ``<out>/sources.json``
    (default ``<results_dir>/report``) must be there, sealed, with a seal that matches its content and the one the
    report used; every cell of ``report.csv`` must come out the same when computed again from those records; and
    every other record file in the folder must be sealed and valid (:func:`folder_problems`) and one the report used
    or left out (not one written since). Returns the problems found (empty: verified), each naming the file, row or
    cell."""
    from atlas_fast.engine.validity import predictions_problems, read_record
    from atlas_fast.engine.seal import SEAL_FIELD, is_sealed, seal_problem
    from atlas_fast.files import JsonFileError, read_json
    from atlas_fast.report.collect import report_folder

    root = Path(results_dir)
    out = root / "report" if out is None else Path(out)
    sources_path, table_path = out / SOURCES_FILE, out / "report.csv"
    for needed in (sources_path, table_path):
        if not needed.is_file():
            raise FileNotFoundError(f"{needed} is missing: write the report first (atlas-fast report {root}, with "
                                    f"the csv format) and verify it then.")
    try:
        sources = read_json(sources_path)
        listed = [(str(item["path"]), item.get("seal")) for item in sources["records"]]
        metrics = sources.get("metrics")
        known = {root / str(item["path"]) for item in sources.get("left_out", [])}
    except JsonFileError as exc:
        raise ValueError(f"{sources_path} is not a report's list of sources: it {exc.reason}.") from exc
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{sources_path} is not a report's list of sources ({type(exc).__name__}: {exc}).") from exc
    problems = []
    for relative, seal in listed:
        path = root / relative
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            problems.append(f"{sources_path} names {relative!r}, which is not inside {root}")
            continue
        try:
            record = read_record(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if not is_sealed(record):
            problems.append(f"{path} has no seal (written before atlas_fast sealed records): its numbers cannot be "
                            f"verified")
        elif seal_problem(record):
            problems.append(f"{path}: {seal_problem(record)}")
        elif record[SEAL_FIELD] != seal:
            problems.append(f"{path} is not the record the report was made from (its seal differs from the one "
                            f"in {sources_path})")
        else:  # the per-image predictions it names: their checksum is under its seal
            problems += [f"{path}: {problem}" for problem in predictions_problems(path, record)]
    listed_paths = {root / relative for relative, _ in listed}
    problems += folder_problems(root, skip=out, checked=listed_paths)
    if "left_out" in sources:  # written by a report that lists what it left out: a record file it never saw is new
        problems += _unlisted(root, out, listed_paths | known, sources.get("datasets"), sources.get("methods"))
    with open(table_path, newline="", encoding="utf-8") as f:
        stored = list(csv.DictReader(f))
    with tempfile.TemporaryDirectory() as scratch:
        with contextlib.redirect_stderr(io.StringIO()):  # its warnings are the problems listed above
            try:
                report_folder(root, out=scratch, metrics=metrics, formats=["csv"],
                              paths=[relative for relative, _ in listed])
            except ValueError as exc:
                return problems + [f"the tables cannot be made again from the listed records ({exc})"]
        with open(Path(scratch) / "report.csv", newline="", encoding="utf-8") as f:
            fresh = list(csv.DictReader(f))
    row_key = ("setting", "shots", "dataset", "method", "variant")
    fresh_rows = {tuple(row[k] for k in row_key): row for row in fresh}
    stored_keys = set()
    for line, row in enumerate(stored, start=2):
        key = tuple(row.get(k) for k in row_key)
        stored_keys.add(key)
        again = fresh_rows.get(key)
        if again is None:
            problems.append(f"{table_path}:{line}: row {' / '.join(map(str, key))} does not come out of the records")
            continue
        for column, value in row.items():
            if again.get(column) != value:
                problems.append(f"{table_path}:{line}: {' / '.join(map(str, key))} {column} is {value!r}, the "
                                f"records give {again.get(column)!r}")
    missing = [key for key in fresh_rows if key not in stored_keys]
    problems += [f"{table_path} lacks the row {' / '.join(map(str, key))} that the records give" for key in missing]
    return problems
