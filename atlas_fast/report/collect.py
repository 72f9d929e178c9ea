"""``atlas-fast report RESULTS_DIR``: every finished run under a results folder as paper tables and plots.

Runs write one record per run to ``<results_dir>/<dataset>/<stem>.json`` (:mod:`atlas_fast.engine.record`), whichever
command trained them (``train``, ``demo``, ``experiment``, the Python API). :func:`collect_records` reads them back
(damaged or unfinished ones are skipped with a warning naming the file; nothing is moved or changed) and
:func:`report_folder` turns them into one table per setting (per shot count for few-shot):

- rows are grouped by dataset, then method (a block of rows each, compared with its first row, the plain method),
  then label variant (``CoOp``, ``+ ATLaS``, ``+ ATLaS-CSL``...: :func:`atlas_fast.report.rows.variant_label`);
  records of one variant whose configurations differ otherwise (a sensitivity sweep's α, an ``--epochs``
  override, another backbone) become separate rows named by what differs, e.g. ``+ ATLaS-ISL (α=0.3)``, so
  they are never averaged together; a block without a plain-method row names the method in each row
  (``KgCoOp + ATLaS-ISL``), and whatever else a row's runs change from the method's recipe or the paper's presets
  follows in brackets (``[epochs=2, θ=0.3]``, :func:`atlas_fast.engine.deviations.run_deviations`);
- each cell is the mean over seeds ± the *population* standard deviation over seeds (``statistics.pstdev``, as
  CoOp's ``parse_test_res``); an "Average" section (several datasets; last) averages the per-dataset means (± the mean of
  the per-dataset stds) of the variants every dataset has;
- base-to-new shows base, new and H, where H is the harmonic mean of the *mean* base and new accuracies (the
  papers' convention, :func:`atlas_fast.report.rows.aggregate`); few-shot and cross-dataset show the accuracy on
  their class set (``all``; cross-dataset records hold the source dataset; the targets are evaluated by
  ``atlas-fast experiment table_cross_dataset``).

Outputs in ``out`` (default ``<results_dir>/report/``): ``report.md``, ``report.tex`` (booktabs, one labelled table
each, pure ASCII; :func:`atlas_fast.report.formats.latex_table`), ``report.csv`` (one line per row, every metric's
mean and std, the last metric's mean paired difference to the block's first row with its 95 % interval), per table a
plot ``<table>.png`` / ``<table>.pdf`` (bars of the Average or single-dataset rows; few-shot over several shot counts:
accuracy against shots) and, with several datasets, ``<table>_<dataset>.png`` / ``.pdf`` per dataset, and
``sources.json``. What every row of a table changes from the recipes and presets is said once, in its notes and
caption, not on each row; the records left out are listed under the tables. This module imports neither torch nor
the engine until a report is made, so the command line stays quick.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Collection, Sequence

from atlas_fast.vocabulary import CLASS_SETS, METRICS, SETTINGS

FORMATS = ("md", "tex", "csv", "png", "pdf")
# Each setting's table title (a setting without one is titled by its name).
SETTING_TITLES = {"base2new": "Base-to-new generalisation", "few_shot": "Few-shot classification",
                  "cross_dataset": "Cross-dataset transfer, source dataset"}
# Config fields that never make two records different variants: the grouping keys themselves, where the run ran
# whether it was also evaluated after every epoch (which changes no final number) and on which class sets (legacy
# records name them; a run is one run whatever was evaluated).
_NOT_A_VARIANT = ("seed", "dataset", "setting", "shots", "method", "device", "eval_every_epoch", "evaluate")
SOURCES_FILE = "sources.json"  # beside a report's tables: the records its cells come from, and those left out
# What the report reads of a record beyond what every valid record holds (atlas_fast.engine.validity).
_REQUIRED = ("config.dataset", "config.method", "config.setting", "config.shots", "config.seed",
             "config.schedule.name")


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _matches(value: str, wanted: Sequence[str] | None) -> bool:
    return wanted is None or value.lower() in {w.lower() for w in wanted}


def _read_valid(path: Path) -> tuple[dict[str, Any] | None, str]:
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
    needs is skipped with a warning on stderr naming it (it is left where it is, and ``(path, why)`` is appended to
    ``left_out`` when given); one from before seals is used with a warning. A run with several records is listed
    once (:func:`atlas_fast.engine.run_identity.one_record_per_run`)."""
    from atlas_fast.engine.run_identity import one_record_per_run
    from atlas_fast.engine.seal import is_sealed

    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"Results folder {root} does not exist (runs write <results_dir>/<dataset>/*.json).")
    records = []
    unsealed: list[Path] = []
    files = sorted(root.glob("*/*.json")) if paths is None else [root / p for p in paths]
    for path in files:
        if not _matches(path.parent.name, datasets):  # the folder is named by the dataset
            continue
        if paths is None and path.name == SOURCES_FILE and (path.parent / "report.csv").is_file():
            continue  # a report written inside the results folder (its default place) is not a record
        record, why = _read_valid(path)
        if record is None:
            _warn(f"skipped {path}: {why}")
            if left_out is not None:
                left_out.append((path, why))
            continue
        if not is_sealed(record):
            unsealed.append(path)
        config = record["config"]
        if _matches(config["dataset"], datasets) and _matches(config["method"], methods):
            records.append({**record, "path": str(path)})
    if unsealed:
        others = f" and {len(unsealed) - 1} more" if len(unsealed) > 1 else ""
        _warn(f"result record {unsealed[0]}{others} have no seal (written before atlas_fast sealed records); their "
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


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"soft_labels.alpha": 0.1, ...}`` (lists as JSON text)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): json.dumps(value) if isinstance(value, list) else value}


def _signature(config: dict[str, Any]) -> dict[str, Any]:
    """The record's variant fields, with the defaults a record does not store filled in (a row of the default few-shot
    order reads ``fewshot_order=coop`` beside a CLIP-LoRA-order row, not ``None``)."""
    from atlas_fast.engine.deviations import UNSTORED_DEFAULTS

    flat = {**UNSTORED_DEFAULTS, **_flat(config)}
    return {k: v for k, v in flat.items() if k.split(".")[0] not in _NOT_A_VARIANT}


def _base_label(config: dict[str, Any]) -> str:
    from atlas_fast.report.rows import method_name, variant_label

    try:
        return variant_label(config)
    except (KeyError, TypeError, AttributeError):  # a schedule or soft-label kind this version does not name
        return f"{method_name(config['method'])} ({config['schedule'].get('name')})"


def _short_names(keys: Sequence[str]) -> dict[str, str]:
    """``soft_labels.alpha`` -> ``α``, ``recipe.epochs`` -> ``epochs`` (as the deviation marks print them,
    :data:`atlas_fast.engine.deviations.PRINTED_NAMES`); other keys by their last part unless two end alike (then
    the full dotted name)."""
    from atlas_fast.engine.deviations import PRINTED_NAMES

    ends = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: PRINTED_NAMES.get(k, e if ends.count(e) == 1 else k) for k, e in zip(keys, ends)}


def _value_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _sortable(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, str(value))


def label_records(records: Sequence[dict[str, Any]], left_out: list[tuple[Path, str]] | None = None
                  ) -> list[dict[str, Any]]:
    """Records with ``label`` (the row: its name and the marks of what its runs change), ``row_name`` (the name
    alone), ``marks`` (those changes, :func:`atlas_fast.engine.deviations.run_deviations` less what the name says)
    and ``table`` (``(setting, shots)``), in table order: method blocks (zero-shot CLIP first, then the registry's
    order), the plain method first in its block, then the ATLaS variants; one record per seed and row (of two, the
    newer one is kept, with a warning naming both files, and the older one appended to ``left_out`` when given)."""
    from atlas_fast.atlas.variants import row_order
    from atlas_fast.engine.deviations import UNSTORED_DEFAULTS, deviation_note, run_deviations
    from atlas_fast.methods import METHODS
    from atlas_fast.report.rows import method_name

    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    with_plain = set()  # (table, method) blocks that have a plain-method row to name the block
    for record in records:
        c = record["config"]
        groups[((c["setting"], c["shots"]), c["method"], _base_label(c))].append(record)
        if c["schedule"]["name"] == "onehot":
            with_plain.add(((c["setting"], c["shots"]), c["method"]))
    labelled = []
    for (table, method, base), members in groups.items():
        if (table, method) not in with_plain and base.startswith("+"):
            base = f"{method_name(method)} {base}"  # no "CoOp" row above it says whose "+ ATLaS" this is
        per_dataset: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in members:
            per_dataset[record["config"]["dataset"]].append(_signature(record["config"]))
        varying = sorted({k for sigs in per_dataset.values() for k in set().union(*sigs)
                          if len({json.dumps(s.get(k), sort_keys=True) for s in sigs}) > 1})
        names = _short_names(varying)
        for record in members:
            signature = _signature(record["config"])
            values = [signature.get(k) for k in varying]
            suffix = ", ".join(f"{names[k]}={_value_text(v)}" for k, v in zip(varying, values))
            name = f"{base} ({suffix})" if suffix else base
            marks = tuple((k, t) for k, t in run_deviations(record["config"]).items() if k not in varying)
            ranks = [(-1, "") if UNSTORED_DEFAULTS.get(k, ...) == v else _sortable(v) for k, v in zip(varying, values)]
            labelled.append({**record, "table": table, "label": name + deviation_note(record["config"], varying),
                             "row_name": name, "marks": marks, "_values": ranks})  # a default's row first

    registry = ["zsclip"] + [m for m in METHODS if m != "zsclip"]

    def order(record: dict[str, Any]) -> tuple:
        c = record["config"]
        schedule, soft = c["schedule"], (c.get("soft_labels") or {}).get("kind")
        return (record["table"][0], record["table"][1],
                registry.index(c["method"]) if c["method"] in registry else len(registry), c["method"],
                *row_order(schedule, soft), _sortable(schedule.get("period", 0)),
                record["_values"], record["label"], c["dataset"], c["seed"])

    kept: dict[tuple, dict[str, Any]] = {}
    for record in sorted(labelled, key=order):
        c = record["config"]
        key = (record["table"], c["dataset"], c["method"], record["label"], c["seed"])
        if key in kept:
            older, newer = sorted([kept[key], record], key=lambda r: str(r.get("created", "")))
            _warn(f"two records of {c['dataset']} {record['label']} seed {c['seed']} (trained on other data or "
                  f"by another atlas_fast version?): using {newer['path']}, ignoring {older['path']}.")
            if left_out is not None:
                left_out.append((Path(older["path"]), f"an older record of the same row and seed as {newer['path']}"))
            kept[key] = newer
        else:
            kept[key] = record
    result = sorted(kept.values(), key=order)
    for record in result:
        record.pop("_values", None)
    return result


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
    named = {r["label"]: (r["row_name"], r["marks"]) for r in records}

    def rows_of(subset: Sequence[dict[str, Any]], section: str) -> list:
        # rows are made per label (name and marks), then named alone, their marks kept for the outputs
        rows = aggregate(subset, needed, label=lambda c: c["_label"], by_method=True, deviations=False)
        for row in rows:
            row.label, row.deviations = named[row.label]
            row.section = section
            row.metrics = {m: row.metrics[m] for m in columns}
            row.spread = {m: v for m, v in row.spread.items() if m in columns}
        return rows

    tagged = [{**r, "config": {**r["config"], "_label": r["label"]}} for r in records]
    datasets = _dataset_order(list(dict.fromkeys(r["config"]["dataset"] for r in tagged)))
    rows, note = [], ""
    for dataset in datasets:
        rows += rows_of([r for r in tagged if r["config"]["dataset"] == dataset], dataset)
    if len(datasets) > 1:
        present = defaultdict(set)
        for r in tagged:
            present[(r["config"]["method"], r["label"])].add(r["config"]["dataset"])
        complete = [r for r in tagged if present[(r["config"]["method"], r["label"])] == set(datasets)]
        left_out = sorted({label for (_, label), ds in present.items() if ds != set(datasets)})
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
    H for base-to-new, ``all`` otherwise). Cells are mean ± population std over seeds; H is that of the mean base and
    new accuracies. ``paths``: only these record files (relative to ``results_dir``). Beside the tables,
    ``sources.json`` names every record a cell was computed from, with its seal (what :func:`verify_report`
    checks). Raises ``ValueError`` when no finished record matches."""
    from atlas_fast.engine.deviations import table_marks
    from atlas_fast.report.figures import plot_rows, plot_series
    from atlas_fast.report.formats import latex_label, latex_table, markdown_table, paired_csv_fields
    from atlas_fast.report.rows import AVERAGE, display_label, paired_differences
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
    records = label_records(records, left_out)
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
                    "variant": row.label + table_marks([row.deviations])[0],  # a CSV line stands alone
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
                    few_shot_curves[display_label(row)][shots] = row.metrics[columns[0]]
        else:  # the summary (the Average, or the one dataset), then each dataset of several
            mark = table_marks([row.deviations for row in rows])[0]  # the plot carries what the table changes
            plots += [(name if section == summary else f"{name}_{section}", [r for r in rows if r.section == section],
                       f"{title}{mark}" + ("" if section == summary else f": {section}"))
                      for section in [summary] + [s for s in sections if s != summary and len(sections) > 1]]

    if left_out:  # a row that lost a record must not vanish silently
        markdown += ["", f"Left out of the tables ({len(left_out)} record file(s); `atlas-fast report --verify` fails "
                         f"while a damaged one is in the folder):", ""]
        markdown += [f"- {path}: {why}" for path, why in left_out]
    failed = _failure_notes(root, datasets)
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
            stage.write("report.csv", lambda path: _write_csv(path, csv_lines))
        images = [f for f in formats if f in ("png", "pdf")]
        if images:
            for name, rows, plot_title in plots:
                stage.write([f"{name}.{fmt}" for fmt in images],
                            lambda path, rows=rows, plot_title=plot_title: plot_rows(rows, path, plot_title,
                                                                                     formats=images))
            all_shots = sorted({s for curve in few_shot_curves.values() for s in curve})
            curves = {label: [curve[s] for s in all_shots] for label, curve in few_shot_curves.items()
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


def _failure_notes(root: Path, datasets: Sequence[str] | None) -> list[tuple[Path, str]]:
    """The failure notes (``<dataset>/<stem>.json.failed``, :func:`atlas_fast.engine.record.save_failure`) under
    ``root`` of ``datasets``, each with its printed name and reason (the note's path alone where it cannot be read)."""
    from atlas_fast.files import JsonFileError, read_json

    notes = []
    for path in sorted(root.glob("*/*.json.failed")):
        if not _matches(path.parent.name, datasets):
            continue
        try:
            note = read_json(path)
            reason = f"{note.get('name', '?')}: {note.get('reason', '?')}"
        except (JsonFileError, AttributeError):
            reason = "a failure note that cannot be read"
        notes.append((path, reason))
    return notes


def _write_csv(path: Path, lines: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]) if lines else ["setting"])
        writer.writeheader()
        writer.writerows(lines)


class _Staged:
    """A report written whole or not at all: each file is written into a staging folder beside ``out`` (same file
    system) and, once every one is written, renamed over its place, so a failure (a full disk, a file-size limit, a
    read-only folder) leaves the previous report as it was and names the file and folder; the staging folder goes
    either way."""

    def __init__(self, out: Path) -> None:
        import os

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
        import os
        import shutil

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
    was made with, so :func:`verify_report` can make the same tables again and tell a record added since."""
    from atlas_fast.engine.seal import SEAL_FIELD

    sources = {"results_dir": str(root), "metrics": list(metrics) if metrics else None,
               "datasets": list(datasets) if datasets else None, "methods": list(methods) if methods else None,
               "records": [{"path": Path(r["path"]).relative_to(root).as_posix(), "seal": r.get(SEAL_FIELD)}
                           for r in sorted(records, key=lambda r: r["path"])],
               "left_out": [{"path": path.relative_to(root).as_posix(), "why": why} for path, why in left_out]}
    path = out if out.name == SOURCES_FILE else out / SOURCES_FILE
    path.write_text(json.dumps(sources, indent=1) + "\n")
    return path


def folder_problems(root: Path, skip: Path | None = None, checked: Collection[Path] = ()) -> list[str]:
    """Every record file under ``root`` (``<dataset>/*.json``; not those in ``skip``, the report's own folder, nor
    the files ``checked`` already) that cannot be read, is not a finished valid record, fails its seal or has none,
    each named: what makes a folder unverifiable whatever its report says."""
    from atlas_fast.engine.seal import is_sealed

    problems = []
    for path in sorted(root.glob("*/*.json")):
        if path in checked or (skip is not None and path.parent.resolve() == skip.resolve()):
            continue
        record, why = _read_valid(path)
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
        if path in seen or path.parent.resolve() == out.resolve() or not _matches(path.parent.name, datasets):
            continue
        record, _ = _read_valid(path)
        if record is None or not _matches(record["config"]["method"], methods):
            continue
        link = f" (a symbolic link to {path.readlink()})" if path.is_symlink() else ""
        problems.append(f"{path}{link} is not in the report (written after it?): run atlas-fast report {root} again")
    return problems


def verify_report(results_dir: str | Path, out: str | Path | None = None) -> list[str]:
    """Check a written report and the folder it was made from: every record named in ``<out>/sources.json``
    (default ``<results_dir>/report``) must be there, sealed, with a seal that matches its content and the one the
    report used; every cell of ``report.csv`` must come out the same when the tables are computed again from exactly
    those records; and every other record file in the folder must be readable and sealed, with a matching seal
    (:func:`folder_problems`: a damaged record the report left out still fails), and be one the report used or
    listed as left out (not one written since). Returns the problems found (empty: verified), each naming the file,
    row or cell."""
    import contextlib
    import io
    import tempfile

    from atlas_fast.engine.validity import predictions_problems, read_record
    from atlas_fast.engine.seal import SEAL_FIELD, is_sealed, seal_problem
    from atlas_fast.files import JsonFileError, read_json

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
