"""``atlas-fast report RESULTS_DIR``: every finished run under a results folder as paper tables and plots.

Runs write one record per run to ``<results_dir>/<dataset>/<stem>.json`` (:mod:`atlas_fast.engine.record`), whichever
command trained them (``train``, ``demo``, ``experiment``, the Python API). :func:`collect_records` reads them back
(damaged or unfinished ones are skipped with a warning naming the file; nothing is moved or changed) and
:func:`report_folder` turns them into one table per setting (per shot count for few-shot):

- rows are grouped by dataset, then method (a block of rows each, compared with its first row, the plain method),
  then label variant (``CoOp``, ``+ ATLaS``, ``+ ATLaS-CSL``...: :func:`atlas_fast.app.report.variant_label`);
  records of one variant whose configurations differ otherwise (a sensitivity sweep's α, an ``--epochs``
  override, another backbone) become separate rows named by what differs, e.g. ``+ ATLaS-ISL (alpha=0.3)``, so
  they are never averaged together;
- each cell is the mean over seeds ± the *population* standard deviation over seeds (``statistics.pstdev``, as
  CoOp's ``parse_test_res``); an "Average" group (several datasets) averages the per-dataset means (± the mean of
  the per-dataset stds) of the variants every dataset has;
- base-to-new shows base, new and H, where H is the harmonic mean of the *mean* base and new accuracies (the
  papers' convention, :func:`atlas_fast.app.report.aggregate`); few-shot and cross-dataset show the accuracy on
  their class set (``all``; cross-dataset records hold the source dataset; the targets are evaluated by
  ``atlas-fast experiment table_cross_dataset``).

Outputs in ``out`` (default ``<results_dir>/report/``): ``report.md``, ``report.tex`` (booktabs, one labelled table
each), ``report.csv`` (one line per row, every metric's mean and std, the last metric's mean paired difference to the
block's first row with its 95 % interval) and per table a plot ``<table>.png`` /
``<table>.pdf`` (bars of the Average or single-dataset rows; few-shot over several shot counts: accuracy against
shots). This module imports neither torch nor the engine until a report is made, so the command line stays quick.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

FORMATS = ("md", "tex", "csv", "png", "pdf")
SETTING_TITLES = {"base2new": "Base-to-new generalisation", "few_shot": "Few-shot classification",
                  "cross_dataset": "Cross-dataset transfer, source dataset"}
# Config fields that never make two records different variants: the grouping keys themselves, where the run ran
# and whether it was also evaluated after every epoch (which changes no final number).
_NOT_A_VARIANT = ("seed", "dataset", "setting", "shots", "method", "device", "eval_every_epoch")
_REQUIRED = ("config.dataset", "config.method", "config.setting", "config.shots", "config.seed",
             "config.schedule.name")
_SCHEDULE_ORDER = ("onehot", "atlas", "joint", "ols", "tfkd")
_SOFT_ORDER = ("ls", "csl", "isl", "mix")


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _matches(value: str, wanted: Sequence[str] | None) -> bool:
    return wanted is None or value.lower() in {w.lower() for w in wanted}


def collect_records(results_dir: str | Path, datasets: Sequence[str] | None = None,
                    methods: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every finished, valid record under ``results_dir`` (``<dataset>/*.json``), in file-name order, optionally
    only those of ``datasets`` and ``methods`` (registry names such as ``coop``, ``dept-coop``; case-insensitive).
    Each record gets ``path`` (its file). A file that cannot be read, is not finished, or lacks what the report
    needs is skipped with a warning on stderr naming it (it is left where it is)."""
    from atlas_fast.engine.record import missing_fields, read_record, record_problems

    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"Results folder {root} does not exist (runs write <results_dir>/<dataset>/*.json).")
    records = []
    for path in sorted(root.glob("*/*.json")):
        if not _matches(path.parent.name, datasets):  # the folder is named by the dataset
            continue
        try:
            record = read_record(path)
            problems = record_problems(record) + [f"no '{f}'" for f in missing_fields(record, _REQUIRED)]
        except ValueError as exc:
            _warn(f"skipped {path}: {str(exc).removeprefix(f'{path} is ')}")
            continue
        if problems:
            _warn(f"skipped {path}: not a valid finished record ({'; '.join(problems[:3])}).")
            continue
        config = record["config"]
        if _matches(config["dataset"], datasets) and _matches(config["method"], methods):
            records.append({**record, "path": str(path)})
    return records


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"soft_labels.alpha": 0.1, ...}`` (lists as JSON text)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): json.dumps(value) if isinstance(value, list) else value}


def _signature(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in _flat(config).items() if k.split(".")[0] not in _NOT_A_VARIANT}


def _base_label(config: dict[str, Any]) -> str:
    from atlas_fast.app.report import method_name, variant_label

    try:
        return variant_label(config)
    except (KeyError, TypeError, AttributeError):  # a schedule or soft-label kind this version does not name
        return f"{method_name(config['method'])} ({config['schedule'].get('name')})"


def _short_names(keys: Sequence[str]) -> dict[str, str]:
    """``soft_labels.alpha`` -> ``alpha`` unless two keys end alike (then the full dotted name)."""
    ends = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (e if ends.count(e) == 1 else k) for k, e in zip(keys, ends)}


def _value_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _sortable(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, str(value))


def label_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with ``label`` (the row name) and ``table`` (``(setting, shots)``), in table order: method blocks
    (zero-shot CLIP first, then the registry's order), the plain method first in its block, then the ATLaS
    variants; one record per seed and row (of two, the newer one is kept, with a warning naming both files)."""
    from atlas_fast.methods import METHODS

    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        c = record["config"]
        groups[((c["setting"], c["shots"]), c["method"], _base_label(c))].append(record)
    labelled = []
    for (table, method, base), members in groups.items():
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
            labelled.append({**record, "table": table, "label": f"{base} ({suffix})" if suffix else base,
                             "_values": values})

    registry = ["zsclip"] + [m for m in METHODS if m != "zsclip"]

    def order(record: dict[str, Any]) -> tuple:
        c = record["config"]
        schedule, soft = c["schedule"], (c.get("soft_labels") or {}).get("kind")
        return (record["table"][0], record["table"][1],
                registry.index(c["method"]) if c["method"] in registry else len(registry), c["method"],
                _SCHEDULE_ORDER.index(schedule["name"]) if schedule["name"] in _SCHEDULE_ORDER else 99,
                _SOFT_ORDER.index(soft) if soft in _SOFT_ORDER else 99, _sortable(schedule.get("period", 0)),
                [_sortable(v) for v in record["_values"]], record["label"], c["dataset"], c["seed"])

    kept: dict[tuple, dict[str, Any]] = {}
    for record in sorted(labelled, key=order):
        c = record["config"]
        key = (record["table"], c["dataset"], c["method"], record["label"], c["seed"])
        if key in kept:
            older, newer = sorted([kept[key], record], key=lambda r: r.get("created", ""))
            _warn(f"two records of {c['dataset']} {record['label']} seed {c['seed']} (trained on other data or "
                  f"by another atlas_fast version?): using {newer['path']}, ignoring {older['path']}.")
            kept[key] = newer
        else:
            kept[key] = record
    result = sorted(kept.values(), key=order)
    for record in result:
        record.pop("_values", None)
    return result


def _dataset_order(names: Sequence[str]) -> list[str]:
    from atlas_fast.experiments.common import ELEVEN

    paper = [d for d in ELEVEN if d in names]
    return paper + sorted(set(names) - set(paper))


def _table_rows(records: Sequence[dict[str, Any]], metrics: Sequence[str] | None) -> tuple[list, list[str], str]:
    """The rows of one table (the Average group first when there are several datasets), its columns and a note on
    variants left out of the average."""
    from atlas_fast.app.report import aggregate

    setting = records[0]["config"]["setting"]
    wanted = list(metrics) if metrics else (["base", "new", "H"] if setting == "base2new" else ["all"])
    has = [m for m in ("base", "new", "all") if all(m in r["metrics"] for r in records)]
    columns = [m for m in wanted if m in has or (m == "H" and {"base", "new"} <= set(has))]
    needed = [m for m in columns if m != "H"] + [m for m in ("base", "new") if "H" in columns and m not in columns]
    if not columns:
        return [], [], f"none of the metrics {', '.join(wanted)} is in every record of this table"

    def rows_of(subset: Sequence[dict[str, Any]], group: str) -> list:
        rows = aggregate(subset, needed, label=lambda c: c["_label"], by_method=True)
        for row in rows:
            row.group = group
            row.metrics = {m: row.metrics[m] for m in columns}
            row.spread = {m: v for m, v in row.spread.items() if m in columns}
        return rows

    tagged = [{**r, "config": {**r["config"], "_label": r["label"]}} for r in records]
    datasets = _dataset_order(list(dict.fromkeys(r["config"]["dataset"] for r in tagged)))
    rows, note = [], ""
    if len(datasets) > 1:
        present = defaultdict(set)
        for r in tagged:
            present[(r["config"]["method"], r["label"])].add(r["config"]["dataset"])
        complete = [r for r in tagged if present[(r["config"]["method"], r["label"])] == set(datasets)]
        left_out = sorted({label for (_, label), ds in present.items() if ds != set(datasets)})
        if complete:
            rows += rows_of(complete, "Average")
        if left_out:
            note = f"Not in the Average (not run on every dataset): {', '.join(left_out)}."
    for dataset in datasets:
        rows += rows_of([r for r in tagged if r["config"]["dataset"] == dataset], dataset)
    return rows, columns, note


def _table_name(setting: str, shots: int, shot_counts: int) -> str:
    return f"{setting}_{shots}shot" if setting == "few_shot" or shot_counts > 1 else setting


def report_folder(results_dir: str | Path, out: str | Path | None = None, datasets: Sequence[str] | None = None,
                  methods: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
                  formats: Sequence[str] | None = None) -> str:
    """Tables and plots of every finished record under ``results_dir`` (see the module docstring), written to
    ``out`` (default ``<results_dir>/report/``) as ``report.md``, ``report.tex``, ``report.csv`` and
    ``<table>.png``/``.pdf`` (``formats``: any of md, tex, csv, png, pdf; default all); returns the Markdown.
    ``datasets``/``methods`` keep only those records; ``metrics`` replaces each table's columns (default: base, new,
    H for base-to-new, ``all`` otherwise). Cells are mean ± population std over seeds; H is that of the mean base and
    new accuracies. Raises ``ValueError`` when no finished record matches."""
    from atlas_fast.app.report import (display_label, latex_label, latex_table, markdown_table, paired_csv_fields,
                                       paired_differences, plot_rows, plot_series)

    formats = list(FORMATS if formats is None else formats)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"Unknown report format(s) {unknown}; valid: {', '.join(FORMATS)}.")
    root = Path(results_dir)
    out = root / "report" if out is None else Path(out)
    records = collect_records(root, datasets, methods)
    if not records:
        found = sorted(p.parent.name for p in root.glob("*/*.json"))
        raise ValueError(f"No finished result record under {root}"
                         f"{' matching the --datasets/--methods given' if datasets or methods else ''} "
                         f"(records are <results_dir>/<dataset>/*.json; dataset folders with records here: "
                         f"{', '.join(dict.fromkeys(found)) or 'none'}).")
    records = label_records(records)
    tables: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        tables[record["table"]].append(record)
    order = {s: i for i, s in enumerate(SETTING_TITLES)}
    keys = sorted(tables, key=lambda k: (order.get(k[0], 99), k[0], k[1]))
    shot_counts = {s: len({k[1] for k in keys if k[0] == s}) for s in {k[0] for k in keys}}

    used_datasets = sorted({r["config"]["dataset"] for r in records})
    used_methods = list(dict.fromkeys(r["config"]["method"] for r in records))
    markdown = [f"# Results under {root}", "",
                f"{len(records)} finished run(s): {len(used_datasets)} dataset(s), "
                f"method(s) {', '.join(used_methods)}."]
    latex: list[str] = []
    csv_lines: list[dict[str, Any]] = []
    plots: list[tuple[str, Any]] = []
    few_shot_curves: dict[str, dict[int, float]] = defaultdict(dict)
    for setting, shots in keys:
        rows, columns, note = _table_rows(tables[(setting, shots)], metrics)
        name = _table_name(setting, shots, shot_counts[setting])
        title = f"{SETTING_TITLES.get(setting, setting)}, {shots} shots"
        markdown += ["", f"## {title}", "", markdown_table(rows) if rows else f"(no table: {note})"]
        if rows and note:
            markdown.append(note)
        if not rows:
            continue
        caption = (f"{title}. Mean ± population std over seeds"
                   + ("; H from the mean base and new accuracies" if "H" in columns else "")
                   + (f"; Δ{columns[-1]}: mean paired difference over seeds to the method's first row, 95 % t "
                      f"interval" if any(p is not None for p in paired_differences(rows)) else "") + ".")
        latex.append(latex_table(rows, caption=caption, label=latex_label(name)))
        for row, paired in zip(rows, paired_differences(rows)):
            line = {"setting": setting, "shots": shots, "dataset": row.group, "method": row.block,
                    "variant": row.label, "seeds": row.seeds, "datasets": len(row.datasets)}
            for metric in ("base", "new", "H", "all"):
                line[metric] = f"{row.metrics[metric]:.4f}" if metric in row.metrics else ""
                line[f"{metric}_std"] = (f"{row.spread[metric]:.4f}" if metric in row.spread and metric != "H"
                                         else "")
            line.update(paired_csv_fields(paired, columns[-1]))  # the table's last column (H or all)
            csv_lines.append(line)
        groups = list(dict.fromkeys(row.group for row in rows))
        if len(groups) > 1 and groups[0] != "Average":
            continue  # no variant ran on every dataset: no one set of rows sums the table up
        summary = [row for row in rows if row.group == groups[0]]
        if setting == "few_shot" and shot_counts[setting] > 1:
            for row in summary:
                few_shot_curves[display_label(row)][shots] = row.metrics[columns[0]]
        else:
            plots.append((name, summary))

    written: list[Path] = []
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(markdown)
    if "md" in formats:
        written.append(out / "report.md")
        written[-1].write_text(text + "\n")
    if "tex" in formats:
        written.append(out / "report.tex")
        written[-1].write_text("\n\n".join(latex) + "\n")
    if "csv" in formats:
        written.append(out / "report.csv")
        with open(written[-1], "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(csv_lines[0]) if csv_lines else ["setting"])
            writer.writeheader()
            writer.writerows(csv_lines)
    images = [f for f in formats if f in ("png", "pdf")]
    if images:
        for name, rows in plots:
            plot_rows(rows, out / f"{name}.{images[0]}", formats=images)
            written += [out / f"{name}.{fmt}" for fmt in images]
        all_shots = sorted({s for curve in few_shot_curves.values() for s in curve})
        curves = {label: [curve[s] for s in all_shots] for label, curve in few_shot_curves.items()
                  if set(curve) == set(all_shots)}
        if curves:
            plot_series(all_shots, curves, out / f"few_shot.{images[0]}", xlabel="shots per class",
                        ylabel="accuracy (%)", formats=images, log_x=True)
            written += [out / f"few_shot.{fmt}" for fmt in images]
    for path in written:
        print(f"written: {path}", file=sys.stderr)
    return text


def add_report_command(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast report RESULTS_DIR [--datasets ...] [--methods ...] [--metrics ...] [--out DIR] [--format ...]``
    (imports nothing heavy: the report's modules are imported when it runs)."""
    report = subparsers.add_parser(
        "report", help="tables (Markdown, LaTeX, CSV) and plots of every finished run under a results folder",
        description="Read every finished run record under RESULTS_DIR (<dataset>/*.json, whichever command trained "
                    "it) and write one table per setting: rows by dataset (and an Average over datasets), method and "
                    "variant (CoOp, + ATLaS, ...), each cell the mean ± population std over seeds; base-to-new shows "
                    "base/new/H (H of the mean base and new), few-shot and cross-dataset the accuracy on their "
                    "classes. Damaged records are skipped with a warning. The Markdown is printed.")
    report.add_argument("results_dir", type=Path, help="the results folder of the runs (e.g. results)")
    report.add_argument("--datasets", nargs="+", default=None, help="only these datasets (default: all found)")
    report.add_argument("--methods", nargs="+", default=None,
                        help="only these methods, by registry name (e.g. coop dept-coop; default: all found)")
    report.add_argument("--metrics", nargs="+", default=None, choices=("base", "new", "H", "all"),
                        help="table columns (default: base new H for base-to-new, all otherwise)")
    report.add_argument("--out", type=Path, default=None, help="output folder (default RESULTS_DIR/report)")
    report.add_argument("--format", nargs="+", dest="formats", choices=FORMATS, default=list(FORMATS),
                        metavar="FORMAT", help=f"outputs to write, any of {' '.join(FORMATS)} (default: all)")
    report.set_defaults(func=run_report_command)


def run_report_command(args: argparse.Namespace) -> int:
    """Write the report of ``args.results_dir`` and print its Markdown; returns the exit status (0)."""
    print(report_folder(args.results_dir, out=args.out, datasets=args.datasets, methods=args.methods,
                        metrics=args.metrics, formats=args.formats))
    return 0
