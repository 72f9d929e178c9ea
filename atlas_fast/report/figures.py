"""Figures for a paper from a results table's rows or records: bars of the rows, accuracy over epochs, series over
a swept value, the soft-label case study.

Figures are made without a baked-in title (the caption belongs to the paper), with fonts of at least 8 pt at the
saved size, bar charts from 0 and line plots that say where a zoomed axis starts, written as PNG and PDF of the
same stem. matplotlib is imported when a figure is made.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Sequence

from atlas_fast.report.rows import TableRow, display_name, epoch_curves, metric_columns, variant_name


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
        for fmt in _formats(path, formats):  # "tight": a legend placed outside the axes is kept, not cut off
            fig.savefig(path.with_suffix(f".{fmt}"), dpi=200, bbox_inches="tight")
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


# Printed values on bars: 8 pt text needs about this many inches of bar width upright ("91.3"), or turned on its side.
_UPRIGHT_LABEL_INCHES = 0.27
_SIDEWAYS_LABEL_INCHES = 0.13


def rows_figure(rows: Sequence[TableRow], title: str | None = None):
    """Grouped bars (one group per metric, one bar per row) on an axis from 0: each value printed above its bar and
    error bar (on its side where the bar is narrow, not at all where it would overlap), the seeds' population std as
    an error bar only where a row has a spread, and the legend (row name and the marks not every row shares) below
    the axes, so long labels never squeeze the bars; returns the figure."""
    from atlas_fast.engine.deviations import table_marks

    cols = metric_columns(rows)
    count = max(1, len(rows))
    width = 0.8 / count
    _, marks = table_marks([row.deviations for row in rows])
    labels = [display_name(row) + mark for row, mark in zip(rows, marks)]
    fig_width = min(7.0, max(3.4, 0.9 + len(cols) * (0.34 * count + 0.35)))
    axes_width = fig_width - 0.8  # the y axis's label and ticks
    bar_inches = axes_width / max(1, len(cols)) * width
    sideways = bar_inches < _UPRIGHT_LABEL_INCHES
    printed = bar_inches >= _SIDEWAYS_LABEL_INCHES
    tops = []
    with _pyplot().rc_context(PLOT_STYLE):
        fig, ax = _new_figure((fig_width, 2.6))
        for i, (row, label) in enumerate(zip(rows, labels)):
            xs = [j + (i - (count - 1) / 2) * width for j in range(len(cols))]
            values = [row.metrics[c] for c in cols]
            errors = [row.spread.get(c, 0.0) if row.seeds > 1 else 0.0 for c in cols]
            bars = ax.bar(xs, values, width, label=label)
            shown = [(x, v, e) for x, v, e in zip(xs, values, errors) if e > 0]
            if shown:
                ax.errorbar([x for x, _, _ in shown], [v for _, v, _ in shown], yerr=[e for _, _, e in shown],
                            fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
            for bar, value, error in zip(bars, values, errors):
                tops.append(value + error)
                if printed:
                    ax.annotate(f"{value:.1f}", (bar.get_x() + bar.get_width() / 2, value + error), fontsize=8,
                                ha="center", va="bottom", rotation=90 if sideways else 0, xytext=(0, 2),
                                textcoords="offset points")
        ax.set_xticks(range(len(cols)), cols)
        ax.set_xlim(-0.5, len(cols) - 0.5)
        ax.set_ylabel("accuracy (%)")
        room = (24 if sideways else 13) if printed else 3  # the printed values' height, in axis units
        ax.set_ylim(0, max(100.0, max(tops, default=0.0) + room))  # bars start at 0
        ax.set_yticks(range(0, 101, 20))
        ax.spines[["top", "right"]].set_visible(False)  # no frame line for a printed value to cross
        columns = 1 if max((len(label) for label in labels), default=0) > 30 else min(count, 2)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=columns, frameon=False)
        if title:
            ax.set_title(title)
    return fig


def plot_rows(rows: Sequence[TableRow], path: str | Path, title: str | None = None,
              formats: Sequence[str] | None = None) -> Path:
    """:func:`rows_figure` saved as ``path`` and a PDF of the same stem (or ``formats``, e.g. ``["pdf"]``)."""
    return _save(rows_figure(rows, title), path, formats)


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
                name_of=variant_name, panels: Sequence[Sequence[str]] | None = None, title: str | None = None,
                formats: Sequence[str] | None = None) -> Path:
    """Accuracy over epochs, mean over seeds per variant; ``panels`` (lists of variant names) draws side-by-side subplots,
    e.g. ``[["CoOp", "+ LS", "+ ATLaS"], ["CoOp", "+ CSL", "+ ATLaS-CSL"]]``. Saved as ``path`` and a PDF."""
    return _save(curves_figure(epoch_curves(records, metric, name_of), metric, panels, title), path, formats)


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


def reliability_tables(records: Iterable[dict[str, Any]], class_set: str = "new", name_of=variant_name
                       ) -> dict[str, dict[str, list[float]]]:
    """Per label variant (first-seen order), the reliability table of ``class_set`` summed over its records (seeds
    and datasets): image ``count``, ``correct`` predictions and ``confidence_sum`` per confidence bin
    (``record["reliability"]``). Records without one are left out."""
    tables: dict[str, dict[str, list[float]]] = {}
    for record in records:
        table = (record.get("reliability") or {}).get(class_set)
        if not table:
            continue
        total = tables.setdefault(name_of(record["config"]), {k: [0.0] * len(table["count"]) for k in table})
        for key, values in table.items():
            total[key] = [a + float(b) for a, b in zip(total[key], values)]
    return tables


def reliability_figure(tables: dict[str, dict[str, list[float]]], class_set: str = "new"):
    """One column per label variant: above, the accuracy of each confidence bin (bars at the bin, the diagonal of
    perfect calibration dashed, the gap to the bin's mean confidence shaded) with the variant's ECE over the summed
    bins; below, the share of images in each bin. Returns the figure."""
    if not tables:
        raise ValueError(f"No reliability table for the {class_set!r} classes in these records (records written "
                         f"before records held calibration have none).")
    plt = _pyplot()
    columns = len(tables)
    with plt.rc_context(PLOT_STYLE):
        fig, axes = plt.subplots(2, columns, figsize=(min(7.0, 1.75 * columns + 0.4), 3.3), squeeze=False,
                                 sharex=True, gridspec_kw={"height_ratios": [3, 1]})
        for j, (name, table) in enumerate(tables.items()):
            bins = len(table["count"])
            width = 1.0 / bins
            lefts = [b * width for b in range(bins)]
            total = sum(table["count"]) or 1.0
            accuracy = [c / n if n else 0.0 for c, n in zip(table["correct"], table["count"])]
            confidence = [s / n if n else 0.0 for s, n in zip(table["confidence_sum"], table["count"])]
            ece = sum(abs(c - s) for c, s in zip(table["correct"], table["confidence_sum"])) / total
            top, bottom = axes[0][j], axes[1][j]
            top.bar(lefts, accuracy, width, align="edge", color="tab:blue", edgecolor="black", linewidth=0.4,
                    label="accuracy")
            held = [b for b in range(bins) if table["count"][b]]
            top.bar([lefts[b] for b in held], [confidence[b] - accuracy[b] for b in held], width, align="edge",
                    bottom=[accuracy[b] for b in held], color="tab:red", alpha=0.3, linewidth=0,
                    label="gap to the bin's mean confidence")
            top.plot([0, 1], [0, 1], "k--", linewidth=0.8)
            top.set_xlim(0, 1)
            top.set_ylim(0, 1)
            top.set_title(f"{name}\nECE {100 * ece:.2f}", fontsize=8)
            bottom.bar(lefts, [n / total for n in table["count"]], width, align="edge", color="gray")
            bottom.set_xlabel("confidence")
            if j == 0:
                top.set_ylabel(f"accuracy ({class_set})")
                bottom.set_ylabel("images")
            for ax in (top, bottom):
                ax.spines[["top", "right"]].set_visible(False)
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, loc="lower center", bbox_to_anchor=(0.5, -0.06), ncol=2, frameon=False, fontsize=8)
    return fig


def plot_reliability(records: Iterable[dict[str, Any]], path: str | Path, class_set: str = "new", name_of=variant_name,
                     formats: Sequence[str] | None = None) -> Path:
    """The reliability diagram of ``class_set`` per label variant (:func:`reliability_figure` of
    :func:`reliability_tables`) saved as ``path`` and a PDF of the same stem."""
    return _save(reliability_figure(reliability_tables(records, class_set, name_of), class_set), path, formats)
