"""Paper-ready tables and plots from result records (the output of :func:`atlas_fast.engine.pipeline.run`).

Aggregation follows the papers' convention (``docs/protocol.md#evaluation``): per dataset the accuracies are averaged over
seeds; the "average over datasets" row averages those means; H is computed from the averaged base and new
accuracies (not averaged per-dataset H values). Improvements are given against the row marked as the baseline.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from atlas_fast.engine.evaluate import harmonic_mean
from atlas_fast.atlas.softlabels import SOFT_LABEL_NAMES

def method_name(method: str) -> str:
    """The printed name of a registered method (``dept-coop`` -> ``DePT``, from its registry entry); unknown names
    are printed as given."""
    from atlas_fast.methods import METHODS

    return METHODS[method].printed_name if method in METHODS else method


def variant_label(config: dict[str, Any]) -> str:
    """How the paper names a run's variant: ``CoOp``, ``+ ATLaS``, ``+ ATLaS-CSL``, ``+ soft + y (ISL)``, ``+ OLS``...
    (the period K is not part of the name: pass another ``label`` function to tables that vary it)."""
    schedule = config["schedule"]["name"]
    soft = (config.get("soft_labels") or {}).get("kind")
    if schedule == "onehot":
        return method_name(config["method"])
    if schedule == "atlas":
        return f"+ {SOFT_LABEL_NAMES[soft]}"
    if schedule == "joint":
        return f"+ soft + y ({soft.upper()})"
    return {"ols": "+ OLS", "tfkd": "+ TF-KD"}.get(schedule, f"+ {schedule}")


def strategy_label(config: dict[str, Any]) -> str:
    """Names of the label-smoothing strategies compared in the paper's curves (Fig. 1, the SUN397 figure): soft
    labels every epoch (ATLaS period K = 1) are ``+ LS`` / ``+ CSL`` / ``+ ISL``, alternating ones ``+ ATLaS...``."""
    schedule = config["schedule"]
    soft = (config.get("soft_labels") or {}).get("kind")
    if schedule["name"] == "atlas" and schedule["period"] == 1:
        return f"+ {soft.upper()}"
    return variant_label(config)


@dataclass
class TableRow:
    """One method variant: metric means (over seeds, then datasets) and the per-seed spread of each metric."""

    label: str
    metrics: dict[str, float]
    spread: dict[str, float] = field(default_factory=dict)
    seeds: int = 0
    datasets: tuple[str, ...] = ()
    block: str = ""  # rows of one method share a block; each block's first row is its baseline


def aggregate(records: Iterable[dict[str, Any]], metrics: Sequence[str] = ("base", "new"),
              label=variant_label, by_method: bool = False) -> list[TableRow]:
    """Group records by variant label (first-seen order) and average as the papers do; adds H when base and new are
    present. ``spread`` is the population std over seeds (CoOp's ``parse_test_res``), averaged over datasets.
    With ``by_method`` each method's records form a block of rows (the paper's Table III: CoOp, + ATLaS, ...,
    CoCoOp, + ATLaS, ...), compared with that block's first row."""
    if by_method:
        per_method: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in records:
            per_method[record["config"]["method"]].append(record)
        rows = []
        for method, group in per_method.items():
            for row in aggregate(group, metrics, label):
                row.block = method_name(method)
                rows.append(row)
        return rows
    groups: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for record in records:
        variant = label(record["config"])
        dataset = record["config"]["dataset"]
        for name in metrics:
            groups[variant][dataset][name].append(float(record["metrics"][name]))
    rows = []
    for variant, per_dataset in groups.items():
        means = {m: statistics.fmean(statistics.fmean(d[m]) for d in per_dataset.values()) for m in metrics}
        spread = {m: statistics.fmean(statistics.pstdev(d[m]) for d in per_dataset.values()) for m in metrics}
        if "base" in means and "new" in means:
            means["H"] = harmonic_mean(means["base"], means["new"])
        seeds = min(len(next(iter(d.values()))) for d in per_dataset.values())
        rows.append(TableRow(variant, means, spread, seeds, tuple(per_dataset)))
    return rows


def _columns(rows: Sequence[TableRow]) -> list[str]:
    return list(rows[0].metrics) if rows else []


def _references(rows: Sequence[TableRow], baseline: int) -> list[int | None]:
    """Per row, the index of the row its change is measured against (None for a baseline row): the first row of its
    block when rows carry blocks, else ``rows[baseline]``."""
    if not any(row.block for row in rows):
        return [None if i == baseline else baseline for i in range(len(rows))]
    first: dict[str, int] = {}
    refs: list[int | None] = []
    for i, row in enumerate(rows):
        refs.append(first.setdefault(row.block, i))
        if refs[-1] == i:
            refs[-1] = None
    return refs


def display_label(row: TableRow) -> str:
    """A row's name outside its table (plots): ``+ ATLaS`` rows of a block are prefixed with the block's method."""
    return f"{row.block} {row.label}" if row.block and row.label.startswith("+") else row.label


def markdown_table(rows: Sequence[TableRow], title: str = "", baseline: int = 0) -> str:
    """A Markdown table; the last metric column carries the change against ``rows[baseline]`` in parentheses."""
    if not rows:
        return "(no results)"
    cols = _columns(rows)
    lines = [f"**{title}**", ""] if title else []
    lines.append("| Method | " + " | ".join(cols) + " |")
    lines.append("|---|" + "---:|" * len(cols))
    for row, ref in zip(rows, _references(rows, baseline)):
        cells = []
        for c in cols:
            cell = f"{row.metrics[c]:.2f}"
            if c in row.spread and row.seeds > 1:
                cell += f" ± {row.spread[c]:.2f}"
            if c == cols[-1] and ref is not None:
                cell += f" ({row.metrics[c] - rows[ref].metrics[c]:+.2f})"
            cells.append(cell)
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    seeds = min(r.seeds for r in rows)
    datasets = sorted({d for r in rows for d in r.datasets})
    lines.append("")
    lines.append(f"Mean over {seeds} seed(s) per dataset{', then over ' + str(len(datasets)) + ' datasets' if len(datasets) > 1 else ''}"
                 f" ({', '.join(datasets)}); ± = std over seeds; H from the mean base and new accuracies.")
    return "\n".join(lines)


def latex_table(rows: Sequence[TableRow], caption: str = "", baseline: int = 0) -> str:
    """A booktabs LaTeX table shaped like the paper's Table III (Methods | metrics, improvement of the last)."""
    cols = _columns(rows)
    body = []
    for i, (row, ref) in enumerate(zip(rows, _references(rows, baseline))):
        cells = [f"{row.metrics[c]:.2f}" for c in cols]
        if ref is not None:
            cells[-1] += f" ({{{row.metrics[cols[-1]] - rows[ref].metrics[cols[-1]]:+.2f}}})"
        if i and ref is None:
            body.append(r"    \midrule")
        body.append(f"    {row.label} & " + " & ".join(cells) + r" \\")
    return "\n".join([
        r"\begin{table}[t]", r"  \centering", f"  \\caption{{{caption}}}",
        r"  \begin{tabular}{l|" + "c" * len(cols) + "}", r"    \toprule",
        "    Method & " + " & ".join(cols) + r" \\", r"    \midrule", *body, r"    \bottomrule",
        r"  \end{tabular}", r"\end{table}"])


def _new_figure(figsize: tuple[float, float], columns: int | None = None):
    """A matplotlib figure on the file-only Agg backend (no display needed); with ``columns``, a row of axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if columns is None:
        return plt.subplots(figsize=figsize)
    fig, axes = plt.subplots(1, columns, figsize=figsize, squeeze=False)
    return fig, list(axes[0])


def _save(fig, path: str | Path) -> Path:
    """Write the figure (format from the suffix: .png, .pdf, .svg) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=160)
    plt.close(fig)
    return path


def plot_rows(rows: Sequence[TableRow], path: str | Path, title: str = "") -> Path:
    """Grouped bars (one group per metric, one bar per variant) with seed std as error bars, saved as PNG/PDF."""
    cols = _columns(rows)
    width = 0.8 / max(1, len(rows))
    fig, ax = _new_figure((3.2 + 1.4 * len(cols) + 0.3 * len(rows), 3.2))
    for i, row in enumerate(rows):
        xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(cols))]
        values = [row.metrics[c] for c in cols]
        errors = [row.spread.get(c, 0.0) for c in cols]
        bars = ax.bar(xs, values, width, yerr=errors, capsize=2, label=display_label(row))
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:.1f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), fontsize=6,
                        ha="center", va="bottom", xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_ylabel("accuracy (%)")
    low = min(r.metrics[c] for r in rows for c in cols)
    ax.set_ylim(max(0.0, low - 10), 100)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    return _save(fig, path)


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


def plot_curves(records: Iterable[dict[str, Any]], path: str | Path, metric: str = "new",
                label=variant_label, panels: Sequence[Sequence[str]] | None = None, title: str = "") -> Path:
    """Accuracy over epochs, mean over seeds per variant; ``panels`` (lists of labels) draws side-by-side subplots,
    e.g. ``[["CoOp", "+ LS", "+ ATLaS"], ["CoOp", "+ CSL", "+ ATLaS-CSL"]]``."""
    curves = epoch_curves(records, metric, label)
    panels = panels or [list(curves)]
    fig, axes = _new_figure((4.2 * len(panels), 3.2), columns=len(panels))
    for ax, names in zip(axes, panels):
        for name in names:
            if name in curves:
                ax.plot(range(1, len(curves[name]) + 1), curves[name], label=name)
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"{metric} accuracy (%)")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def plot_series(xs: Sequence[float], series: dict[str, Sequence[float]], path: str | Path, xlabel: str,
                ylabel: str = "accuracy (%)", title: str = "") -> Path:
    """Line plot of several named series over the same x values (few-shot curves, sensitivity sweeps)."""
    fig, ax = _new_figure((4.5, 3.2))
    for name, ys in series.items():
        ax.plot(list(xs)[:len(ys)], list(ys), marker="o", markersize=3, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_soft_label_case_study(images: Sequence[Any], titles: Sequence[str], rows: dict[str, Any],
                               classnames: Sequence[str], path: str | Path, top_k: int = 5) -> Path:
    """One line per image: the image, then for each soft-label kind (e.g. CSL, ISL) its ``top_k`` largest entries
    as a heat-map strip labelled with class names and values. ``rows[kind]`` is an (N, C) tensor or array."""
    import numpy as np

    kinds = list(rows)
    _new_figure((1, 1))  # selects the Agg backend
    import matplotlib.pyplot as plt

    plt.close("all")
    fig, grid = plt.subplots(len(images), 1 + len(kinds), figsize=(2.0 + 3.4 * len(kinds), 1.9 * len(images)),
                             squeeze=False, gridspec_kw={"width_ratios": [1] + [2.4] * len(kinds)})
    for n, (image, title) in enumerate(zip(images, titles)):
        grid[n][0].imshow(image)
        grid[n][0].set_title(title, fontsize=7)
        grid[n][0].axis("off")
        for ax, kind in zip(grid[n][1:], kinds):
            values = np.asarray(rows[kind][n], dtype=float)
            top = np.argsort(-values)[:top_k]
            ax.imshow(values[top][None, :], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            for j, c in enumerate(top):
                ax.text(j, 0, f"{values[c]:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if values[c] > 0.5 else "white")
            ax.set_xticks(range(len(top)), [classnames[c].replace("_", " ")[:14] for c in top], rotation=35,
                          ha="right", fontsize=6)
            ax.set_yticks([])
            ax.set_title(kind, fontsize=8)
    return _save(fig, path)
