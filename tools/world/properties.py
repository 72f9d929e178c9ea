"""Measure the properties that put the world in the paper's regime, on the shipped checkpoint (or any other).

    python -m tools.world.properties [--datasets WorldPhotos WorldSketches] [--coop-seeds 1 2 3]

For each dataset, on the base classes' training images (the images ISL reads, un-augmented):

* the teacher: CLIP's zero-shot accuracy with the dataset's template, and how often its prediction has the right
  shape and the right texture (the harder of the two is the one that matters); the logit scale;
* ISL: how often a row's argmax is the true class (the paper's base-to-new preset, alpha = 0.1 on wrong rows);
* transfer: which share of CSL's and ISL's off-target mass lies on classes that share a shape or a texture with the
  true class, next to the share such classes have among the off-target classes (what uniform smoothing puts there);
* room to overfit: CoOp's new-class accuracy per epoch (the paper's recipe, one fresh view per epoch) against
  zero-shot on the new classes.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from atlas_fast.clip.backbones import BackboneConfig, Backbone, load_backbone
from atlas_fast.data import DatasetSplits, load_dataset
from atlas_fast.data.fewshot import subsample_classes
from atlas_fast.atlas.softlabels import soft_label_preset, class_soft_labels, instance_soft_labels, zero_shot_probabilities
from atlas_fast.world.benchmark import SplitSizes, generate_benchmark
from tools.world.zeroshot import pixels_to_tensor

WORLD_BACKBONE = BackboneConfig("atlas-world", "atlas-world")


@dataclass
class TeacherProperties:
    """What CLIP knows about one dataset's base classes, measured on their training images (percent)."""

    dataset: str
    logit_scale: float
    accuracy: float  # zero-shot top-1 among the base classes
    shape_accuracy: float  # the prediction has the true class's shape
    texture_accuracy: float  # ... its texture
    isl_argmax_is_label: float  # ISL rows (base-to-new preset) whose argmax is the true class
    csl_attribute_share: float  # of CSL's off-target mass, the share on classes sharing a shape or texture with y
    isl_attribute_share: float  # the same for ISL
    uniform_attribute_share: float  # the same for uniform label smoothing (the share of such classes)

    @property
    def harder_attribute_accuracy(self) -> float:
        return min(self.shape_accuracy, self.texture_accuracy)


def _base_train_features(backbone: Backbone, splits: DatasetSplits) -> tuple[torch.Tensor, torch.Tensor]:
    """Un-augmented image features and labels of the training images (PNG -> the test transform's tensor: the
    world's PNGs are already 32x32, so resize and centre crop are the identity)."""
    base = list(splits.train)
    pixels = np.stack([np.asarray(Image.open(d.impath).convert("RGB")) for d in base])
    pre = backbone.preprocessing
    with torch.no_grad():
        feats = torch.cat([backbone.encode_image(pixels_to_tensor(pixels[i:i + 256], pre.mean, pre.std))
                           for i in range(0, len(pixels), 256)])
    return torch.nn.functional.normalize(feats.float(), dim=-1), torch.tensor([d.label for d in base])


def _attribute_share(rows: torch.Tensor, labels: torch.Tensor, shares: torch.Tensor) -> float:
    """Mean over rows of (mass on off-target classes that share an attribute with y) / (all off-target mass)."""
    off = rows.clone()
    off[torch.arange(len(labels)), labels] = 0.0
    return 100.0 * float(((off * shares[labels]).sum(1) / off.sum(1).clamp_min(1e-12)).mean())


def teacher_properties(dataset: str, data_root: str | Path, backbone: Backbone | None = None) -> TeacherProperties:
    """Measure :class:`TeacherProperties` on the base half of ``dataset`` (base-to-new presets of the paper)."""
    backbone = backbone or load_backbone(WORLD_BACKBONE)
    splits = subsample_classes(load_dataset(dataset, data_root), "base")
    feats, labels = _base_train_features(backbone, splits)
    with torch.no_grad():
        text = torch.nn.functional.normalize(backbone.encode_text(splits.prompts()).float(), dim=-1)
    probs = zero_shot_probabilities(backbone, text, feats)
    pred = probs.argmax(1)
    names = [c.split(" ") for c in splits.classnames]  # (texture, shape)
    same_shape = torch.tensor([[a[1] == b[1] for b in names] for a in names])
    same_texture = torch.tensor([[a[0] == b[0] for b in names] for a in names])
    shares = (same_shape | same_texture).float()
    shares.fill_diagonal_(0.0)
    preset = soft_label_preset("base2new", "isl")
    isl = instance_soft_labels(probs, labels, preset.alpha, preset.delta)
    csl = class_soft_labels(text, soft_label_preset("base2new", "csl").tau_c)[labels]
    uniform = torch.ones(len(labels), splits.num_classes)
    return TeacherProperties(
        dataset=dataset,
        logit_scale=float(backbone.model.logit_scale.exp()),
        accuracy=100.0 * float((pred == labels).float().mean()),
        shape_accuracy=100.0 * float(same_shape[pred, labels].float().mean()),
        texture_accuracy=100.0 * float(same_texture[pred, labels].float().mean()),
        isl_argmax_is_label=100.0 * float((isl.argmax(1) == labels).float().mean()),
        csl_attribute_share=_attribute_share(csl, labels, shares),
        isl_attribute_share=_attribute_share(isl, labels, shares),
        uniform_attribute_share=_attribute_share(uniform, labels, shares),
    )


@dataclass
class NewClassCurve:
    """CoOp's new-class accuracy per epoch (mean over seeds) against zero-shot CLIP on the new classes."""

    dataset: str
    seeds: list[int]
    zero_shot_new: float
    new_by_epoch: list[float]  # mean over seeds, epoch 1..E
    final_new: list[float] = field(default_factory=list)  # per seed
    final_base: list[float] = field(default_factory=list)
    zero_shot_base: float = 0.0

    @property
    def peak_new(self) -> float:
        return max(self.new_by_epoch)


def coop_new_class_curve(dataset: str, data_root: str | Path, seeds: Sequence[int] = (1, 2, 3),
                         epochs: int | None = None, views: int | None = None, cache_root: str | Path = "cache",
                         results_dir: str | Path = "results/world_properties") -> NewClassCurve:
    """Train CoOp base-to-new (16 shots, the paper's recipe) and evaluate the new classes after every epoch."""
    from atlas_fast.engine import TrainConfig, run

    records = [run(TrainConfig(dataset=dataset, data_root=Path(data_root), backbone=WORLD_BACKBONE, method="coop",
                               setting="base2new", shots=16, seed=seed, epochs=epochs, views=views,
                               eval_every_epoch=True, cache_root=Path(cache_root), results_dir=Path(results_dir),
                               progress=False))
               for seed in seeds]
    curves = [[e["accuracy"]["new"] for e in r["epochs"] if "accuracy" in e] for r in records]
    return NewClassCurve(
        dataset=dataset, seeds=list(seeds),
        zero_shot_new=statistics.fmean(r["metrics"]["zero_shot"]["new"] for r in records),
        zero_shot_base=statistics.fmean(r["metrics"]["zero_shot"]["base"] for r in records),
        new_by_epoch=[statistics.fmean(values) for values in zip(*curves)],
        final_new=[r["metrics"]["new"] for r in records], final_base=[r["metrics"]["base"] for r in records])


def format_properties(teachers: Sequence[TeacherProperties], curves: Sequence[NewClassCurve]) -> str:
    lines = ["| dataset | logit scale | zero-shot (base train) | shape | texture | ISL argmax = y | "
             "off-target mass on classes sharing an attribute: CSL / ISL / uniform |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for t in teachers:
        lines.append(f"| {t.dataset} | {t.logit_scale:.1f} | {t.accuracy:.1f} | {t.shape_accuracy:.1f} | "
                     f"{t.texture_accuracy:.1f} | {t.isl_argmax_is_label:.1f} | {t.csl_attribute_share:.1f} / "
                     f"{t.isl_attribute_share:.1f} / {t.uniform_attribute_share:.1f} |")
    if curves:
        lines += ["", "| dataset | seeds | zero-shot base / new | CoOp base / new (mean ± std) | CoOp new: peak -> "
                  "last epoch |", "|---|---|---:|---:|---:|"]
        for c in curves:
            spread = statistics.pstdev(c.final_new) if len(c.final_new) > 1 else 0.0
            lines.append(f"| {c.dataset} | {','.join(map(str, c.seeds))} | {c.zero_shot_base:.1f} / "
                         f"{c.zero_shot_new:.1f} | {statistics.fmean(c.final_base):.1f} / "
                         f"{statistics.fmean(c.final_new):.1f} ± {spread:.1f} | {c.peak_new:.1f} -> "
                         f"{c.new_by_epoch[-1]:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", default="data/world")
    p.add_argument("--datasets", nargs="+", default=["WorldPhotos", "WorldSketches"])
    p.add_argument("--coop-seeds", type=int, nargs="*", default=[1, 2, 3], help="none: skip the CoOp curves")
    p.add_argument("--epochs", type=int, default=None, help="CoOp epochs (default: the paper's recipe)")
    p.add_argument("--cache-root", default="cache")
    args = p.parse_args(argv)
    generate_benchmark(args.data_root, args.datasets, sizes=SplitSizes(32, 4, 50))
    backbone = load_backbone(WORLD_BACKBONE)
    teachers = [teacher_properties(d, args.data_root, backbone) for d in args.datasets]
    curves = [coop_new_class_curve(d, args.data_root, args.coop_seeds, args.epochs, cache_root=args.cache_root)
              for d in args.datasets] if args.coop_seeds else []
    print(format_properties(teachers, curves))


if __name__ == "__main__":
    main()
