"""Fig. 3: case study of the soft labels CSL and ISL give training images of one class, drawn as heat maps.

    atlas-fast experiment fig3_soft_label_case_study --data-root ~/data --pretrained ~/.cache/clip/ViT-B-16.pt

Takes ``--images`` training images of one base class (``--class-index``, of the few-shot subset of ``--seeds[0]``),
computes their CSL and ISL rows with the base-to-new presets (τ_c = 0.05, α = 0.1) and draws each image next to the
``--top-k`` largest entries of each row. CSL is the same for every image of a class; ISL follows the image. Trains
nothing (no runs to plan).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from atlas_fast.errors import UsageError
from atlas_fast.experiments.common import publish
from atlas_fast.report.figures import plot_soft_label_case_study
from atlas_fast.world.benchmark import CROSS_SOURCE

if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig

PAPER = "Fig. 3 (soft-label case study)"
DATASETS = ("ImageNet",)
WORLD_DEFAULTS = {"datasets": [CROSS_SOURCE]}  # --world: the world's ImageNet
KINDS = ("csl", "isl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--class-index", type=int, default=0, help="base class whose images are shown (default 0)")
    p.add_argument("--images", type=int, default=2, help="images of that class (default 2)")
    p.add_argument("--top-k", type=int, default=5, help="largest soft-label entries drawn per row (default 5)")
    p.add_argument("--shots", type=int, default=16)


def plan(args: argparse.Namespace) -> list[TrainConfig]:
    return []


def report(args: argparse.Namespace, records: list[dict]) -> str:
    from PIL import Image

    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.cache import FeatureCache
    from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes
    from atlas_fast.atlas.softlabels import soft_label_preset, compute_soft_labels
    from atlas_fast.engine.config import resolve_device

    from atlas_fast.app.options import check_range, resolve_backbone

    for option, value in (("--images", args.images), ("--top-k", args.top_k), ("--shots", args.shots)):
        check_range(option, value, 1)  # before the backbone is loaded or any image encoded
    resolve_backbone(args)  # --model/--pretrained as every run option resolves them
    backbone = shared_backbone(BackboneConfig(args.model, args.pretrained), resolve_device(args.device))
    full = load_dataset(args.datasets[0], args.data_root)
    fewshot = fewshot_subset(full, args.shots, args.seeds[0],
                             store_dir=Path(args.cache_root) / full.name / "split_fewshot")
    base = subsample_classes(fewshot, "base")
    if not 0 <= args.class_index < base.num_classes:
        raise UsageError(f"--class-index must be in [0, {base.num_classes - 1}] (the base classes).")
    chosen = tuple(d for d in base.train if d.label == args.class_index)[:args.images]
    if not chosen:
        raise UsageError(f"no training image of class {args.class_index} in the few-shot subset.")
    splits = base.with_lists(train=chosen)
    cache = FeatureCache(args.cache_root)
    cache.build(backbone, full.name, chosen, num_views=0, progress=False)
    view0 = cache.load(backbone, full.name, chosen, views=[0])[:, 0]
    rows = {kind.upper(): compute_soft_labels(soft_label_preset("base2new", kind), backbone, splits, view0)
            for kind in KINDS}
    images = [Image.open(d.impath).convert("RGB") for d in chosen]
    titles = [f"{d.classname} ({Path(d.key).name})" for d in chosen]
    path = plot_soft_label_case_study(images, titles, rows, base.classnames,
                                      Path(args.out) / "fig3_soft_label_case_study.png", args.top_k)
    lines = ["| image | kind | " + " | ".join(f"top {k + 1}" for k in range(args.top_k)) + " |",
             "|---|---|" + "---|" * args.top_k]
    for n, d in enumerate(chosen):
        for kind, values in rows.items():
            top = values[n].argsort(descending=True)[:args.top_k].tolist()
            lines.append(f"| {d.key} | {kind} | " + " | ".join(
                f"{base.classnames[c]} {values[n, c]:.2f}" for c in top) + " |")
    print(f"written: {path}")
    return publish(args.out, "fig3_soft_label_case_study.md", "\n".join(lines))
