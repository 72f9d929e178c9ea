"""A class-agnostic dictionary of class names (KDPL-CA's teacher scores it), read without importing torch: the
command line checks the file as it parses ``--method-option agnostic_classnames=FILE``, the method reads it again
when the run is planned, with the same words for every fault."""

from __future__ import annotations

import csv
from pathlib import Path


def read_classnames(path: str | Path) -> tuple[str, ...]:
    """Class names from a file: one per line, or the first column of a CSV whose header is ``ClassName`` (the
    reference's dictionary); blank lines are skipped. An unreadable or empty file is an error naming it."""
    path = Path(path).expanduser()
    option = "; give a UTF-8 file of class names with --method-option agnostic_classnames=FILE"
    if path.is_dir():
        raise ValueError(f"KDPL's class-agnostic dictionary {path} is a folder, not a file{option}")
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = [row[0].strip() for row in csv.reader(handle) if row and row[0].strip()]
    except OSError as exc:
        raise ValueError(f"KDPL's class-agnostic dictionary {path} cannot be read ({exc.strerror}){option}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"KDPL's class-agnostic dictionary {path} is not UTF-8 text (byte "
                         f"{exc.object[exc.start:exc.start + 1]!r} at offset {exc.start}){option}") from None
    if rows and rows[0] == "ClassName":
        rows = rows[1:]
    if not rows:
        raise ValueError(f"KDPL's class-agnostic dictionary {path} holds no class names")
    return tuple(dict.fromkeys(rows))
