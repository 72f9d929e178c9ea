"""Paper-ready tables and plots from result records (the output of :func:`atlas_fast.engine.pipeline.run`).

Aggregation follows the papers' convention (``docs/protocol.md``, section Evaluation): per dataset the accuracies are
averaged over seeds; the "average over datasets" row averages those means; H is computed from the averaged base and new
accuracies (not averaged per-dataset H values). Improvements are given against the row marked as the baseline, and,
where the rows come from records, as the mean paired difference over seeds with a 95 % t interval
(:mod:`atlas_fast.report.stats`) in a column of its own (Markdown, LaTeX and CSV). What the rows' runs change from
their method's recipe and the paper's presets is marked (:func:`aggregate` keeps it per row): what all rows change
alike once, after the title or in the caption, the rest after each row's name, every CSV line in full
(:func:`atlas_fast.engine.deviations.table_marks`).

Outputs are made for a paper: LaTeX with booktabs rules and no vertical ones, ``mean ± std``, a ``\\label`` and the
best value of each column in bold; figures without a baked-in title (the caption belongs to the paper), fonts of at
least 8 pt at the saved size, bar charts from 0, line plots that say where a zoomed axis starts, written as PNG and
PDF of the same stem. :mod:`atlas_fast.report.collect` builds the ``atlas-fast report`` tables from a results folder.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Hashable, Iterable, Mapping, Sequence

from atlas_fast.report.stats import PairedDifference, interval_note, paired_by_seed

# The engine and the ATLaS package (torch) are imported by the functions that need them, so that importing this
# module (as the experiment modules do to build their command line) stays light.


def method_name(method: str) -> str:
    """The printed name of a registered method (``dept-coop`` -> ``DePT``, from its registry entry); unknown names
    are printed as given."""
    from atlas_fast.methods import METHODS

    return METHODS[method].printed_name if method in METHODS else method


def variant_label(config: dict[str, Any]) -> str:
    """How the paper names a run's variant: ``CoOp``, ``+ ATLaS``, ``+ ATLaS-CSL``, ``+ soft + y (ISL)``, ``+ OLS``...
    (the period K is not part of the name: pass another ``label`` function to tables that vary it)."""
    from atlas_fast.atlas.variants import row_label

    soft = (config.get("soft_labels") or {}).get("kind")
    return row_label(config["schedule"], soft) or method_name(config["method"])


def strategy_label(config: dict[str, Any]) -> str:
    """Names of the label-smoothing strategies compared in the paper's curves (Fig. 1, the SUN397 figure): soft
    labels every epoch (ATLaS period K = 1) are ``+ LS`` / ``+ CSL`` / ``+ ISL``, alternating ones ``+ ATLaS...``."""
    from atlas_fast.atlas.variants import row_label

    soft = (config.get("soft_labels") or {}).get("kind")
    return row_label(config["schedule"], soft, every_epoch_names=True) or method_name(config["method"])


def run_name(config: dict[str, Any]) -> str:
    """A run as the ``train`` command's lines and summary name it: :func:`~atlas_fast.atlas.variants.run_label`
    (``coop+ATLaS-ISL (K=2)``) and what the run changes from the recipe and the paper's presets
    (:func:`~atlas_fast.engine.deviations.deviation_note`, e.g. `` [θ=0.3, epochs=2]``)."""
    from atlas_fast.atlas.variants import run_label
    from atlas_fast.engine.deviations import deviation_note

    label = run_label(config["method"], config["schedule"], (config.get("soft_labels") or {}).get("kind"))
    return label + deviation_note(config, leave_out={"schedule.period"})  # run_label names K


def train_results(dataset: str, methods: Sequence[str], seeds: Sequence[int], records: Sequence[dict[str, Any]]) -> str:
    """What ``atlas-fast train`` prints: a line per run (its metrics, zero-shot CLIP's and the record's path), then a
    Markdown table of the mean ± population std over seeds per method (± with several seeds; H of the mean base and
    new, as the papers' tables, without ±)."""
    from atlas_fast.engine.evaluate import harmonic_mean

    lines, table = [], []
    for method in methods:
        runs = [r for r in records if r["config"]["method"] == method]
        label = run_name(runs[0]["config"])
        rows, columns = [], ()
        for seed, record in zip(seeds, runs):
            metrics = record["metrics"]
            # base/new/H in base-to-new; otherwise (and for class-specific context) the trained class set only
            columns = ("base", "new", "H") if "new" in metrics and "base" in metrics else (record["config"]["subsample"],)
            values = "  ".join(f"{c} {metrics[c]:.2f}" for c in columns)
            zero_shot = "  ".join(f"{c} {metrics['zero_shot'][c]:.2f}" for c in columns)
            note = " (existing record, skipped)" if record.get("skipped") else ""
            lines.append(f"{dataset} {label} seed {seed}: {values}  | zero-shot CLIP: {zero_shot}{note}\n"
                         f"  record: {record['path']}")
            rows.append(metrics)
        cells = {}
        for c in columns:
            if c != "H":
                values = [float(m[c]) for m in rows]
                cells[c] = f"{statistics.fmean(values):.2f}" + (f" ± {statistics.pstdev(values):.2f}"
                                                                 if len(values) > 1 else "")  # as markdown_table
        if "base" in columns:  # H of the mean accuracies, as the papers' tables do
            mean = {c: statistics.fmean(float(m[c]) for m in rows) for c in ("base", "new")}
            cells["H"] = f"{harmonic_mean(mean['base'], mean['new']):.2f}"
        table.append((label, columns, cells))
    seed_list = ",".join(str(s) for s in seeds)
    for i, (label, columns, cells) in enumerate(table):
        if i == 0 or columns != table[i - 1][1]:
            lines += ["", f"| dataset | method | seeds | {' | '.join(columns)} |",
                      "|---|---|---|" + "---:|" * len(columns)]
        lines.append(f"| {dataset} | {label} | {seed_list} | {' | '.join(cells[c] for c in columns)} |")
    lines += ["", "Mean ± population std over seeds" + ("; H from the mean base and new accuracies" if any(
        "H" in columns for _, columns, _ in table) else "") + ("; [...]: what the run changes from its method's "
              "recipe and the paper's presets" if any(" [" in label for label, _, _ in table) else "") + "."]
    return "\n".join(lines)


def eval_result_line(result: dict[str, Any], record: str | Path) -> str:
    """What ``atlas-fast eval`` prints for one saved run tested on a dataset (:func:`atlas_fast.engine.evaluate_saved`)."""
    return (f"{result['dataset']} ({result['subsample']}, {result['num_classes']} classes, {result['num_test']} "
            f"test images): accuracy {result['accuracy']:.2f}  | zero-shot CLIP {result['zero_shot']:.2f}  "
            f"<- {record}")


@dataclass
class TableRow:
    """One method variant: metric means (over seeds, then datasets) and the per-seed spread of each metric.
    ``group`` (e.g. a dataset) puts rows under a first column of their own; ``block`` (a method) groups the rows
    compared with the block's first row."""

    label: str
    metrics: dict[str, float]
    spread: dict[str, float] = field(default_factory=dict)
    seeds: int = 0
    datasets: tuple[str, ...] = ()
    block: str = ""  # rows of one method share a block; each block's first row is its baseline
    group: str = ""  # rows of one dataset (or "Average") share a group; blocks are compared within their group
    # metric -> seed -> value (mean over the row's datasets; H from that seed's base and new): what pairs rows by seed
    per_seed: dict[str, dict[int, float]] = field(default_factory=dict)
    # what the row's runs change from their method's recipe and the paper's presets
    # (:func:`atlas_fast.engine.deviations.runs_deviations`): the tables mark the row, or the table, with it
    deviations: tuple[tuple[str, str], ...] = ()


def aggregate(records: Iterable[dict[str, Any]], metrics: Sequence[str] = ("base", "new"),
              label=variant_label, by_method: bool = False, deviations: bool = True,
              leave_out: Collection[str] = ()) -> list[TableRow]:
    """Group records by variant label (first-seen order) and average as the papers do; adds H when base and new are
    present. ``spread`` is the population std over seeds (CoOp's ``parse_test_res``), averaged over datasets.
    With ``by_method`` each method's records form a block of rows (the paper's Table III: CoOp, + ATLaS, ...,
    CoCoOp, + ATLaS, ...), compared with that block's first row. Each row keeps what its runs change from the
    recipes and presets (``deviations=False``: nothing, for labels that say it already), without the fields
    ``leave_out`` (ones the labels name, e.g. a swept α)."""
    from atlas_fast.engine.deviations import runs_deviations
    from atlas_fast.engine.evaluate import harmonic_mean

    if by_method:
        per_method: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in records:
            per_method[record["config"]["method"]].append(record)
        rows = []
        for method, group in per_method.items():
            for row in aggregate(group, metrics, label, deviations=deviations, leave_out=leave_out):
                row.block = method_name(method)
                rows.append(row)
        return rows
    groups: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    seed_values: dict[str, dict[str, dict[int, dict[str, float]]]] = defaultdict(lambda: defaultdict(dict))
    configs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        variant = label(record["config"])
        configs[variant].append(record["config"])
        dataset = record["config"]["dataset"]
        for name in metrics:
            groups[variant][dataset][name].append(float(record["metrics"][name]))
        seed_values[variant][dataset][record["config"]["seed"]] = {m: float(record["metrics"][m]) for m in metrics}
    rows = []
    for variant, per_dataset in groups.items():
        means = {m: statistics.fmean(statistics.fmean(d[m]) for d in per_dataset.values()) for m in metrics}
        spread = {m: statistics.fmean(statistics.pstdev(d[m]) for d in per_dataset.values()) for m in metrics}
        if "base" in means and "new" in means:
            means["H"] = harmonic_mean(means["base"], means["new"])
        seeds = min(len(next(iter(d.values()))) for d in per_dataset.values())
        rows.append(TableRow(variant, means, spread, seeds, tuple(per_dataset),
                             per_seed=_per_seed_means(seed_values[variant], metrics),
                             deviations=runs_deviations(configs[variant], leave_out) if deviations else ()))
    return rows


def deviation_marks(rows: Mapping[Hashable, Sequence[dict[str, Any]]], leave_out: Collection[str] = ()
                    ) -> tuple[str, dict[Hashable, str]]:
    """The marks of a table that is not made of :class:`TableRow` s, given each printed row's records: what all its
    rows' runs change alike from their recipes and presets, once for the table (`` [epochs=2]``, after its title),
    and per row the rest (after its name), without the fields ``leave_out``
    (:func:`atlas_fast.engine.deviations.table_marks`); :func:`deviation_sentences` explains them."""
    from atlas_fast.engine.deviations import runs_deviations, table_marks

    table_note, marks = table_marks([runs_deviations((r["config"] for r in records), leave_out)
                                     for records in rows.values()])
    return table_note, dict(zip(rows, marks))


def deviation_sentences(table_note: str, row_marks: Iterable[str], in_title: bool = True) -> list[str]:
    """The sentences below a table that explain its marks (none when nothing is marked); ``in_title``: the title
    shows ``table_note`` (else the sentence names it)."""
    from atlas_fast.engine.deviations import deviation_legend

    return ([deviation_legend(table_note, in_title)] if table_note else []) + (
        [deviation_legend()] if any(row_marks) else [])


def _row_marks(rows: Sequence[TableRow]) -> tuple[str, list[str]]:
    from atlas_fast.engine.deviations import table_marks

    return table_marks([row.deviations for row in rows])


def _per_seed_means(per_dataset: dict[str, dict[int, dict[str, float]]], metrics: Sequence[str]
                    ) -> dict[str, dict[int, float]]:
    """Metric -> seed -> mean over the datasets, for the seeds every dataset has; H from the seed's base and new."""
    from atlas_fast.engine.evaluate import harmonic_mean

    seeds = sorted(set.intersection(*(set(d) for d in per_dataset.values())))
    values = {m: {s: statistics.fmean(d[s][m] for d in per_dataset.values()) for s in seeds} for m in metrics}
    if "base" in values and "new" in values:
        values["H"] = {s: harmonic_mean(values["base"][s], values["new"][s]) for s in seeds}
    return values


def _columns(rows: Sequence[TableRow]) -> list[str]:
    return list(rows[0].metrics) if rows else []


def _block_keys(rows: Sequence[TableRow]) -> list[tuple[str, str]]:
    return [(row.group, row.block) for row in rows]


def _references(rows: Sequence[TableRow], baseline: int) -> list[int | None]:
    """Per row, the index of the row its change is measured against (None for a baseline row): the first row of its
    block (and group) when rows carry blocks or groups, else ``rows[baseline]``."""
    if not any(row.block or row.group for row in rows):
        return [None if i == baseline else baseline for i in range(len(rows))]
    first: dict[tuple[str, str], int] = {}
    refs: list[int | None] = []
    for i, key in enumerate(_block_keys(rows)):
        refs.append(first.setdefault(key, i))
        if refs[-1] == i:
            refs[-1] = None
    return refs


def best_cells(rows: Sequence[TableRow], digits: int = 2) -> set[tuple[int, str]]:
    """``(row index, metric)`` of the best (highest) value of each metric column as printed (ties all count), per
    block of rows when rows carry blocks or groups, else over the table. A block of one row has no best."""
    blocks: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, key in enumerate(_block_keys(rows)):
        blocks[key].append(i)
    best = set()
    for members in blocks.values():
        if len(members) < 2:
            continue
        for c in _columns(rows):
            top = max(round(rows[i].metrics[c], digits) for i in members)
            best |= {(i, c) for i in members if round(rows[i].metrics[c], digits) == top}
    return best


def display_label(row: TableRow) -> str:
    """A row's name outside its table (plots): ``+ ATLaS`` rows of a block are prefixed with the block's method."""
    return f"{row.block} {row.label}" if row.block and row.label.startswith("+") else row.label


def _seed_note(rows: Sequence[TableRow]) -> str:
    low, high = min(r.seeds for r in rows), max(r.seeds for r in rows)
    return f"{low} seed(s)" if low == high else f"{low} to {high} seeds (rows differ)"


def paired_differences(rows: Sequence[TableRow], baseline: int = 0, metric: str | None = None
                       ) -> list[PairedDifference | None]:
    """Per row, the mean paired difference (over the seeds both rows have) of ``metric`` (default: the last column,
    the one whose change the tables print) against the row it is compared with, and its 95 % t interval; None for a
    baseline row and for rows without per-seed values (:mod:`atlas_fast.report.stats`)."""
    cols = _columns(rows)
    metric = metric or (cols[-1] if cols else "")
    out: list[PairedDifference | None] = []
    for row, ref in zip(rows, _references(rows, baseline)):
        if ref is None or metric not in row.per_seed or metric not in rows[ref].per_seed:
            out.append(None)
        else:
            out.append(paired_by_seed(row.per_seed[metric], rows[ref].per_seed[metric]))
    return out


def _paired_column(rows: Sequence[TableRow], baseline: int) -> tuple[str, list[PairedDifference | None], str]:
    """The paired-difference column of a table (header, cells, note), or ``("", [], "")`` when no row has one."""
    cols = _columns(rows)
    paired = paired_differences(rows, baseline)
    present = [p for p in paired if p is not None]
    if not present:
        return "", [], ""
    low, high = min(p.seeds for p in present), max(p.seeds for p in present)
    seeds = f"{low}" if low == high else f"{low} to {high}"
    grouped = any(row.group or row.block for row in rows)
    note = interval_note(high, "the first row of the method's block" if grouped else "the baseline row")
    if low != high:
        note += f" (rows rest on {seeds} seeds)"
    return f"Δ{cols[-1]} (95 % CI)", paired, note


def markdown_table(rows: Sequence[TableRow], title: str = "", baseline: int = 0) -> str:
    """A Markdown table; the last metric column carries the change against ``rows[baseline]`` (or the first row of
    the row's block) in parentheses. Rows with a ``group`` get a first column naming it (e.g. the dataset)."""
    if not rows:
        return "(no results)"
    cols = _columns(rows)
    grouped = any(row.group for row in rows)
    paired_head, paired, paired_note = _paired_column(rows, baseline)
    table_note, marks = _row_marks(rows)
    heads = cols + ([paired_head] if paired_head else [])
    lines = [f"**{title}{table_note}**", ""] if title else []
    lines.append(("| Dataset " if grouped else "") + "| Method | " + " | ".join(heads) + " |")
    lines.append(("|---" if grouped else "") + "|---|" + "---:|" * len(heads))
    for i, (row, ref) in enumerate(zip(rows, _references(rows, baseline))):
        cells = []
        for c in cols:
            cell = f"{row.metrics[c]:.2f}"
            if c in row.spread and row.seeds > 1:
                cell += f" ± {row.spread[c]:.2f}"
            if c == cols[-1] and ref is not None:
                cell += f" ({row.metrics[c] - rows[ref].metrics[c]:+.2f})"
            cells.append(cell)
        if paired_head:
            cells.append(paired[i].cell() if paired[i] is not None else "")
        lines.append((f"| {row.group} " if grouped else "") + f"| {row.label}{marks[i]} | " + " | ".join(cells) + " |")
    datasets = sorted({d for r in rows for d in r.datasets})
    notes = [f"Mean over {_seed_note(rows)} per dataset"
             + (f", then over {len(datasets)} datasets" if len(datasets) > 1 and not grouped else "")
             + f" ({', '.join(datasets)})"]
    if any(row.group == "Average" for row in rows):
        notes.append("an Average row is the mean of the per-dataset means (its ± the mean of their stds)")
    notes.append("± = population std over seeds")
    if "H" in cols:
        notes.append("H from the mean base and new accuracies")
    if grouped and any(ref is not None for ref in _references(rows, baseline)):
        notes.append("(change) against the first row of the method's block")
    if paired_note:
        notes.append(paired_note)
    notes += deviation_sentences(table_note, marks, in_title=bool(title))
    lines += ["", "; ".join(notes) + "."]
    return "\n".join(lines)


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "±": r"$\pm$", "θ": r"$\theta$", "τ": r"$\tau$", "α": r"$\alpha$", "δ": r"$\delta$"}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters (and the Greek letters the captions use) escaped."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def latex_label(text: str) -> str:
    """A ``\\label`` key from a name or caption: ``tab:`` and at most six lower-case words joined by ``-``."""
    words = re.findall(r"[a-z0-9]+", text.lower())[:6]
    return "tab:" + ("-".join(words) or "results")


def latex_table(rows: Sequence[TableRow], caption: str = "", baseline: int = 0, label: str | None = None) -> str:
    """A booktabs LaTeX table shaped like the paper's Table III: Method | metrics as ``mean ± std`` (std over
    seeds, when there are several), the change of the last metric against the block's first row in parentheses, the
    best value of each column in bold (per method block when rows come in blocks), ``\\midrule`` between blocks
    (between groups, with ``\\cmidrule`` between the blocks of a group), no vertical rules. ``label`` names the
    ``\\label{tab:...}`` (default: from the caption). Needs ``\\usepackage{booktabs}``."""
    cols = _columns(rows)
    grouped = any(row.group for row in rows)
    best = best_cells(rows)
    table_note, marks = _row_marks(rows)
    full_caption = caption
    for sentence in deviation_sentences(table_note, marks, in_title=False):  # the caption explains the marks
        full_caption = (full_caption.rstrip(".") + ". " if full_caption else "") + sentence + "."
    paired_head, paired, _ = _paired_column(rows, baseline)
    body = []
    previous: tuple[str, str] | None = None
    for i, (row, ref) in enumerate(zip(rows, _references(rows, baseline))):
        cells = []
        for c in cols:
            value = f"{row.metrics[c]:.2f}"
            cell = rf"\textbf{{{value}}}" if (i, c) in best else value
            if c in row.spread and row.seeds > 1:
                cell += rf" {{\scriptsize$\pm${row.spread[c]:.2f}}}"
            if c == cols[-1] and ref is not None:
                cell += rf" {{\scriptsize({row.metrics[c] - rows[ref].metrics[c]:+.2f})}}"
            cells.append(cell)
        if paired_head:
            cells.append(_latex_paired(paired[i]))
        key = (row.group, row.block)
        first_of_group = previous is None or key[0] != previous[0]
        if previous is not None and key != previous:
            width = len(cols) + 2 + (1 if paired_head else 0)
            body.append(r"    \midrule" if first_of_group or not grouped else rf"    \cmidrule{{2-{width}}}")
        elif previous is not None and ref is None:  # a new baseline row inside an ungrouped, unblocked table
            body.append(r"    \midrule")
        previous = key
        lead = (latex_escape(row.group) if first_of_group else "") + " & " if grouped else ""
        body.append(f"    {lead}{latex_escape(row.label + marks[i])} & " + " & ".join(cells) + r" \\")
    heads = cols + ([paired_head] if paired_head else [])
    head = ("Dataset & " if grouped else "") + "Method & " + " & ".join(latex_escape(c) for c in heads) + r" \\"
    return "\n".join([
        r"% Requires \usepackage{booktabs} in the preamble.",
        r"\begin{table}[t]", r"  \centering", f"  \\caption{{{latex_escape(full_caption)}}}",
        f"  \\label{{{label if label and label.startswith('tab:') else latex_label(label or caption)}}}",
        r"  \begin{tabular}{" + ("ll" if grouped else "l") + "c" * len(heads) + "}", r"    \toprule",
        f"    {head}", r"    \midrule", *body, r"    \bottomrule",
        r"  \end{tabular}", r"\end{table}"])


def _latex_paired(paired: PairedDifference | None) -> str:
    """A paired-difference cell: ``+1.23 {\\scriptsize[+0.40, +2.06]}`` (empty for a baseline row)."""
    if paired is None:
        return ""
    if not paired.has_interval:
        return rf"{paired.mean:+.2f} {{\scriptsize(1 seed)}}"
    return rf"{paired.mean:+.2f} {{\scriptsize[{paired.low:+.2f}, {paired.high:+.2f}]}}"


CSV_FIELDS = ("group", "method", "variant", "seeds", "datasets")


def csv_lines(rows: Sequence[TableRow], baseline: int = 0) -> list[dict[str, Any]]:
    """One dict per row for a CSV file: every metric's mean and std over seeds, and the last metric's mean paired
    difference to the row it is compared with, its 95 % interval and the seeds it rests on (empty where none). A
    row's variant is marked with all its runs change from the recipes and presets (a CSV line stands alone)."""
    from atlas_fast.engine.deviations import table_marks

    cols = _columns(rows)
    lines = []
    for row, paired in zip(rows, paired_differences(rows, baseline)):
        variant = row.label + table_marks([row.deviations])[0]
        line: dict[str, Any] = {"group": row.group, "method": row.block, "variant": variant, "seeds": row.seeds,
                                "datasets": len(row.datasets)}
        for c in cols:
            line[c] = f"{row.metrics[c]:.4f}"
            line[f"{c}_std"] = f"{row.spread[c]:.4f}" if c in row.spread else ""
        line.update(paired_csv_fields(paired, cols[-1] if cols else ""))
        lines.append(line)
    return lines


def paired_csv_fields(paired: PairedDifference | None, metric: str) -> dict[str, str]:
    """The CSV columns of a paired difference of ``metric``: which metric, the mean difference, its 95 % interval and
    the seeds it rests on (empty for a baseline row; no interval with one seed)."""
    if paired is None:
        return {"paired_metric": "", "paired_diff": "", "ci95_low": "", "ci95_high": "", "paired_seeds": ""}
    return {"paired_metric": metric, "paired_diff": f"{paired.mean:.4f}",
            "ci95_low": f"{paired.low:.4f}" if paired.has_interval else "",
            "ci95_high": f"{paired.high:.4f}" if paired.has_interval else "", "paired_seeds": str(paired.seeds)}


def write_csv(rows: Sequence[TableRow], path: str | Path, baseline: int = 0) -> Path:
    """:func:`csv_lines` written to ``path``."""
    import csv

    lines = csv_lines(rows, baseline)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]) if lines else list(CSV_FIELDS))
        writer.writeheader()
        writer.writerows(lines)
    return path


# Paper figures: no baked-in title (the caption goes in the paper), every font at least 8 pt at the saved size.
PLOT_STYLE = {"font.size": 9, "axes.labelsize": 9, "axes.titlesize": 9, "xtick.labelsize": 8, "ytick.labelsize": 8,
              "legend.fontsize": 8, "figure.titlesize": 9, "pdf.fonttype": 42}  # 42: TrueType, editable text
PLOT_FORMATS = ("png", "pdf")


def _pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _new_figure(figsize: tuple[float, float], columns: int | None = None):
    """A figure in :data:`PLOT_STYLE`; with ``columns``, a row of axes."""
    plt = _pyplot()
    with plt.rc_context(PLOT_STYLE):
        if columns is None:
            return plt.subplots(figsize=figsize)
        fig, axes = plt.subplots(1, columns, figsize=figsize, squeeze=False)
        return fig, list(axes[0])


def _formats(path: Path, formats: Sequence[str] | None) -> list[str]:
    """The formats to write: ``formats``, or the path's own suffix and PDF (a PNG to look at, a PDF for the paper)."""
    if formats is None:
        formats = [path.suffix.lstrip(".") or "png", *PLOT_FORMATS]
    return list(dict.fromkeys(f.lower().lstrip(".") for f in formats))


def _save(fig, path: str | Path, formats: Sequence[str] | None = None) -> Path:
    """Write the figure once per format (same stem: ``x.png`` and ``x.pdf`` by default) and free it; returns
    ``path``."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with plt.rc_context(PLOT_STYLE):
        fig.tight_layout()
        for fmt in _formats(path, formats):
            fig.savefig(path.with_suffix(f".{fmt}"), dpi=200)
    plt.close(fig)
    return path


def save_figure(fig, path: str | Path, formats: Sequence[str] | None = None) -> Path:
    """Save a figure made here (and adjusted by the caller) as ``path`` and a PDF of the same stem, then free it."""
    return _save(fig, path, formats)


def _zoomed_label(ax, label: str) -> str:
    """A line plot's y label that says where its axis starts when it does not start at 0."""
    low, high = ax.get_ylim()
    if low <= 0:
        return label
    ax.set_ylim(math.floor(low), high)
    return f"{label}, axis from {math.floor(low)}"


def rows_figure(rows: Sequence[TableRow], title: str | None = None):
    """Grouped bars (one group per metric, one bar per row, seed std as error bars) on an axis from 0 to 100, with
    the values printed on the bars while there are few enough of them to read; returns the figure."""
    cols = _columns(rows)
    width = 0.8 / max(1, len(rows))
    with _pyplot().rc_context(PLOT_STYLE):
        fig, ax = _new_figure((min(7.0, 2.6 + len(cols) * (0.3 * len(rows) + 0.4)), 3.0))
        for i, row in enumerate(rows):
            xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(cols))]
            values = [row.metrics[c] for c in cols]
            errors = [row.spread.get(c, 0.0) if row.seeds > 1 else 0.0 for c in cols]
            bars = ax.bar(xs, values, width, yerr=errors, capsize=2, label=display_label(row))
            if len(rows) <= 4:
                for bar, value in zip(bars, values):
                    ax.annotate(f"{value:.1f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), fontsize=8,
                                ha="center", va="bottom", xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(cols)), cols)
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 105 if len(rows) <= 4 else 100)  # bars start at 0; room for the printed values
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        if title:
            ax.set_title(title)
    return fig


def plot_rows(rows: Sequence[TableRow], path: str | Path, title: str | None = None,
              formats: Sequence[str] | None = None) -> Path:
    """:func:`rows_figure` saved as ``path`` and a PDF of the same stem (or ``formats``, e.g. ``["pdf"]``)."""
    return _save(rows_figure(rows, title), path, formats)


def epoch_curves(records: Iterable[dict[str, Any]], metric: str = "new",
                 label=variant_label) -> dict[str, list[float]]:
    """Accuracy over epochs (runs trained with ``eval_every_epoch``), mean over seeds (and datasets) per variant."""
    runs: dict[str, list[list[float]]] = defaultdict(list)
    for record in records:
        points = [e["accuracy"][metric] for e in record["epochs"] if "accuracy" in e]
        if points:
            runs[label(record["config"])].append(points)
    if not runs:
        raise ValueError("No per-epoch accuracy in these records: train with eval_every_epoch=True.")
    return {name: [statistics.fmean(r[e] for r in curves) for e in range(min(len(r) for r in curves))]
            for name, curves in runs.items()}


def curves_figure(curves: dict[str, Sequence[float]], metric: str = "new",
                  panels: Sequence[Sequence[str]] | None = None, title: str | None = None):
    """Accuracy over epochs per named curve (:func:`epoch_curves`), one axes per panel; the y axis is zoomed to
    the data and its label says where it starts."""
    panels = panels or [list(curves)]
    with _pyplot().rc_context(PLOT_STYLE):
        fig, axes = _new_figure((min(7.0, 3.4 * len(panels)), 2.8), columns=len(panels))
        for ax, names in zip(axes, panels):
            for name in names:
                if name in curves:
                    ax.plot(range(1, len(curves[name]) + 1), curves[name], label=name)
            ax.set_xlabel("epoch")
            ax.set_ylabel(_zoomed_label(ax, f"{metric} accuracy (%)"))
            ax.legend()
        if title:
            fig.suptitle(title)
    return fig


def plot_curves(records: Iterable[dict[str, Any]], path: str | Path, metric: str = "new",
                label=variant_label, panels: Sequence[Sequence[str]] | None = None, title: str | None = None,
                formats: Sequence[str] | None = None) -> Path:
    """Accuracy over epochs, mean over seeds per variant; ``panels`` (lists of labels) draws side-by-side subplots,
    e.g. ``[["CoOp", "+ LS", "+ ATLaS"], ["CoOp", "+ CSL", "+ ATLaS-CSL"]]``. Saved as ``path`` and a PDF."""
    return _save(curves_figure(epoch_curves(records, metric, label), metric, panels, title), path, formats)


def series_figure(xs: Sequence[float], series: dict[str, Sequence[float]], xlabel: str,
                  ylabel: str = "accuracy (%)", title: str | None = None, log_x: bool = False, log_y: bool = False):
    """Line plot of several named series over the same x values (ticks at those values; ``log_x``: a log2 x axis,
    for shot counts); the y axis is zoomed to the data and its label says where it starts (``log_y``: a log10 y axis
    instead, for ratios spanning decades)."""
    with _pyplot().rc_context(PLOT_STYLE):
        fig, ax = _new_figure((3.6, 2.8))
        for name, ys in series.items():
            ax.plot(list(xs)[:len(ys)], list(ys), marker="o", markersize=3, label=name)
        if log_x:
            ax.set_xscale("log", base=2)
        if len(xs) <= 12:
            ax.set_xticks(list(xs), [f"{x:g}" for x in xs])
            ax.minorticks_off()
        ax.set_xlabel(xlabel)
        if log_y:
            ax.set_yscale("log")
            ax.set_ylabel(ylabel)
        else:
            ax.set_ylabel(_zoomed_label(ax, ylabel))
        if title:
            ax.set_title(title)
        ax.legend()
    return fig


def plot_series(xs: Sequence[float], series: dict[str, Sequence[float]], path: str | Path, xlabel: str,
                ylabel: str = "accuracy (%)", title: str | None = None, formats: Sequence[str] | None = None,
                log_x: bool = False, log_y: bool = False) -> Path:
    """:func:`series_figure` (few-shot curves, sensitivity sweeps) saved as ``path`` and a PDF."""
    return _save(series_figure(xs, series, xlabel, ylabel, title, log_x, log_y), path, formats)


def plot_soft_label_case_study(images: Sequence[Any], titles: Sequence[str], rows: dict[str, Any],
                               classnames: Sequence[str], path: str | Path, top_k: int = 5,
                               formats: Sequence[str] | None = None) -> Path:
    """One line per image: the image (named above it), then for each soft-label kind (e.g. CSL, ISL) its ``top_k``
    largest entries as a heat-map strip labelled with class names and values. ``rows[kind]`` is an (N, C) tensor or
    array. Saved as ``path`` and a PDF."""
    import numpy as np

    kinds = list(rows)
    plt = _pyplot()
    with plt.rc_context(PLOT_STYLE):
        fig, grid = plt.subplots(len(images), 1 + len(kinds), figsize=(2.0 + 3.4 * len(kinds), 2.0 * len(images)),
                                 squeeze=False, gridspec_kw={"width_ratios": [1] + [2.4] * len(kinds)})
        for n, (image, title) in enumerate(zip(images, titles)):
            grid[n][0].imshow(image)
            grid[n][0].set_title(title, fontsize=8)
            grid[n][0].axis("off")
            for ax, kind in zip(grid[n][1:], kinds):
                values = np.asarray(rows[kind][n], dtype=float)
                top = np.argsort(-values)[:top_k]
                ax.imshow(values[top][None, :], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
                for j, c in enumerate(top):
                    ax.text(j, 0, f"{values[c]:.2f}", ha="center", va="center", fontsize=8,
                            color="black" if values[c] > 0.5 else "white")
                ax.set_xticks(range(len(top)), [classnames[c].replace("_", " ")[:14] for c in top], rotation=35,
                              ha="right", fontsize=8)
                ax.set_yticks([])
                ax.set_title(kind)
    return _save(fig, path, formats)
