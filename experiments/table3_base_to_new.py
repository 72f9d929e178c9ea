"""Table III: base-to-new generalisation of CoOp, CoCoOp, DePT, IVLP and MaPLe, each plain and with ATLaS, ATLaS-CSL
and ATLaS-ISL (mean over 11 datasets).

    atlas-fast experiment table3_base_to_new --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Trains on the base classes (16 shots, seeds 1-3, the paper's K=2, θ=0.1, τ_c=0.05, α=0.1) with each method's recipe
and reports base, new and H averaged as the paper does, one block per method (``--methods``; the paper's "DePT" is
``dept-coop``; IVLP and MaPLe train on the pixel path). ``--zero-shot`` adds the zero-shot CLIP row the paper omits;
``--method-option maple:depth=3`` fits a prompt depth to a backbone with fewer blocks than the recipe's.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import BASE_NEW, PAPER_METHODS, base_config, method_args, write_table
from atlas_fast.report.rows import aggregate
from atlas_fast.report.stats import counted

if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig

PAPER = "Table III"


def add_arguments(p: argparse.ArgumentParser) -> None:
    method_args(p, PAPER_METHODS)


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.sweep import paper_variants, grid_configs

    configs = []
    if args.zero_shot:
        configs += grid_configs(base_config(args, "base2new", method="zsclip", evaluate=BASE_NEW), args.datasets,
                                [LabelVariant("zero-shot", OneHot())], args.seeds)
    for method in args.methods:
        configs += grid_configs(base_config(args, "base2new", method=method, evaluate=BASE_NEW), args.datasets,
                                paper_variants("base2new"), args.seeds)
    return configs


def report(args: argparse.Namespace, records: list[dict]) -> str:
    title = (f"Base-to-new with ATLaS (mean over {counted(len(args.datasets), 'dataset')}, "
             f"{counted(len(args.seeds), 'seed')})")
    return write_table(aggregate(records, by_method=True), "table3_base_to_new", title, args.out)
