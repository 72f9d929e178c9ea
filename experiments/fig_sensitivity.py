"""Sensitivity figure: base / new / H of CoOp + ATLaS (θ), + ATLaS-CSL (1/τ_c), + ATLaS-ISL (α and K).

    atlas-fast experiment fig_sensitivity --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt --param alpha

Also the CSL/ISL mixing figure (``--param w``). Other hyper-parameters stay at the base-to-new presets.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import BASE_NEW, base_config, chunks, publish
from atlas_fast.report.figures import plot_series
from atlas_fast.report.formats import deviation_sentences
from atlas_fast.report.rows import aggregate, deviation_marks

if TYPE_CHECKING:
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.engine import TrainConfig

PAPER = "Fig. 6, Figs. A1-A2 (sensitivity)"
# parameter -> (soft-label kind, values as the paper sweeps them)
GRIDS = {
    "theta": ("ls", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),
    "inv_tau_c": ("csl", [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]),
    "alpha": ("isl", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),
    "K": ("isl", [1, 2, 3, 4, 5]),
    "w": ("mix", [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]),
}
# the config field each parameter sweeps: the table names it in its first column, so its marks leave it out
SWEPT_FIELDS = {"theta": "soft_labels.theta", "inv_tau_c": "soft_labels.tau_c", "alpha": "soft_labels.alpha",
                "K": "schedule.period", "w": "soft_labels.w"}


def variant(param: str, value: float) -> LabelVariant:
    from atlas_fast.atlas.variants import label_variant

    kind, _ = GRIDS[param]
    overrides = {"theta": {"theta": value}, "inv_tau_c": {"tau_c": 1.0 / value}, "alpha": {"alpha": value},
                 "K": {"period": int(value)}, "w": {"w": value}}[param]
    return label_variant("base2new", kind, **overrides)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", choices=sorted(GRIDS), required=True)
    p.add_argument("--values", type=float, nargs="+", default=None, help="default: the paper's grid")


def _values(args: argparse.Namespace) -> list[float]:
    return args.values or GRIDS[args.param][1]


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.sweep import grid_configs

    base = base_config(args, "base2new", evaluate=BASE_NEW)
    return [config for value in _values(args)
            for config in grid_configs(base, args.datasets, [variant(args.param, value)], args.seeds)]


def report(args: argparse.Namespace, records: list[dict]) -> str:
    values = _values(args)
    curves: dict[str, list[float]] = {"base": [], "new": [], "H": []}
    blocks = chunks(records, len(records) // len(values))
    for block in blocks:
        (row,) = aggregate(block)
        for metric in curves:
            curves[metric].append(row.metrics[metric])
    table_note, marks = deviation_marks(dict(enumerate(blocks)), leave_out={SWEPT_FIELDS[args.param]})
    lines = [f"| {args.param} | base | new | H |", "|---:|---:|---:|---:|"]
    lines += [f"| {v:g}{marks[i]} | {b:.2f} | {n:.2f} | {h:.2f} |"
              for i, (v, b, n, h) in enumerate(zip(values, *curves.values()))]
    sentences = deviation_sentences(table_note, marks.values(), in_title=False)
    table = "\n".join(lines + (["", "; ".join(sentences) + "."] if sentences else []))
    plot_series(values, curves, Path(args.out) / f"fig_sensitivity_{args.param}.png",
                xlabel=f"{args.param} ({GRIDS[args.param][0].upper()})", ylabel="accuracy (%)")
    return publish(args.out, f"fig_sensitivity_{args.param}.md", table)
