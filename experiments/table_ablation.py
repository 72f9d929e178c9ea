"""Ablation table: soft labels alone (every epoch), jointly with y (two CE terms), and alternating (ATLaS).

    atlas-fast experiment table_ablation --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Rows: CoOp; + vanilla LS, + vanilla LS + y, + ATLaS; the same three for CSL and for ISL (base-to-new, 16 shots).
The paper ablates CoOp only; ``--method`` runs the same rows for another text-side method (e.g. cocoop, dept-coop).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import BASE_NEW, base_config, write_table
from atlas_fast.app.catalogue import method_names
from atlas_fast.report.rows import aggregate, method_name
from atlas_fast.vocabulary import PAPER_SOFT_LABEL_KINDS
from atlas_fast.report.stats import counted

if TYPE_CHECKING:
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.engine import TrainConfig

PAPER = "Table IV (ablation)"
KINDS = PAPER_SOFT_LABEL_KINDS


def ablation_name(config: dict) -> str:
    """Row names of the paper's ablation table (K = 1 is 'soft labels alone')."""
    from atlas_fast.atlas.variants import ablation_row_name

    soft = (config.get("soft_labels") or {}).get("kind")
    return ablation_row_name(config["schedule"], soft) or f"{method_name(config['method'])} (baseline)"


def variants() -> list[LabelVariant]:
    from atlas_fast.atlas.variants import label_variant

    rows = [label_variant("base2new", "none")]
    for kind in KINDS:
        rows += [label_variant("base2new", kind, period=1), label_variant("base2new", kind, "joint"),
                 label_variant("base2new", kind)]
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="coop", choices=method_names(learning_only=True),
                   help="the method ablated (default coop, as in the paper)")


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.sweep import grid_configs

    return grid_configs(base_config(args, "base2new", method=args.method, evaluate=BASE_NEW), args.datasets,
                        variants(), args.seeds)


def report(args: argparse.Namespace, records: list[dict]) -> str:
    title = (f"Ablation of soft labels and alternation ({method_name(args.method)}, base-to-new, "
             f"{counted(len(args.datasets), 'dataset')})")
    rows = aggregate(records, name_of=ablation_name, leave_out={"schedule.period"})  # K = 1 is named in the rows
    return write_table(rows, "table_ablation", title, args.out)
