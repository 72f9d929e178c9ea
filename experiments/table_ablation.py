"""Ablation table: soft labels alone (every epoch), jointly with y (two CE terms), and alternating (ATLaS).

    atlas-fast experiment table_ablation --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Rows: CoOp; + vanilla LS, + vanilla LS + y, + ATLaS; the same three for CSL and for ISL (base-to-new, 16 shots).
The paper ablates CoOp only; ``--method`` runs the same rows for another text-side method (e.g. cocoop, dept-coop).
"""

from __future__ import annotations

import argparse

from atlas_fast.experiments.common import BASE_NEW, base_config, write_table
from atlas_fast.methods.base import method_names
from atlas_fast.app.report import aggregate, method_name
from atlas_fast.atlas.schedules import Atlas, Joint, OneHot
from atlas_fast.atlas.softlabels import atlas_period, atlas_preset
from atlas_fast.sweep import Variant, grid_configs
from atlas_fast.engine import TrainConfig

PAPER = "Table IV (ablation)"
NAMES = {"ls": ("vanilla LS", "ATLaS"), "csl": ("CSL", "ATLaS-CSL"), "isl": ("ISL", "ATLaS-ISL")}


def ablation_label(config: dict) -> str:
    """Row names of the paper's ablation table (K = 1 is 'soft labels alone')."""
    schedule, soft = config["schedule"], (config.get("soft_labels") or {}).get("kind")
    if schedule["name"] == "onehot":
        return f"{method_name(config['method'])} (baseline)"
    alone, alternating = NAMES[soft]
    if schedule["name"] == "joint":
        return f"+ {alone} + y"
    return f"+ {alone}" if schedule["period"] == 1 else f"+ {alternating}"


def variants() -> list[Variant]:
    rows = [Variant("CoOp", OneHot())]
    for kind in NAMES:
        soft = atlas_preset("base2new", kind)
        rows += [Variant("alone", Atlas(1), soft), Variant("joint", Joint(), soft),
                 Variant("atlas", Atlas(atlas_period("base2new")), soft)]
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="coop", choices=method_names(learning_only=True),
                   help="the method ablated (default coop, as in the paper)")


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    return grid_configs(base_config(args, "base2new", method=args.method, evaluate=BASE_NEW), args.datasets,
                        variants(), args.seeds)


def report(args: argparse.Namespace, records: list[dict]) -> str:
    title = (f"Ablation of soft labels and alternation ({method_name(args.method)}, base-to-new, "
             f"{len(args.datasets)} datasets)")
    return write_table(aggregate(records, label=ablation_label), "table_ablation", title, args.out)
