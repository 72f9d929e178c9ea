"""Per-epoch new-class accuracy of CoOp under the LS strategies: LS / ATLaS, CSL / ATLaS-CSL, ISL / ATLaS-ISL.

    atlas-fast experiment fig5_new_class_curves --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

The paper's SUN397 figure: three panels, each CoOp against soft labels every epoch (K = 1) and alternating (ATLaS,
K = 2), trained on the base classes and evaluated on the new classes after every epoch.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import BASE_NEW, base_config, publish
from atlas_fast.experiments.fig1_label_smoothing import curve_table
from atlas_fast.report.figures import plot_curves
from atlas_fast.report.rows import strategy_name
from atlas_fast.world.benchmark import DECLINE_DATASET
from atlas_fast.vocabulary import PAPER_SOFT_LABEL_KINDS

if TYPE_CHECKING:
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.engine import TrainConfig

PAPER = "Fig. 5 (SUN397 new-class curves)"
DATASETS = ("SUN397",)
WORLD_DEFAULTS = {"datasets": [DECLINE_DATASET]}  # --world: where CoOp's new-class accuracy declines
PANELS = [["CoOp", "+ LS", "+ ATLaS"], ["CoOp", "+ CSL", "+ ATLaS-CSL"], ["CoOp", "+ ISL", "+ ATLaS-ISL"]]


def variants() -> list[LabelVariant]:
    from atlas_fast.atlas.variants import label_variant

    rows = [label_variant("base2new", "none")]
    for kind in PAPER_SOFT_LABEL_KINDS:
        rows += [label_variant("base2new", kind, period=1), label_variant("base2new", kind)]
    return rows


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.sweep import grid_configs

    return grid_configs(base_config(args, "base2new", eval_every_epoch=True, evaluate=BASE_NEW), args.datasets,
                        variants(), args.seeds)


def report(args: argparse.Namespace, records: list[dict]) -> str:
    table = curve_table(records, "new")
    plot_curves(records, Path(args.out) / "fig5_new_class_curves.png", "new", strategy_name, panels=PANELS)
    return publish(args.out, "fig5_new_class_curves.md", table)
