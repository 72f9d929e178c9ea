"""Fig. 1: new-class test accuracy over training of CoOp, + vanilla LS, + TF-KD, + OLS and + ATLaS (base-to-new).

    atlas-fast experiment fig1_label_smoothing --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

The paper trains on the base classes of ImageNet and evaluates the new classes after every epoch. LS is vanilla
label smoothing every epoch (θ = 0.1), ATLaS alternates it with one-hot labels (K = 2); TF-KD (a = 0.9, α = 0.1,
τ = 20) and OLS (α = 0.5) use their authors' settings (see :mod:`atlas_fast.atlas.schedules`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import BASE_NEW, base_config, publish
from atlas_fast.report.figures import plot_curves
from atlas_fast.report.formats import deviation_sentences
from atlas_fast.report.rows import deviation_marks, epoch_curves, strategy_name
from atlas_fast.world.benchmark import CROSS_SOURCE

if TYPE_CHECKING:
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.engine import TrainConfig

PAPER = "Fig. 1"
DATASETS = ("ImageNet",)
WORLD_DEFAULTS = {"datasets": [CROSS_SOURCE]}  # --world: the world's ImageNet


def variants() -> list[LabelVariant]:
    from atlas_fast.atlas.variants import label_variant

    return [label_variant("base2new", "none"), label_variant("base2new", "ls", period=1),
            label_variant("base2new", "none", "tfkd"), label_variant("base2new", "none", "ols"),
            label_variant("base2new", "ls")]


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.sweep import grid_configs

    return grid_configs(base_config(args, "base2new", eval_every_epoch=True, evaluate=BASE_NEW), args.datasets,
                        variants(), args.seeds)


def curve_table(records: list[dict], metric: str) -> str:
    """Final and best accuracy (and the best epoch) of each strategy's curve (mean over seeds), marked with what its
    runs change from the recipe and the paper's presets (K = 1 is in the name: ``+ LS`` is LS every epoch)."""
    curves = epoch_curves(records, metric, strategy_name)
    runs: dict[str, list[dict]] = {}
    for record in records:
        runs.setdefault(strategy_name(record["config"]), []).append(record)
    table_note, marks = deviation_marks(runs, leave_out={"schedule.period"})
    lines = [f"| Method | final {metric} | best {metric} | best epoch |", "|---|---:|---:|---:|"]
    for name, values in curves.items():
        best = max(range(len(values)), key=values.__getitem__)
        lines.append(f"| {name}{marks[name]} | {values[-1]:.2f} | {values[best]:.2f} | {best + 1} |")
    sentences = deviation_sentences(table_note, marks.values(), in_title=False)
    return "\n".join(lines + (["", "; ".join(sentences) + "."] if sentences else []))


def report(args: argparse.Namespace, records: list[dict]) -> str:
    table = curve_table(records, "new")
    plot_curves(records, Path(args.out) / "fig1_label_smoothing.png", "new", strategy_name)
    return publish(args.out, "fig1_label_smoothing.md", table)
