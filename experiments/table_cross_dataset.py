"""Tables I and II: cross-dataset transfer and domain generalisation of CoOp, CoCoOp, DePT, IVLP and MaPLe with ATLaS
(trained on ImageNet).

    atlas-fast experiment table_cross_dataset --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Trains on ImageNet (all 1000 classes, 16 shots, each method's recipe, the cross-dataset presets K=3, θ=0.1,
τ_c=0.04, α=1.0), then evaluates each run's learned tensors on the full test split of every target (``--targets``:
the 10 other datasets and ImageNetV2/-Sketch/-A/-R by default). One block of rows per method (``--methods``; the
paper's "DePT" is ``dept-coop``, whose head is fused on ImageNet and its variants and unused on other datasets);
``--zero-shot`` adds a zero-shot CLIP row. Cells are means over seeds.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import ELEVEN, PAPER_METHODS, base_config, method_args, publish
from atlas_fast.report.formats import deviation_sentences
from atlas_fast.report.rows import deviation_marks, method_name, variant_name
from atlas_fast.report.stats import interval_note, paired_by_seed
from atlas_fast.world.benchmark import CROSS_SOURCE, CROSS_TARGETS, DG_TARGETS

if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig

PAPER = "Tables I and II"
DATASETS = ("ImageNet",)
TARGETS = ELEVEN[1:] + ("ImageNetV2", "ImageNetSketch", "ImageNetA", "ImageNetR")
# --world: WorldPhotos -> other class sets (cross-dataset) and the same classes in other styles (domain shift)
WORLD_DEFAULTS = {"datasets": [CROSS_SOURCE], "targets": list(CROSS_TARGETS + DG_TARGETS)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    method_args(p, PAPER_METHODS)
    p.add_argument("--targets", nargs="+", default=list(TARGETS))


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.sweep import paper_variants, grid_configs

    grids = [("zsclip", [LabelVariant("zero-shot", OneHot())])] if args.zero_shot else []
    grids += [(method, paper_variants("cross_dataset")) for method in args.methods]
    return [config for method, variants in grids for config in grid_configs(
        base_config(args, "cross_dataset", method=method), args.datasets, variants, args.seeds)]


def report(args: argparse.Namespace, records: list[dict]) -> str:
    from atlas_fast.engine import evaluate_saved

    cells: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    target_means: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)  # row -> seed -> mean over targets
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        method = record["config"]["method"]
        row = (method_name(method), variant_name(record["config"]))
        runs[row].append(record)
        cells[row]["source"].append(record["metrics"]["all"])
        accuracies = []
        for target in args.targets:
            result = evaluate_saved(record["path"], target, args.data_root, cache_root=args.cache_root,
                                     device=args.device, progress=False)
            # zero-shot CLIP on a target uses the target's own template, not the source's
            accuracies.append(result["zero_shot"] if method == "zsclip" else result["accuracy"])
            cells[row][target].append(accuracies[-1])
        if accuracies:
            target_means[row][record["config"]["seed"]] = statistics.fmean(accuracies)
    columns = ["source"] + list(args.targets)
    lines = ["| Method | " + " | ".join(columns) + " | target mean | Δ target mean (95 % CI) |",
             "|---|" + "---:|" * (len(columns) + 2)]
    seeds = 0
    table_note, marks = deviation_marks(runs)
    for (block, variant), per_column in cells.items():
        means = [statistics.fmean(per_column[c]) for c in columns]
        baseline = (block, block)  # a method's plain row is named after the method
        paired = (paired_by_seed(target_means[(block, variant)], target_means[baseline])
                  if variant != block and baseline in target_means else None)
        seeds = max(seeds, paired.seeds if paired else 0)
        lines.append(f"| {variant}{marks[(block, variant)]} | " + " | ".join(f"{m:.2f}" for m in means)
                     + f" | {statistics.fmean(means[1:]) if len(means) > 1 else float('nan'):.2f} | "
                     + (paired.cell() if paired else "") + " |")
    notes = ([interval_note(seeds, "the method's plain row")] if seeds else []) + deviation_sentences(
        table_note, marks.values(), in_title=False)
    if notes:
        lines += ["", "; ".join(notes) + "."]
    return publish(args.out, "table_cross_dataset.md", "\n".join(lines))
