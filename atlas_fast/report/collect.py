"""``atlas-fast report RESULTS_DIR``: every finished run under a results folder as paper tables and plots
(docs/experiments.md, section Reports, describes the outputs).

:func:`report_folder` reads the records back (:mod:`~atlas_fast.report.results_folder`: damaged or unfinished ones
are skipped with a warning naming the file; nothing is moved or changed), gives each its table and row
(:mod:`~atlas_fast.report.grouping`) and writes one table per setting (per shot count for few-shot). Each cell is
the mean over seeds ± the *population* standard deviation (``statistics.pstdev``, as CoOp's ``parse_test_res``); an
"Average" section averages the per-dataset means (± the mean of the per-dataset stds) of the variants every dataset
has; H is the harmonic mean of the *mean* base and new accuracies (:func:`atlas_fast.report.rows.aggregate`).
This module imports neither torch nor the engine until a report is made, so the command line stays quick.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from atlas_fast.report.results_folder import SOURCES_FILE, collect_records, failure_notes
from atlas_fast.vocabulary import CLASS_SETS, METRICS, SETTINGS

FORMATS = ("md", "tex", "csv", "png", "pdf")
# Each setting's table title (a setting without one is titled by its name).
SETTING_TITLES = {"base2new": "Base-to-new generalisation", "few_shot": "Few-shot classification",
                  "cross_dataset": "Cross-dataset transfer, source dataset"}



def _dataset_order(names: Sequence[str]) -> list[str]:
    from atlas_fast.data.datasets import ELEVEN

    paper = [d for d in ELEVEN if d in names]
    return paper + sorted(set(names) - set(paper))


def _table_rows(records: Sequence[dict[str, Any]], metrics: Sequence[str] | None) -> tuple[list, list[str], str]:
    """The rows of one table (a section per dataset, then the Average section when there are several), its columns
    and a note on variants left out of the average. Rows are named without their marks and carry them as
    ``deviations``, so the outputs mark what every row changes once, in the caption."""
    from atlas_fast.report.rows import AVERAGE, aggregate, is_calibration_column

    setting = records[0]["config"]["setting"]
    wanted = list(metrics) if metrics else (["base", "new", "H"] if setting == "base2new" else ["all"])
    has = [m for m in CLASS_SETS if all(m in r["metrics"] for r in records)]
    # a calibration column ("ECE new") is shown for the records that hold it, "–" for the others
    columns = [m for m in wanted if m in has or (m == "H" and {"base", "new"} <= set(has))
               or (is_calibration_column(m) and m.rpartition(" ")[2] in has)]
    needed = [m for m in columns if m != "H"] + [m for m in ("base", "new") if "H" in columns and m not in columns]
    if not columns:
        return [], [], f"none of the metrics {', '.join(wanted)} is in every record of this table"
    named = {r["name"]: (r["row_name"], r["marks"]) for r in records}

    def rows_of(subset: Sequence[dict[str, Any]], section: str) -> list:
        # rows are made per name (with its marks), then named alone, their marks kept for the outputs
        rows = aggregate(subset, needed, name_of=lambda c: c["_name"], by_method=True, deviations=False)
        for row in rows:
            row.name, row.deviations = named[row.name]
            row.section = section
            row.metrics = {m: row.metrics[m] for m in columns}
            row.spread = {m: v for m, v in row.spread.items() if m in columns}
        return rows

    tagged = [{**r, "config": {**r["config"], "_name": r["name"]}} for r in records]
    datasets = _dataset_order(list(dict.fromkeys(r["config"]["dataset"] for r in tagged)))
    rows, note = [], ""
    for dataset in datasets:
        rows += rows_of([r for r in tagged if r["config"]["dataset"] == dataset], dataset)
    if len(datasets) > 1:
        present = defaultdict(set)
        for r in tagged:
            present[(r["config"]["method"], r["name"])].add(r["config"]["dataset"])
        complete = [r for r in tagged if present[(r["config"]["method"], r["name"])] == set(datasets)]
        left_out = sorted({name for (_, name), ds in present.items() if ds != set(datasets)})
        if complete:
            rows += rows_of(complete, AVERAGE)  # last, as in the paper's tables
        if left_out:
            note = f"Not in the Average (not run on every dataset): {', '.join(left_out)}."
    return rows, columns, note


def _table_name(setting: str, shots: int, shot_counts: int) -> str:
    return f"{setting}_{shots}shot" if setting == "few_shot" or shot_counts > 1 else setting


def report_folder(results_dir: str | Path, out: str | Path | None = None, datasets: Sequence[str] | None = None,
                  methods: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
                  formats: Sequence[str] | None = None, paths: Sequence[str | Path] | None = None) -> str:
    """Tables and plots of every finished record under ``results_dir`` (see the module docstring), written to
    ``out`` (default ``<results_dir>/report/``) as ``report.md``, ``report.tex``, ``report.csv`` and
    ``<table>.png``/``.pdf`` (``formats``: any of md, tex, csv, png, pdf; default all); returns the Markdown.
    ``datasets``/``methods`` keep only those records; ``metrics`` replaces each table's columns (default: base, new,
    H for base-to-new, ``all`` otherwise). ``paths``: only these record files (relative to ``results_dir``).
    ``sources.json`` names every record a cell was computed from, with its seal (what
    :func:`~atlas_fast.report.verify.verify_report` checks). Raises ``ValueError`` when no finished record matches."""
    from atlas_fast.engine.deviations import table_marks
    from atlas_fast.report.figures import plot_rows, plot_series
    from atlas_fast.report.formats import (latex_label, latex_table, markdown_table, paired_csv_fields,
                                           write_csv_lines)
    from atlas_fast.report.grouping import name_records
    from atlas_fast.report.rows import AVERAGE, display_name, paired_differences
    from atlas_fast.report.stats import counted

    formats = list(FORMATS if formats is None else formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"Unknown report format(s) {unknown}; valid: {', '.join(FORMATS)}.")
    root = Path(results_dir)
    out = root / "report" if out is None else Path(out)
    left_out: list[tuple[Path, str]] = []
    records = collect_records(root, datasets, methods, paths, left_out)
    if not records:
        found = sorted(p.parent.name for p in root.glob("*/*.json")  # a report's own sources.json is no record
                       if not (p.name == SOURCES_FILE and (p.parent / "report.csv").is_file()))
        why = ""
        if left_out:  # every record there was left out: say which and why, not just "none"
            why = (f" {len(left_out)} record file(s) were left out: "
                   + "; ".join(f"{path}: {reason.rstrip('.')}" for path, reason in left_out[:10])
                   + (f"; and {len(left_out) - 10} more" if len(left_out) > 10 else "") + ".")
        raise ValueError(f"No finished result record under {root}"
                         f"{' matching the --datasets/--methods given' if datasets or methods else ''} "
                         f"(records are <results_dir>/<dataset>/*.json; dataset folders with records here: "
                         f"{', '.join(dict.fromkeys(found)) or 'none'}).{why}")
    records = name_records(records, left_out)
    tables: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        tables[record["table"]].append(record)
    order = {s: i for i, s in enumerate(SETTINGS)}
    keys = sorted(tables, key=lambda k: (order.get(k[0], 99), k[0], k[1]))
    shot_counts = {s: len({k[1] for k in keys if k[0] == s}) for s in {k[0] for k in keys}}

    used_datasets = sorted({r["config"]["dataset"] for r in records})
    used_methods = list(dict.fromkeys(r["config"]["method"] for r in records))
    markdown = [f"# Results under {root}", "",
                f"{counted(len(records), 'finished run')}: {counted(len(used_datasets), 'dataset')}, "
                f"method(s) {', '.join(used_methods)}."]
    latex: list[str] = []
    csv_lines: list[dict[str, Any]] = []
    plots: list[tuple[str, Any]] = []
    few_shot_curves: dict[str, dict[int, float]] = defaultdict(dict)
    for setting, shots in keys:
        rows, columns, note = _table_rows(tables[(setting, shots)], metrics)
        name = _table_name(setting, shots, shot_counts[setting])
        title = f"{SETTING_TITLES.get(setting, setting)}, {shots_text(shots, tables[(setting, shots)])}"
        markdown += ["", f"## {title}", "", markdown_table(rows) if rows else f"(no table: {note})"]
        if rows and note:
            markdown.append(note)
        if not rows:
            continue
        latex.append(latex_table(rows, caption=title, label=latex_label(name)))
        for row, paired in zip(rows, paired_differences(rows)):
            line = {"setting": setting, "shots": shots, "dataset": row.section, "method": row.block,
                    "variant": row.name + table_marks([row.deviations])[0],  # a CSV line stands alone
                    "seeds": row.seeds, "datasets": len(row.datasets)}
            for metric in METRICS:
                line[metric] = f"{row.metrics[metric]:.4f}" if metric in row.metrics else ""
                line[f"{metric}_std"] = (f"{row.spread[metric]:.4f}" if metric in row.spread and metric != "H"
                                         else "")
            line.update(paired_csv_fields(paired, columns[-1]))  # the table's last column (H or all)
            csv_lines.append(line)
        sections = list(dict.fromkeys(row.section for row in rows))
        if len(sections) > 1 and AVERAGE not in sections:
            continue  # no variant ran on every dataset: no one set of rows sums the table up
        summary = AVERAGE if AVERAGE in sections else sections[0]
        if setting == "few_shot" and shot_counts[setting] > 1:
            for row in rows:
                if row.section == summary:
                    few_shot_curves[display_name(row)][shots] = row.metrics[columns[0]]
        else:  # the summary (the Average, or the one dataset), then each dataset of several
            mark = table_marks([row.deviations for row in rows])[0]  # the plot carries what the table changes
            plots += [(name if section == summary else f"{name}_{section}", [r for r in rows if r.section == section],
                       f"{title}{mark}" + ("" if section == summary else f": {section}"))
                      for section in [summary] + [s for s in sections if s != summary and len(sections) > 1]]

    if left_out:  # a row that lost a record must not vanish silently
        markdown += ["", f"Left out of the tables ({len(left_out)} record file(s); `atlas-fast report --verify` fails "
                         f"while a damaged one is in the folder):", ""]
        markdown += [f"- {path}: {why}" for path, why in left_out]
    failed = failure_notes(root, datasets)
    if failed:  # runs that failed on their own have no record: said, so a missing seed is not a mystery
        markdown += ["", f"Runs that failed and have no record ({len(failed)}; the command that trained them trains "
                         f"only these again):", ""]
        markdown += [f"- {path}: {reason}" for path, reason in failed]
    text = "\n".join(markdown)
    with _Staged(out) as stage:  # every file written beside the report first, renamed into place when all are
        if "md" in formats:
            stage.write("report.md", lambda path: path.write_text(text + "\n"))
        if "tex" in formats:
            stage.write("report.tex", lambda path: path.write_text("\n\n".join(latex) + "\n"))
        if "csv" in formats:
            stage.write("report.csv", lambda path: write_csv_lines(path, csv_lines, ["setting"]))
        images = [f for f in formats if f in ("png", "pdf")]
        if images:
            for name, rows, plot_title in plots:
                stage.write([f"{name}.{fmt}" for fmt in images],
                            lambda path, rows=rows, plot_title=plot_title: plot_rows(rows, path, plot_title,
                                                                                     formats=images))
            all_shots = sorted({s for curve in few_shot_curves.values() for s in curve})
            curves = {name: [curve[s] for s in all_shots] for name, curve in few_shot_curves.items()
                      if set(curve) == set(all_shots)}
            if curves:
                stage.write([f"few_shot.{fmt}" for fmt in images],
                            lambda path: plot_series(all_shots, curves, path, xlabel="shots per class",
                                                     ylabel="accuracy (%)", formats=images, log_x=True))
        if "csv" in formats:  # what `report --verify` checks the CSV's cells against
            stage.write(SOURCES_FILE, lambda path: _write_sources(root, path, records, metrics, left_out, datasets,
                                                                  methods))
    for path in stage.written:
        print(f"written: {path}", file=sys.stderr)
    return text


def shots_text(shots: int, records: Sequence[dict[str, Any]]) -> str:
    """``16 shots``, or what the runs trained on where a class held fewer images than asked (the records'
    ``data.shots_used``): ``4 shots per class (16 asked; no class held more)``, ``2 to 4 shots per class (16
    asked)``. A heading then says the shots the table's runs had, not the number on their command line."""
    used = [r["data"]["shots_used"] for r in records
            if isinstance((r.get("data") or {}).get("shots_used"), dict)]
    try:
        low, high = min(int(u["min"]) for u in used), max(int(u["max"]) for u in used)
    except (KeyError, TypeError, ValueError):  # older records: the asked shots are all there is
        return f"{shots} shots"
    if low >= shots:
        return f"{shots} shots"
    counted = f"{low} shots" if low == high else f"{low} to {high} shots"
    return f"{counted} per class ({shots} asked; {'no class held more' if high < shots else 'some classes held fewer'})"


class _Staged:
    """A report written whole or not at all: files are written into a staging folder beside ``out`` and renamed over
    their places once all are written, so a failure leaves the previous report as it was and names the file."""

    def __init__(self, out: Path) -> None:
        self.out, self.written = out, []  # type: ignore[var-annotated]
        self.folder = out / f".staging-{os.getpid()}"
        self.names: list[str] = []

    def __enter__(self) -> "_Staged":
        from atlas_fast.files import make_folder

        try:
            make_folder(self.out)
            self.folder.mkdir(exist_ok=True)
        except OSError as exc:
            raise _named(exc, self.out, "the report folder cannot be written") from None
        return self

    def write(self, names: str | list[str], write: Any) -> None:
        """Write ``names`` (the first is the path ``write(path)`` is given; a plot writes its other formats beside
        it) into the staging folder."""
        names = [names] if isinstance(names, str) else names
        try:
            write(self.folder / names[0])
        except OSError as exc:
            raise _named(exc, self.out / names[0], f"the report in {self.out} is unchanged") from None
        self.names += names

    def __exit__(self, kind, exc, traceback) -> None:
        try:
            if kind is None:
                for name in self.names:
                    os.replace(self.folder / name, self.out / name)
                    self.written.append(self.out / name)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def _named(exc: OSError, path: Path, consequence: str) -> OSError:
    """``exc`` as an error of its type that names ``path`` and says what it left (an OSError raised by a write to
    an open file names no file)."""
    reason = exc.strerror or str(exc)
    return type(exc)(exc.errno, f"{reason}: cannot write {path} ({consequence})") if exc.errno is not None \
        else type(exc)(f"{reason}: cannot write {path} ({consequence})")


def _write_sources(root: Path, out: Path, records: Sequence[dict[str, Any]], metrics: Sequence[str] | None,
                   left_out: Sequence[tuple[Path, str]] = (), datasets: Sequence[str] | None = None,
                   methods: Sequence[str] | None = None) -> Path:
    """``<out>/sources.json``: the records the report's cells come from (paths relative to the results folder, with
    their seals), the record files it left out and why, and the ``--metrics``, ``--datasets`` and ``--methods`` it
    was made with, so :mod:`~atlas_fast.report.verify` can make the same tables again and tell a record added since."""
    from atlas_fast.engine.seal import SEAL_FIELD

    sources = {"results_dir": str(root), "metrics": list(metrics) if metrics else None,
               "datasets": list(datasets) if datasets else None, "methods": list(methods) if methods else None,
               "records": [{"path": Path(r["path"]).relative_to(root).as_posix(), "seal": r.get(SEAL_FIELD)}
                           for r in sorted(records, key=lambda r: r["path"])],
               "left_out": [{"path": path.relative_to(root).as_posix(), "why": why} for path, why in left_out]}
    path = out if out.name == SOURCES_FILE else out / SOURCES_FILE
    path.write_text(json.dumps(sources, indent=1) + "\n")
    return path
