"""Zero-shot accuracy of a CLIP on freshly rendered world images (pretraining report, tests, prefix sensitivity).

Works on the raw open_clip model so pretraining can call it mid-run; images take the same path as the benchmark's
PNG files (uint8 32x32 -> [0, 1] -> mean/std), so numbers here are what the loaders and cache will see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from atlas_fast.backbones import OPENAI_MEAN, OPENAI_STD
from atlas_fast.world.generator import CLASSNAMES, COLOURS, STYLES, render_batch

NEUTRAL_PREFIX = "a"  # "a red circle." names the class and nothing else


def pixels_to_tensor(images: np.ndarray, mean: Sequence[float] = OPENAI_MEAN,
                     std: Sequence[float] = OPENAI_STD) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> normalised float (N, 3, H, W), as ToTensor + Normalize do for an already-sized PNG."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def eval_images(style: str, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` fresh images of every class in ``style`` (split "eval": never in pretraining or a benchmark)."""
    labels = np.repeat(np.arange(len(CLASSNAMES)), per_class)
    indices = np.tile(np.arange(per_class), len(CLASSNAMES))
    images = np.stack([render_batch([int(lab)], [style], [None], seed, "eval", start_index=int(i))[0]
                       for lab, i in zip(labels, indices)])
    return images, labels


@torch.no_grad()
def text_features(model: nn.Module, tokenizer: Callable, prefix: str, classnames: Sequence[str]) -> torch.Tensor:
    tokens = tokenizer([f"{prefix} {c}." for c in classnames])
    return F.normalize(model.encode_text(tokens), dim=-1)


@torch.no_grad()
def image_features(model: nn.Module, images: np.ndarray, batch_size: int = 256) -> torch.Tensor:
    mean = getattr(model.visual, "image_mean", None) or OPENAI_MEAN
    std = getattr(model.visual, "image_std", None) or OPENAI_STD
    feats = [model.encode_image(pixels_to_tensor(images[i:i + batch_size], mean, std))
             for i in range(0, len(images), batch_size)]
    return F.normalize(torch.cat(feats), dim=-1)


def accuracy(img: torch.Tensor, txt: torch.Tensor, labels: np.ndarray, class_ids: Sequence[int]) -> float:
    """Top-1 (%) among ``class_ids`` only, over the images whose label is in ``class_ids``."""
    ids = torch.as_tensor(list(class_ids))
    keep = torch.from_numpy(np.isin(labels, ids.numpy()))
    pred = ids[(img[keep] @ txt[ids].T).argmax(1)]
    return 100.0 * (pred == torch.from_numpy(labels)[keep]).float().mean().item()


@dataclass
class ZeroShotReport:
    """Per style: top-1 over all 48 classes, within the base and new halves, with every other prefix, and how often
    the 48-way prediction has the right colour and the right shape (which attribute the model has learned)."""

    all: dict[str, float]
    base: dict[str, float]
    new: dict[str, float]
    by_prefix: dict[str, dict[str, float]]  # images' style -> prompt prefix -> 48-way top-1
    colour: dict[str, float] = field(default_factory=dict)
    shape: dict[str, float] = field(default_factory=dict)

    def mean(self, which: str = "all") -> float:
        values = getattr(self, which)
        return float(np.mean(list(values.values())))

    def format(self) -> str:
        """A table: one row per image style; the right-hand columns name the prompt prefix by its style."""
        column = {s.prefix: s.name for s in STYLES} | {NEUTRAL_PREFIX: "neutral"}
        prefixes = list(next(iter(self.by_prefix.values())))
        lines = [f"{'images':<10} {'all':>6} {'base':>6} {'new':>6} {'colour':>6} {'shape':>6} | "
                 f"48-way top-1 with the prefix of: "
                 + " ".join(f"{column.get(p, p):>9}" for p in prefixes)]
        for style in self.all:
            row = " ".join(f"{self.by_prefix[style][p]:9.1f}" for p in prefixes)
            lines.append(f"{style:<10} {self.all[style]:6.1f} {self.base[style]:6.1f} {self.new[style]:6.1f} "
                         f"{self.colour[style]:6.1f} {self.shape[style]:6.1f} | {' ' * 32}{row}")
        lines.append(f"{'mean':<10} {self.mean('all'):6.1f} {self.mean('base'):6.1f} {self.mean('new'):6.1f} "
                     f"{self.mean('colour'):6.1f} {self.mean('shape'):6.1f}")
        return "\n".join(lines)


def zero_shot_report(model: nn.Module, tokenizer: Callable, per_class: int = 10, seed: int = 1234,
                     styles: Sequence[str] | None = None) -> ZeroShotReport:
    """Zero-shot accuracy of ``model`` on fresh images of each style with its own caption prefix (and all others)."""
    was_training = model.training
    model.eval()
    styles = list(styles or [s.name for s in STYLES])
    prefix_of = {s.name: s.prefix for s in STYLES}
    prefixes = [s.prefix for s in STYLES] + [NEUTRAL_PREFIX]
    txt = {p: text_features(model, tokenizer, p, CLASSNAMES) for p in prefixes}
    n = len(CLASSNAMES)
    base_ids, new_ids = range(0, (n + 1) // 2), range((n + 1) // 2, n)
    report = ZeroShotReport({}, {}, {}, {})
    for style in styles:
        images, labels = eval_images(style, per_class, seed)
        img = image_features(model, images)
        own = txt[prefix_of[style]]
        report.all[style] = accuracy(img, own, labels, range(n))
        report.base[style] = accuracy(img, own, labels, base_ids)
        report.new[style] = accuracy(img, own, labels, new_ids)
        report.by_prefix[style] = {p: accuracy(img, txt[p], labels, range(n)) for p in prefixes}
        pred = (img @ own.T).argmax(1).numpy()
        k = len(COLOURS)
        report.colour[style] = 100.0 * float(np.mean(pred % k == labels % k))
        report.shape[style] = 100.0 * float(np.mean(pred // k == labels // k))
    model.train(was_training)
    return report
