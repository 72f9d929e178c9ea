"""A results table's rows from result records: one :class:`TableRow` per variant, aggregated as the papers do.

Aggregation follows the papers' convention (``docs/protocol.md``, section Evaluation): per dataset the accuracies are
averaged over seeds; the "average over datasets" row averages those means; H is computed from the averaged base and
new accuracies (not averaged per-dataset H values). Improvements are given against the row marked as the baseline,
and, where the rows come from records, as the mean paired difference over seeds with a 95 % t interval
(:mod:`atlas_fast.report.stats`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Collection, Hashable, Iterable, Mapping, Sequence

from atlas_fast.report.stats import PairedDifference, paired_by_seed

# The engine and the ATLaS package (torch) are imported by the functions that need them, so that importing this
# module (as the experiment modules do to build their command line) stays light.


def method_name(method: str) -> str:
    """The printed name of a registered method (``dept-coop`` -> ``DePT``, from its registry entry); unknown names
    are printed as given."""
    from atlas_fast.methods import METHODS

    return METHODS[method].printed_name if method in METHODS else method


def variant_name(config: dict[str, Any]) -> str:
    """How the paper names a run's variant: ``CoOp``, ``+ ATLaS``, ``+ ATLaS-CSL``, ``+ soft + y (ISL)``, ``+ OLS``...
    (the period K is not part of the name: pass another ``name_of`` function to tables that vary it)."""
    from atlas_fast.atlas.variants import row_name

    soft = (config.get("soft_labels") or {}).get("kind")
    return row_name(config["schedule"], soft) or method_name(config["method"])


def strategy_name(config: dict[str, Any]) -> str:
    """Names of the label-smoothing strategies compared in the paper's curves (Fig. 1, the SUN397 figure): soft
    labels every epoch (ATLaS period K = 1) are ``+ LS`` / ``+ CSL`` / ``+ ISL``, alternating ones ``+ ATLaS...``."""
    from atlas_fast.atlas.variants import row_name

    soft = (config.get("soft_labels") or {}).get("kind")
    return row_name(config["schedule"], soft, every_epoch_names=True) or method_name(config["method"])


#: the section of a table's rows that average the per-dataset means (after the datasets' sections)
AVERAGE = "Average"

# The calibration figures a table can show (record["metrics"]["calibration"][class set], atlas_fast.engine.calibration):
# a column is "<figure> <class set>", e.g. "ECE new" or "ECE (T) new" (after temperature scaling).
CALIBRATION_FIGURES = {"ECE": "ece", "ECE (T)": "ece_ts", "NLL": "nll", "NLL (T)": "nll_ts", "Brier": "brier",
                       "conf.": "confidence"}
# Columns whose best value is the lowest (the tables bold it).
LOWER_IS_BETTER = ("ECE", "NLL", "Brier")


def calibration_columns(figures: Sequence[str], sets: Sequence[str] = ("base", "new")) -> tuple[str, ...]:
    """The column names of ``figures`` (keys of :data:`CALIBRATION_FIGURES`) on ``sets``: ``["ECE base", ...]``."""
    unknown = [f for f in figures if f not in CALIBRATION_FIGURES]
    if unknown:
        raise ValueError(f"unknown calibration figure(s) {unknown}; expected some of {list(CALIBRATION_FIGURES)}")
    return tuple(f"{figure} {name}" for figure in figures for name in sets)


def calibration_value(record: dict[str, Any], column: str) -> float | None:
    """A record's value of a calibration column (``"ECE new"``: ``metrics.calibration.new.ece``), or None where the
    record has none (written before records held calibration, or no validation split for a temperature)."""
    figure, _, name = column.rpartition(" ")
    entry = ((record.get("metrics") or {}).get("calibration") or {}).get(name) or {}
    value = entry.get(CALIBRATION_FIGURES[figure])
    return None if value is None else float(value)


def is_calibration_column(metric: str) -> bool:
    """Whether a table column is a calibration figure on a class set (``"ECE new"``)."""
    return metric.rpartition(" ")[0] in CALIBRATION_FIGURES


def metric_value(record: dict[str, Any], metric: str) -> float | None:
    """A record's value of a table column: an accuracy (``base``, ``new``, ``H``...) or a calibration column."""
    if is_calibration_column(metric):
        return calibration_value(record, metric)
    value = (record.get("metrics") or {}).get(metric)
    return None if value is None else float(value)


def lower_is_better(metric: str) -> bool:
    return metric.split(" ")[0] in LOWER_IS_BETTER


@dataclass
class TableRow:
    """One method variant: metric means (over seeds, then datasets) and the per-seed spread of each metric.
    ``section`` (e.g. a dataset) puts rows under a first column of their own; ``block`` (a method) gathers the rows
    compared with the block's first row."""

    name: str
    metrics: dict[str, float]
    spread: dict[str, float] = field(default_factory=dict)
    seeds: int = 0
    datasets: tuple[str, ...] = ()
    block: str = ""  # rows of one method share a block; each block's first row is its baseline
    section: str = ""  # rows of one dataset (or "Average") share a section; blocks are compared within it
    # metric -> seed -> value (mean over the row's datasets; H from that seed's base and new): what pairs rows by seed
    per_seed: dict[str, dict[int, float]] = field(default_factory=dict)
    # what the row's runs change from their method's recipe and the paper's presets
    # (:func:`atlas_fast.engine.deviations.runs_deviations`): the tables mark the row, or the table, with it
    deviations: tuple[tuple[str, str], ...] = ()


def aggregate(records: Iterable[dict[str, Any]], metrics: Sequence[str] = ("base", "new"),
              name_of=variant_name, by_method: bool = False, deviations: bool = True,
              leave_out: Collection[str] = ()) -> list[TableRow]:
    """Group records by variant name (first-seen order) and average as the papers do; adds H when base and new are
    present; ``spread`` is the population std over seeds, averaged over datasets. With ``by_method`` each method's
    records form a block compared with its first row. Each row keeps its runs' deviations (``deviations=False``:
    none), without the fields ``leave_out`` (ones the names say, e.g. a swept α)."""
    from atlas_fast.engine.deviations import runs_deviations
    from atlas_fast.engine.evaluate import harmonic_mean

    if by_method:
        per_method: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in records:
            per_method[record["config"]["method"]].append(record)
        rows = []
        for method, group in per_method.items():
            for row in aggregate(group, metrics, name_of, deviations=deviations, leave_out=leave_out):
                row.block = method_name(method)
                rows.append(row)
        return rows
    groups: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    seed_values: dict[str, dict[str, dict[int, dict[str, float]]]] = defaultdict(lambda: defaultdict(dict))
    configs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    nan = float("nan")
    for record in records:
        variant = name_of(record["config"])
        configs[variant].append(record["config"])
        dataset = record["config"]["dataset"]
        values = {m: metric_value(record, m) for m in metrics}  # None: a figure the record lacks (shown "–")
        for name in metrics:
            groups[variant][dataset][name].append(nan if values[name] is None else values[name])
        seed_values[variant][dataset][record["config"]["seed"]] = {m: nan if v is None else v
                                                                   for m, v in values.items()}
    rows = []
    for variant, per_dataset in groups.items():
        means = {m: statistics.fmean(_mean(d[m]) for d in per_dataset.values()) for m in metrics}
        spread = {m: statistics.fmean(_pstdev(d[m]) for d in per_dataset.values()) for m in metrics}
        if "base" in means and "new" in means:
            means["H"] = harmonic_mean(means["base"], means["new"])
        seeds = min(len(next(iter(d.values()))) for d in per_dataset.values())
        rows.append(TableRow(variant, means, spread, seeds, tuple(per_dataset),
                             per_seed=_per_seed_means(seed_values[variant], metrics),
                             deviations=runs_deviations(configs[variant], leave_out) if deviations else ()))
    return rows


def _mean(values: Sequence[float]) -> float:
    """The mean, NaN when any value is missing (NaN): a cell is the mean of every seed or none."""
    return float("nan") if any(math.isnan(v) for v in values) else statistics.fmean(values)


def _pstdev(values: Sequence[float]) -> float:
    return float("nan") if any(math.isnan(v) for v in values) else statistics.pstdev(values)


def deviation_marks(rows: Mapping[Hashable, Sequence[dict[str, Any]]], leave_out: Collection[str] = ()
                    ) -> tuple[str, dict[Hashable, str]]:
    """:func:`atlas_fast.engine.deviations.table_marks` for a table not made of :class:`TableRow` s, given each
    printed row's records, without the fields ``leave_out``; :func:`deviation_sentences` explains the marks."""
    from atlas_fast.engine.deviations import runs_deviations, table_marks

    table_note, marks = table_marks([runs_deviations((r["config"] for r in records), leave_out)
                                     for records in rows.values()])
    return table_note, dict(zip(rows, marks))


def _per_seed_means(per_dataset: dict[str, dict[int, dict[str, float]]], metrics: Sequence[str]
                    ) -> dict[str, dict[int, float]]:
    """Metric -> seed -> mean over the datasets, for the seeds every dataset has; H from the seed's base and new."""
    from atlas_fast.engine.evaluate import harmonic_mean

    seeds = sorted(set.intersection(*(set(d) for d in per_dataset.values())))
    values = {m: {s: statistics.fmean(d[s][m] for d in per_dataset.values()) for s in seeds} for m in metrics}
    values = {m: {s: v for s, v in by_seed.items() if not math.isnan(v)} for m, by_seed in values.items()}
    if "base" in values and "new" in values:
        values["H"] = {s: harmonic_mean(values["base"][s], values["new"][s]) for s in seeds}
    return values


def metric_columns(rows: Sequence[TableRow]) -> list[str]:
    return list(rows[0].metrics) if rows else []


def _block_keys(rows: Sequence[TableRow]) -> list[tuple[str, str]]:
    return [(row.section, row.block) for row in rows]


def reference_rows(rows: Sequence[TableRow], baseline: int) -> list[int | None]:
    """Per row, the index of the row its change is measured against (None for a baseline row): the first row of its
    block (and section) when rows carry blocks or sections, else ``rows[baseline]``."""
    if not any(row.block or row.section for row in rows):
        return [None if i == baseline else baseline for i in range(len(rows))]
    first: dict[tuple[str, str], int] = {}
    refs: list[int | None] = []
    for i, key in enumerate(_block_keys(rows)):
        refs.append(first.setdefault(key, i))
        if refs[-1] == i:
            refs[-1] = None
    return refs


def best_cells(rows: Sequence[TableRow], digits: int = 2) -> set[tuple[int, str]]:
    """``(row index, metric)`` of the best value of each metric column as printed (the highest; the lowest for ECE,
    NLL and Brier; ties all count; missing values never), per block of rows when rows carry blocks or sections, else
    over the table. A block of one row has no best."""
    blocks: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, key in enumerate(_block_keys(rows)):
        blocks[key].append(i)
    best = set()
    for members in blocks.values():
        if len(members) < 2:
            continue
        for c in metric_columns(rows):
            shown = {i: round(rows[i].metrics[c], digits) for i in members if not math.isnan(rows[i].metrics[c])}
            if len(shown) < 2:
                continue
            top = (min if lower_is_better(c) else max)(shown.values())
            best |= {(i, c) for i, value in shown.items() if value == top}
    return best


def display_name(row: TableRow) -> str:
    """A row's name outside its table (plots): ``+ ATLaS`` rows of a block are prefixed with the block's method."""
    return f"{row.block} {row.name}" if row.block and row.name.startswith("+") else row.name


def paired_differences(rows: Sequence[TableRow], baseline: int = 0, metric: str | None = None
                       ) -> list[PairedDifference | None]:
    """Per row, the mean paired difference (over the seeds both rows have) of ``metric`` (default: the last column,
    the one whose change the tables print) against the row it is compared with, and its 95 % t interval; None for a
    baseline row and for rows without per-seed values (:mod:`atlas_fast.report.stats`)."""
    cols = metric_columns(rows)
    metric = metric or (cols[-1] if cols else "")
    out: list[PairedDifference | None] = []
    for row, ref in zip(rows, reference_rows(rows, baseline)):
        if ref is None or metric not in row.per_seed or metric not in rows[ref].per_seed:
            out.append(None)
        else:
            out.append(paired_by_seed(row.per_seed[metric], rows[ref].per_seed[metric]))
    return out


def epoch_curves(records: Iterable[dict[str, Any]], metric: str = "new",
                 name_of=variant_name) -> dict[str, list[float]]:
    """Accuracy over epochs (runs trained with ``eval_every_epoch``), mean over seeds (and datasets) per variant."""
    runs: dict[str, list[list[float]]] = defaultdict(list)
    for record in records:
        points = [e["accuracy"][metric] for e in record["epochs"] if "accuracy" in e]
        if points:
            runs[name_of(record["config"])].append(points)
    if not runs:
        raise ValueError("No per-epoch accuracy in these records: train with eval_every_epoch=True.")
    return {name: [statistics.fmean(r[e] for r in curves) for e in range(min(len(r) for r in curves))]
            for name, curves in runs.items()}
