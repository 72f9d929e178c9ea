"""Table V: computational cost of ATLaS, measured: training time per method and the soft-label overhead.

    atlas-fast experiment table5_cost --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Trains CoOp, + ATLaS, + ATLaS-CSL and + ATLaS-ISL on the base classes (16 shots; the paper uses ImageNet) and
reports, per row: the training time of one run (from its record: the loop over cached features, mean over seeds; a run
trained in a batch of R runs records its group's time divided by R), the time to generate its soft labels, measured
again here from the cached features without the soft-label store (LS is a formula: ~0 s), that time as a share of
training, the inference time per test image from cached features (text features + logits) and H. Runs default to
``--batch-runs 1`` so that each training time is a run's own. Times depend on the machine: the table says which.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from atlas_fast.experiments.common import BASE_NEW, base_config, publish
from atlas_fast.report.formats import deviation_sentences
from atlas_fast.report.rows import deviation_marks, variant_name
from atlas_fast.world.benchmark import CROSS_SOURCE

if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig

PAPER = "Table V (computational cost)"
DATASETS = ("ImageNet",)
WORLD_DEFAULTS = {"datasets": [CROSS_SOURCE]}  # --world: the world's ImageNet
BATCH_RUNS = 1


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    from atlas_fast.sweep import paper_variants, grid_configs

    return grid_configs(base_config(args, "base2new", evaluate=BASE_NEW), args.datasets, paper_variants("base2new"),
                        args.seeds)


def soft_label_seconds(record: dict, args: argparse.Namespace) -> float:
    """Generate the record's soft labels again (no store) and return the seconds it took."""
    import torch

    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.cache import FeatureCache
    from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes
    from atlas_fast.atlas.softlabels import SoftLabelConfig, compute_soft_labels
    from atlas_fast.engine.config import resolve_device

    config = record["config"]
    backbone = shared_backbone(BackboneConfig(**config["backbone"]), resolve_device(args.device))
    full = load_dataset(config["dataset"], args.data_root)
    fewshot = fewshot_subset(full, config["shots"], config["seed"],
                             store_dir=Path(args.cache_root) / full.name / "split_fewshot")
    train = subsample_classes(fewshot, config["subsample"])
    view0 = FeatureCache(args.cache_root).load(backbone, full.name, train.train, views=[0],
                                               aug_seed=config["aug_seed"])[:, 0]
    start = time.perf_counter()
    compute_soft_labels(SoftLabelConfig(**config["soft_labels"]), backbone, train, view0)
    if backbone.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def inference_ms_per_image(record: dict, args: argparse.Namespace) -> float:
    """Milliseconds per test image to classify cached features with the run's learned prompts (all classes)."""
    from atlas_fast.engine import evaluate_saved

    evaluate_saved(record["path"], record["config"]["dataset"], args.data_root, "all",
                             cache_root=args.cache_root, device=args.device, progress=False)
    # a second call times the classification alone (the backbone and cache are warm now)
    result_start = time.perf_counter()
    result = evaluate_saved(record["path"], record["config"]["dataset"], args.data_root, "all",
                             cache_root=args.cache_root, device=args.device, progress=False)
    return 1000.0 * (time.perf_counter() - result_start) / result["num_test"]


def report(args: argparse.Namespace, records: list[dict]) -> str:
    import torch

    rows: dict[str, dict[str, list[float]]] = {}
    runs: dict[str, list[dict]] = {}
    for record in records:
        runs.setdefault(variant_name(record["config"]), []).append(record)
        row = rows.setdefault(variant_name(record["config"]), {"train": [], "soft": [], "infer": [], "H": []})
        timings = record["timings"]
        row["train"].append(timings["train"] / timings.get("batch_runs", 1))
        row["H"].append(record["metrics"].get("H", record["metrics"].get("all", float("nan"))))
        if record["config"]["soft_labels"] is not None and not row["soft"]:
            row["soft"].append(soft_label_seconds(record, args))
        if not row["infer"]:
            row["infer"].append(inference_ms_per_image(record, args))
    device = records[0]["config"]["device"] if records else "?"
    lines = [f"Measured on {platform.node()} ({device}, torch {torch.__version__}), {', '.join(args.datasets)}, "
             f"{len(args.seeds)} seed(s)", "",
             "| Method | train s/run | soft labels s | % of training | infer ms/image | H (or all) |",
             "|---|---:|---:|---:|---:|---:|"]
    table_note, marks = deviation_marks(runs)
    lines[0] += table_note
    for variant, row in rows.items():
        train = statistics.fmean(row["train"])
        soft = row["soft"][0] if row["soft"] else 0.0
        lines.append(f"| {variant}{marks[variant]} | {train:.2f} | {soft:.3f} | {100 * soft / train:.2f} | "
                     f"{row['infer'][0]:.3f} | {statistics.fmean(row['H']):.2f} |")
    sentences = deviation_sentences(table_note, marks.values(), in_title=False)
    table = "\n".join(lines + (["", "; ".join(sentences) + "."] if sentences else []))
    return publish(args.out, "table5_cost.md", table)
