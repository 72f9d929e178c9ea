"""Sensitivity figure: base / new / H of CoOp + ATLaS (θ), + ATLaS-CSL (1/τ_c), + ATLaS-ISL (α and K).

    atlas-fast experiment fig_sensitivity --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt --param alpha

Also the CSL/ISL mixing figure (``--param w``). Other hyper-parameters stay at the base-to-new presets.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import BASE_NEW, base_config, chunks, publish
from atlas_fast.report.tables import aggregate, plot_series
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


def variant(param: str, value: float) -> LabelVariant:
    from atlas_fast.atlas.variants import atlas_variant

    kind, _ = GRIDS[param]
    overrides = {"theta": {"theta": value}, "inv_tau_c": {"tau_c": 1.0 / value}, "alpha": {"alpha": value},
                 "K": {"period": int(value)}, "w": {"w": value}}[param]
    return atlas_variant("base2new", kind, **overrides)


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
    for block in chunks(records, len(records) // len(values)):
        (row,) = aggregate(block)
        for metric in curves:
            curves[metric].append(row.metrics[metric])
    lines = [f"| {args.param} | base | new | H |", "|---:|---:|---:|---:|"]
    lines += [f"| {v:g} | {b:.2f} | {n:.2f} | {h:.2f} |" for v, b, n, h in zip(values, *curves.values())]
    table = "\n".join(lines)
    plot_series(values, curves, Path(args.out) / f"fig_sensitivity_{args.param}.png",
                xlabel=f"{args.param} ({GRIDS[args.param][0].upper()})", ylabel="accuracy (%)")
    return publish(args.out, f"fig_sensitivity_{args.param}.md", table)
