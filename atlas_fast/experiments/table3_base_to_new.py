"""Table III: base-to-new generalisation of CoOp with ATLaS, ATLaS-CSL and ATLaS-ISL (mean over 11 datasets).

    atlas-fast experiment table3_base_to_new --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Trains on the base classes (16 shots, seeds 1-3, the paper's K=2, θ=0.1, τ_c=0.05, α=0.1) and reports base, new and
H averaged as the paper does. (CoCoOp, DePT, IVLP and MaPLe rows come with those methods.)
"""

from __future__ import annotations

import argparse

from atlas_fast.experiments.common import base_config, write_table
from atlas_fast.report import aggregate
from atlas_fast.sweep import atlas_variants, grid_configs
from atlas_fast.train import TrainConfig

PAPER = "Table III"


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    return grid_configs(base_config(args, "base2new"), args.datasets, atlas_variants("base2new"), args.seeds)


def report(args: argparse.Namespace, records: list[dict]) -> str:
    title = f"Base-to-new, CoOp with ATLaS (mean over {len(args.datasets)} datasets, {len(args.seeds)} seeds)"
    return write_table(aggregate(records), "table3_base_to_new", title, args.out)
