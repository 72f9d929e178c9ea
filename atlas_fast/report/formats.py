"""A results table's rows (:mod:`atlas_fast.report.rows`) written for a paper: Markdown, booktabs LaTeX and CSV,
and the lines ``atlas-fast train`` and ``eval`` print.

The outputs are described in docs/experiments.md (section Reports). The table's notes (:func:`table_notes`) close
the Markdown table and the LaTeX caption alike; what all rows' runs change alike from their recipes and presets is
marked once, the rest after each row's name, every CSV line in full (:func:`atlas_fast.engine.deviations.table_marks`).
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any, Iterable, Sequence

from atlas_fast.report.rows import AVERAGE, TableRow, best_cells, metric_columns, paired_differences, reference_rows
from atlas_fast.report.stats import PairedDifference, counted, interval_note

# The engine (torch) is imported by the functions that need it, so that importing this module (as the experiment
# modules do to build their command line) stays light.


def train_results(dataset: str, methods: Sequence[str], seeds: Sequence[int], records: Sequence[dict[str, Any]]) -> str:
    """What ``atlas-fast train`` prints: a line per run (its metrics, zero-shot CLIP's, the record's path), then a
    Markdown table per method of the mean ± population std over seeds (H of the mean base and new, without ±)."""
    from atlas_fast.engine.deviations import run_name
    from atlas_fast.engine.evaluate import harmonic_mean

    lines, table = [], []
    for method in methods:
        runs = [r for r in records if r["config"]["method"] == method]
        name = run_name(runs[0]["config"])
        rows, columns = [], ()
        for seed, record in zip(seeds, runs):
            metrics = record["metrics"]
            # base/new/H in base-to-new; otherwise (and for class-specific context) the trained class set only
            columns = ("base", "new", "H") if "new" in metrics and "base" in metrics else (record["config"]["subsample"],)
            values = "  ".join(f"{c} {metrics[c]:.2f}" for c in columns)
            zero_shot = "  ".join(f"{c} {metrics['zero_shot'][c]:.2f}" for c in columns)
            note = " (existing record, skipped)" if record.get("skipped") else ""
            lines.append(f"{dataset} {name} seed {seed}: {values}  | zero-shot CLIP: {zero_shot}{note}\n"
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
        table.append((name, columns, cells))
    seed_list = ",".join(str(s) for s in seeds)
    for i, (name, columns, cells) in enumerate(table):
        if i == 0 or columns != table[i - 1][1]:
            lines += ["", f"| dataset | method | seeds | {' | '.join(columns)} |",
                      "|---|---|---|" + "---:|" * len(columns)]
        lines.append(f"| {dataset} | {name} | {seed_list} | {' | '.join(cells[c] for c in columns)} |")
    lines += ["", "Mean ± population std over seeds" + ("; H from the mean base and new accuracies" if any(
        "H" in columns for _, columns, _ in table) else "") + ("; [...]: what the run changes from its method's "
              "recipe and the paper's presets" if any(" [" in name for name, _, _ in table) else "") + "."]
    return "\n".join(lines)


def eval_result_line(result: dict[str, Any], record: str | Path) -> str:
    """What ``atlas-fast eval`` prints for one saved run tested on a dataset (:func:`atlas_fast.engine.evaluate_saved`)."""
    figures = result.get("calibration") or {}
    calibration = (f"  | ECE {figures['ece']:.2f}, NLL {figures['nll']:.3f}" if "ece" in figures else "") + (
        f" (after T = {figures['temperature']:.3g}: ECE {figures['ece_ts']:.2f})" if "ece_ts" in figures else "")
    return (f"{result['dataset']} ({result['subsample']}, {result['num_classes']} classes, {result['num_test']} "
            f"test images): accuracy {result['accuracy']:.2f}{calibration}  | zero-shot CLIP "
            f"{result['zero_shot']:.2f}  <- {record}" + (
                f"\n  predictions: {result['predictions']}" if result.get("predictions") else ""))


def deviation_sentences(table_note: str, row_marks: Iterable[str], in_title: bool = True) -> list[str]:
    """The sentences below a table that explain its marks (none when nothing is marked); ``in_title``: the title
    shows ``table_note`` (else the sentence names it)."""
    from atlas_fast.engine.deviations import deviation_legend

    return ([deviation_legend(table_note, in_title)] if table_note else []) + (
        [deviation_legend()] if any(row_marks) else [])


def _row_marks(rows: Sequence[TableRow]) -> tuple[str, list[str]]:
    from atlas_fast.engine.deviations import table_marks

    return table_marks([row.deviations for row in rows])


def _seed_note(rows: Sequence[TableRow]) -> str:
    low, high = min(r.seeds for r in rows), max(r.seeds for r in rows)
    return counted(low, "seed") if low == high else f"{low} to {high} seeds (rows differ)"


def _paired_columns(rows: Sequence[TableRow], baseline: int, metrics: Sequence[str] | None = None
                    ) -> tuple[list[tuple[str, list[PairedDifference | None]]], str]:
    """The paired-difference columns of a table, one per metric of ``metrics`` (default: the last column), each
    (header, cells), and their note; ``([], "")`` when no row has one."""
    cols = metric_columns(rows)
    columns, present = [], []
    for metric in (metrics if metrics is not None else cols[-1:]):
        paired = paired_differences(rows, baseline, metric)
        shown = [p for p in paired if p is not None]
        if shown:
            columns.append((metric, paired))
            present += shown
    if not present:
        return [], ""
    low, high = min(p.seeds for p in present), max(p.seeds for p in present)
    seeds = f"{low}" if low == high else f"{low} to {high}"
    blocked = any(row.section or row.block for row in rows)
    note = interval_note(high, "the first row of the method's block" if blocked else "the baseline row")
    if low != high:
        note += f" (rows rest on {seeds} seeds)"
    intervals = any(p.has_interval for p in present)
    return [(f"Δ{metric}" + (" (95 % CI)" if intervals else ""), paired) for metric, paired in columns], note


def number(value: float, digits: int = 2) -> str:
    """A table's number, or "–" for a value the records do not hold (NaN: e.g. the calibration of a record written
    before records held it)."""
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def table_notes(rows: Sequence[TableRow], baseline: int = 0, in_title: bool = False,
                paired: Sequence[str] | None = None) -> list[str]:
    """The sentences that say what the table's cells are (one list for the Markdown's closing line and the LaTeX
    caption): over how many seeds and datasets, what ± is (only where a cell shows one), how H is made, what the
    changes and paired differences compare (an interval only where there are seeds for one) and what the marks mean
    (``in_title``: the title shows the marks all rows share)."""
    cols = metric_columns(rows)
    sectioned = any(row.section for row in rows)
    _, paired_note = _paired_columns(rows, baseline, paired)
    table_note, marks = _row_marks(rows)
    datasets = sorted({d for r in rows for d in r.datasets})
    notes = [f"Mean over {_seed_note(rows)} per dataset"
             + (f", then over {counted(len(datasets), 'dataset')}" if len(datasets) > 1 and not sectioned else "")
             + f" ({', '.join(datasets)})"]
    if any(row.section == AVERAGE for row in rows):
        notes.append("an Average row is the mean of the per-dataset means"
                     + (" (its ± the mean of their stds)" if any(row.seeds > 1 for row in rows) else ""))
    if any(row.seeds > 1 and row.spread for row in rows):
        notes.append("± = population std over seeds")
    if "H" in cols:
        notes.append("H from the mean base and new accuracies")
    if any(math.isnan(row.metrics[c]) for row in rows for c in cols):
        notes.append("– = not in the records (written before records held it)")
    if sectioned and any(ref is not None for ref in reference_rows(rows, baseline)):
        notes.append("(change) against the first row of the method's block")
    if paired_note:
        notes.append(paired_note)
    return notes + deviation_sentences(table_note, marks, in_title=in_title)


def markdown_table(rows: Sequence[TableRow], title: str = "", baseline: int = 0,
                   paired: Sequence[str] | None = None) -> str:
    """A Markdown table; the last metric column carries the change against ``rows[baseline]`` (or the block's first
    row). Rows with a ``section`` get a first column naming it; :func:`table_notes` close it. ``paired``: the metrics
    that get a paired-difference column (default: the last one)."""
    if not rows:
        return "(no results)"
    cols = metric_columns(rows)
    sectioned = any(row.section for row in rows)
    paired_columns, _ = _paired_columns(rows, baseline, paired)
    table_note, marks = _row_marks(rows)
    heads = cols + [head for head, _ in paired_columns]
    lines = [f"**{title}{table_note}**", ""] if title else []
    lines.append(("| Dataset " if sectioned else "") + "| Method | " + " | ".join(heads) + " |")
    lines.append(("|---" if sectioned else "") + "|---|" + "---:|" * len(heads))
    for i, (row, ref) in enumerate(zip(rows, reference_rows(rows, baseline))):
        cells = []
        for c in cols:
            cell = number(row.metrics[c])
            if c in row.spread and row.seeds > 1 and not math.isnan(row.spread[c]):
                cell += f" ± {row.spread[c]:.2f}"
            change = row.metrics[c] - rows[ref].metrics[c] if ref is not None else math.nan
            if c == cols[-1] and ref is not None and not math.isnan(change):
                cell += f" ({change:+.2f})"
            cells.append(cell)
        cells += [cells_of[i].cell() if cells_of[i] is not None else "" for _, cells_of in paired_columns]
        lines.append((f"| {row.section} " if sectioned else "") + f"| {row.name}{marks[i]} | " + " | ".join(cells) + " |")
    lines += ["", "; ".join(table_notes(rows, baseline, in_title=bool(title), paired=paired)) + "."]
    return "\n".join(lines)


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "±": r"$\pm$", "×": r"$\times$", "−": "-", "–": "--", "—": "---", "→": r"$\rightarrow$",
                  "≤": r"$\leq$", "≥": r"$\geq$", "…": r"\ldots{}", "·": r"$\cdot$", "°": r"$^\circ$",
                  "’": "'", "‘": "`", "“": "``", "”": "''", "²": r"$^2$", "√": r"$\surd$",
                  "Δ": r"$\Delta$", "σ": r"$\sigma$", "κ": r"$\kappa$", "θ": r"$\theta$", "τ": r"$\tau$",
                  "α": r"$\alpha$", "β": r"$\beta$", "γ": r"$\gamma$", "δ": r"$\delta$", "ε": r"$\epsilon$",
                  "λ": r"$\lambda$", "μ": r"$\mu$", "π": r"$\pi$", "ρ": r"$\rho$", "ω": r"$\omega$"}


def latex_escape(text: str) -> str:
    """``text`` as pure-ASCII LaTeX that plain pdflatex compiles: its special characters escaped, ±, Δ, the Greek
    letters and the other symbols the tables use in math mode, accented letters as their base letter (``é`` ->
    ``e``), and any other non-ASCII character as ``?`` (never a byte pdflatex stops on)."""
    import unicodedata

    out = []
    for ch in text:
        if ch in _LATEX_SPECIAL:
            out.append(_LATEX_SPECIAL[ch])
        elif ch.isascii():
            out.append(ch)
        else:
            plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            out.append("".join(_LATEX_SPECIAL.get(c, c) for c in plain) or "?")
    return "".join(out)


def latex_label(text: str) -> str:
    """A ``\\label`` key from a name or caption: ``tab:`` and at most six lower-case words joined by ``-``."""
    words = re.findall(r"[a-z0-9]+", text.lower())[:6]
    return "tab:" + ("-".join(words) or "results")


def latex_table(rows: Sequence[TableRow], caption: str = "", baseline: int = 0, label: str | None = None,
                paired: Sequence[str] | None = None) -> str:
    """A booktabs LaTeX table shaped like the paper's Table III: ``mean ± std`` cells, the last metric's change
    against the block's first row, each column's best in bold (per block), ``\\midrule`` between blocks
    (``\\cmidrule`` within a section), no vertical rules. ``label`` names the ``\\label{tab:...}`` (default: from
    the caption). Needs ``\\usepackage{booktabs}``."""
    cols = metric_columns(rows)
    sectioned = any(row.section for row in rows)
    best = best_cells(rows)
    table_note, marks = _row_marks(rows)
    notes = "; ".join(table_notes(rows, baseline, paired=paired))  # what the cells are; the shared marks
    full_caption = (caption.rstrip(".") + ". " if caption else "") + notes[:1].upper() + notes[1:] + "."
    paired_columns, _ = _paired_columns(rows, baseline, paired)
    body = []
    previous: tuple[str, str] | None = None
    for i, (row, ref) in enumerate(zip(rows, reference_rows(rows, baseline))):
        cells = []
        for c in cols:
            value = number(row.metrics[c]).replace("–", "--")
            cell = rf"\textbf{{{value}}}" if (i, c) in best else value
            if c in row.spread and row.seeds > 1 and not math.isnan(row.spread[c]):
                cell += rf" {{\scriptsize$\pm${row.spread[c]:.2f}}}"
            change = row.metrics[c] - rows[ref].metrics[c] if ref is not None else math.nan
            if c == cols[-1] and ref is not None and not math.isnan(change):
                cell += rf" {{\scriptsize({change:+.2f})}}"
            cells.append(cell)
        cells += [_latex_paired(cells_of[i]) for _, cells_of in paired_columns]
        key = (row.section, row.block)
        first_of_section = previous is None or key[0] != previous[0]
        if previous is not None and key != previous:
            width = len(cols) + 2 + len(paired_columns)
            body.append(r"    \midrule" if first_of_section or not sectioned else rf"    \cmidrule{{2-{width}}}")
        elif previous is not None and ref is None:  # a new baseline row inside a table without sections or blocks
            body.append(r"    \midrule")
        previous = key
        lead = (latex_escape(row.section) if first_of_section else "") + " & " if sectioned else ""
        body.append(f"    {lead}{latex_escape(row.name + marks[i])} & " + " & ".join(cells) + r" \\")
    heads = cols + [head for head, _ in paired_columns]
    head = ("Dataset & " if sectioned else "") + "Method & " + " & ".join(latex_escape(c) for c in heads) + r" \\"
    return "\n".join([
        r"% Requires \usepackage{booktabs} in the preamble.",
        r"\begin{table}[t]", r"  \centering", f"  \\caption{{{latex_escape(full_caption)}}}",
        f"  \\label{{{label if label and label.startswith('tab:') else latex_label(label or caption)}}}",
        r"  \begin{tabular}{" + ("ll" if sectioned else "l") + "c" * len(heads) + "}", r"    \toprule",
        f"    {head}", r"    \midrule", *body, r"    \bottomrule",
        r"  \end{tabular}", r"\end{table}"])


def _latex_paired(paired: PairedDifference | None) -> str:
    """A paired-difference cell: ``+1.23 {\\scriptsize[+0.40, +2.06]}`` (empty for a baseline row)."""
    if paired is None:
        return ""
    if not paired.has_interval:
        return rf"{paired.mean:+.2f} {{\scriptsize(1 seed)}}"
    return rf"{paired.mean:+.2f} {{\scriptsize[{paired.low:+.2f}, {paired.high:+.2f}]}}"


# A row's section is the CSV's "group" column (the name it had when the section was called a group).
CSV_FIELDS = ("group", "method", "variant", "seeds", "datasets")


def csv_lines(rows: Sequence[TableRow], baseline: int = 0, paired: Sequence[str] | None = None
              ) -> list[dict[str, Any]]:
    """One dict per row for a CSV file: every metric's mean and std over seeds, and the paired difference to the
    compared row of each metric of ``paired`` (default the last; beyond one, as ``<metric> diff`` / ``ci95_low`` /
    ``ci95_high`` / ``seeds``), with its 95 % interval and seeds. A row's variant carries all its marks (a CSV line
    stands alone); a value the records lack is empty."""
    from atlas_fast.engine.deviations import table_marks

    cols = metric_columns(rows)
    lines = []
    for row, paired_row in zip(rows, paired_differences(rows, baseline)):
        variant = row.name + table_marks([row.deviations])[0]
        line: dict[str, Any] = {"group": row.section, "method": row.block, "variant": variant, "seeds": row.seeds,
                                "datasets": len(row.datasets)}
        for c in cols:
            line[c] = "" if math.isnan(row.metrics[c]) else f"{row.metrics[c]:.4f}"
            line[f"{c}_std"] = f"{row.spread[c]:.4f}" if c in row.spread and not math.isnan(row.spread[c]) else ""
        if paired is None:
            line.update(paired_csv_fields(paired_row, cols[-1] if cols else ""))
        lines.append(line)
    if paired is not None:
        for metric in paired:
            for line, each in zip(lines, paired_differences(rows, baseline, metric)):
                fields = paired_csv_fields(each, metric)
                line.update({f"{metric} diff": fields["paired_diff"], f"{metric} ci95_low": fields["ci95_low"],
                             f"{metric} ci95_high": fields["ci95_high"], f"{metric} seeds": fields["paired_seeds"]})
    return lines


def paired_csv_fields(paired: PairedDifference | None, metric: str) -> dict[str, str]:
    """The CSV columns of a paired difference of ``metric``: which metric, the mean difference, its 95 % interval and
    the seeds it rests on (empty for a baseline row; no interval with one seed)."""
    if paired is None:
        return {"paired_metric": "", "paired_diff": "", "ci95_low": "", "ci95_high": "", "paired_seeds": ""}
    return {"paired_metric": metric, "paired_diff": f"{paired.mean:.4f}",
            "ci95_low": f"{paired.low:.4f}" if paired.has_interval else "",
            "ci95_high": f"{paired.high:.4f}" if paired.has_interval else "", "paired_seeds": str(paired.seeds)}


def write_csv_lines(path: str | Path, lines: Sequence[dict[str, Any]], fields: Sequence[str]) -> Path:
    """``lines`` (dicts with the same keys) as a CSV file at ``path``, its folder made where needed; the header is
    the first line's keys (``fields`` when there is no line)."""
    import csv

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]) if lines else list(fields))
        writer.writeheader()
        writer.writerows(lines)
    return path


def write_csv(rows: Sequence[TableRow], path: str | Path, baseline: int = 0,
              paired: Sequence[str] | None = None) -> Path:
    """:func:`csv_lines` written to ``path``."""
    return write_csv_lines(path, csv_lines(rows, baseline, paired), CSV_FIELDS)
