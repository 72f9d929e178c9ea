"""Zero-shot accuracy of a CLIP on freshly rendered world images (pretraining report, tests, world properties).

Works on the raw open_clip model so pretraining can call it mid-run; images take the same path as the benchmark's
PNG files (uint8 32x32 -> [0, 1] -> mean/std), so numbers here are what the loaders and cache will see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from atlas_fast.clip.transforms import OPENAI_MEAN, OPENAI_STD
from atlas_fast.world.benchmark import MAIN_CLASSES, TEMPLATE
from atlas_fast.world.generator import CONCEPTS, PRETRAIN_LAYOUT, STYLES, Layout, concept_id, render_batch


def pixels_to_tensor(images: np.ndarray, mean: Sequence[float] = OPENAI_MEAN,
                     std: Sequence[float] = OPENAI_STD) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> normalised float (N, 3, H, W), as ToTensor + Normalize do for an already-sized PNG."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def eval_images(style: str, classnames: Sequence[str], per_class: int, seed: int,
                layout: Layout = PRETRAIN_LAYOUT) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` fresh images of every class in ``style`` (split "eval": never in pretraining or a benchmark);
    labels index ``classnames``."""
    labels = np.repeat(np.arange(len(classnames)), per_class)
    images = np.concatenate([render_batch([concept_id(name)] * per_class, [style] * per_class, seed, "eval",
                                          layout=layout) for name in classnames])
    return images, labels


@torch.no_grad()
def text_features(model: nn.Module, tokenizer: Callable, classnames: Sequence[str],
                  template: str = TEMPLATE) -> torch.Tensor:
    return F.normalize(model.encode_text(tokenizer([template.format(c) for c in classnames])), dim=-1)


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
    """Per style, on the 24 main classes: top-1 over all 24, within the base and new halves (12-way each), over all
    40 concepts, and how often the 40-way prediction has the right shape and the right texture."""

    rows: dict[str, dict[str, float]]

    COLUMNS = ("main", "base", "new", "all40", "shape", "texture")

    def mean(self, column: str) -> float:
        return float(np.mean([row[column] for row in self.rows.values()]))

    def format(self) -> str:
        lines = [f"{'images':<10}" + "".join(f"{c:>8}" for c in self.COLUMNS)]
        for style, row in self.rows.items():
            lines.append(f"{style:<10}" + "".join(f"{row[c]:8.1f}" for c in self.COLUMNS))
        lines.append(f"{'mean':<10}" + "".join(f"{self.mean(c):8.1f}" for c in self.COLUMNS))
        return "\n".join(lines)


def zero_shot_report(model: nn.Module, tokenizer: Callable, per_class: int = 10, seed: int = 1234,
                     styles: Sequence[str] = STYLES, layout: Layout = PRETRAIN_LAYOUT) -> ZeroShotReport:
    """Zero-shot accuracy of ``model`` with the template "a photo of a {}." on fresh images of each style, laid out
    as pretraining images (default) or as benchmark images (``benchmark.BENCHMARK_LAYOUT``)."""
    was_training = model.training
    model.eval()
    txt = text_features(model, tokenizer, CONCEPTS)
    main_ids = [concept_id(c) for c in MAIN_CLASSES]
    half = len(MAIN_CLASSES) // 2
    report = ZeroShotReport({})
    for style in styles:
        images, labels = eval_images(style, MAIN_CLASSES, per_class, seed, layout)
        img = image_features(model, images)
        main_txt = txt[main_ids]
        concept_labels = np.asarray(main_ids)[labels]
        pred = np.asarray([CONCEPTS[i] for i in (img @ txt.T).argmax(1).tolist()])
        truth = np.asarray([CONCEPTS[i] for i in concept_labels])
        report.rows[style] = {
            "main": accuracy(img, main_txt, labels, range(len(MAIN_CLASSES))),
            "base": accuracy(img, main_txt, labels, range(half)),
            "new": accuracy(img, main_txt, labels, range(half, len(MAIN_CLASSES))),
            "all40": accuracy(img, txt, concept_labels, range(len(CONCEPTS))),
            "shape": 100.0 * float(np.mean([p.split()[1] == t.split()[1] for p, t in zip(pred, truth)])),
            "texture": 100.0 * float(np.mean([p.split()[0] == t.split()[0] for p, t in zip(pred, truth)])),
        }
    model.train(was_training)
    return report
