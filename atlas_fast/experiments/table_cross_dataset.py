"""Tables I and II: cross-dataset transfer and domain generalisation of CoOp with ATLaS (trained on ImageNet).

    atlas-fast experiment table_cross_dataset --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Trains on ImageNet (all 1000 classes, 16 shots, the cross-dataset presets K=3, θ=0.1, τ_c=0.04, α=1.0), then
evaluates each run's learned context on the full test split of every target (``--targets``: the 10 other datasets
and ImageNetV2/-Sketch/-A/-R by default). Cells are means over seeds.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from atlas_fast.evaluate import evaluate_record
from atlas_fast.experiments.common import ELEVEN, base_config, publish
from atlas_fast.report import variant_label
from atlas_fast.sweep import atlas_variants, grid_configs
from atlas_fast.train import TrainConfig

PAPER = "Tables I and II"
DATASETS = ("ImageNet",)
TARGETS = ELEVEN[1:] + ("ImageNetV2", "ImageNetSketch", "ImageNetA", "ImageNetR")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--targets", nargs="+", default=list(TARGETS))


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    return grid_configs(base_config(args, "cross_dataset"), args.datasets, atlas_variants("cross_dataset"),
                        args.seeds)


def report(args: argparse.Namespace, records: list[dict]) -> str:
    cells: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        label = variant_label(record["config"])
        cells[label]["source"].append(record["metrics"]["all"])
        for target in args.targets:
            result = evaluate_record(record["path"], target, args.data_root, cache_root=args.cache_root,
                                     device=args.device, progress=False)
            cells[label][target].append(result["accuracy"])
    columns = ["source"] + list(args.targets)
    lines = ["| Method | " + " | ".join(columns) + " | target mean |", "|---|" + "---:|" * (len(columns) + 1)]
    for label, per_column in cells.items():
        means = [statistics.fmean(per_column[c]) for c in columns]
        lines.append(f"| {label} | " + " | ".join(f"{m:.2f}" for m in means)
                     + f" | {statistics.fmean(means[1:]) if len(means) > 1 else float('nan'):.2f} |")
    table = "\n".join(lines)
    return publish(args.out, "table_cross_dataset.md", table)
