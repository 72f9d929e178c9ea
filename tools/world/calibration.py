"""Which logit scale makes the world's CLIP calibrated: expected calibration error (ECE) of zero-shot predictions
as a function of the scale, on held-out pretraining-style images.

    python -m tools.world.calibration [--checkpoint atlas-world] [--seeds 101 102] [--batches 8]

Images are drawn exactly as pretraining draws them (:class:`~tools.world.pretrain.CaptionedBatches`: all four
styles, the pretraining layout, a quarter of them as Dassl's training view) but from seeds pretraining never used
(it used seed 0), and classified 40-way over every concept with the template "a photo of a {}.". A scale changes no
prediction, only the confidence: ECE (15 equal-width confidence bins, top-1) and the mean negative log-likelihood
are reported for each scale of a grid, with the minimisers. For reference the same is printed on benchmark-layout
images (``benchmark.BENCHMARK_LAYOUT``, no crops), which prompt tuning trains on.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from atlas_fast.world.generator import CONCEPTS, STYLES, Layout

DEFAULT_SCALES = (5, 10, 15, 20, 25, 27.6, 30, 32, 34, 36, 38, 40, 45, 50, 60, 70, 80, 100)


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> float:
    """Top-1 ECE (%): sum over equal-width confidence bins of |accuracy - mean confidence| weighted by bin size."""
    confidence, pred = probs.max(1)
    correct = (pred == labels).float()
    edges = torch.linspace(0, 1, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (confidence > lo) & (confidence <= hi)
        if inside.any():
            ece += inside.float().mean().item() * abs(correct[inside].mean().item() - confidence[inside].mean().item())
    return 100.0 * ece


@dataclass
class CalibrationCurve:
    name: str
    accuracy: float
    rows: list[tuple[float, float, float, float]]  # (scale, ECE %, NLL, mean confidence %)

    def best(self, column: int) -> float:
        return min(self.rows, key=lambda r: r[column])[0]

    def format(self) -> str:
        lines = [f"{self.name}: {len(CONCEPTS)}-way top-1 {self.accuracy:.1f} %",
                 f"{'scale':>7} {'ECE %':>7} {'NLL':>7} {'conf %':>7}"]
        lines += [f"{s:7.1f} {e:7.2f} {n:7.3f} {c:7.1f}" for s, e, n, c in self.rows]
        lines.append(f"lowest ECE at scale {self.best(1):g}, lowest NLL at scale {self.best(2):g}")
        return "\n".join(lines)


def calibration_curve(name: str, cosines: torch.Tensor, labels: torch.Tensor,
                      scales: Sequence[float] = DEFAULT_SCALES) -> CalibrationCurve:
    rows = []
    for scale in scales:
        probs = torch.softmax(scale * cosines, dim=1)
        nll = torch.nn.functional.cross_entropy(scale * cosines, labels).item()
        rows.append((float(scale), expected_calibration_error(probs, labels), nll, 100.0 * probs.max(1)[0].mean().item()))
    accuracy = 100.0 * (cosines.argmax(1) == labels).float().mean().item()
    return CalibrationCurve(name, accuracy, rows)


def pretraining_style_cosines(model, tokenizer, seeds: Sequence[int], batches: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Image-text cosines (N, 40) and labels of held-out pretraining-style batches (``batches`` per seed)."""
    from tools.world.pretrain import CaptionedBatches, PretrainConfig
    from tools.world.zeroshot import image_features, text_features

    txt = text_features(model, tokenizer, CONCEPTS)
    cos, labels = [], []
    for seed in seeds:
        stream = CaptionedBatches(PretrainConfig(seed=seed))
        for step in range(batches):
            rng = np.random.default_rng([seed, step])
            concepts = stream.concepts(rng)  # the same draw as stream.batch(step) makes first
            images, _, _ = stream.batch(step)
            cos.append(image_features(model, images) @ txt.T)
            labels.append(torch.as_tensor(concepts))
    return torch.cat(cos), torch.cat(labels)


def layout_cosines(model, tokenizer, layout: Layout, seed: int, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines (N, 40) and labels of ``per_class`` fresh "eval" images of every concept and style in ``layout``."""
    from tools.world.zeroshot import eval_images, image_features, text_features

    txt = text_features(model, tokenizer, CONCEPTS)
    cos, labels = [], []
    for style in STYLES:
        images, y = eval_images(style, CONCEPTS, per_class, seed, layout)
        cos.append(image_features(model, images) @ txt.T)
        labels.append(torch.as_tensor(y))
    return torch.cat(cos), torch.cat(labels)


def main(argv: list[str] | None = None) -> None:
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone
    from atlas_fast.world.benchmark import BENCHMARK_LAYOUT

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default="atlas-world", help="pretrained tag or .safetensors file")
    p.add_argument("--seeds", type=int, nargs="+", default=[101, 102], help="fresh seeds (pretraining used 0)")
    p.add_argument("--batches", type=int, default=8, help="pretraining batches (128 images) per seed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--write-scale", type=float, default=None, metavar="SCALE",
                   help="rewrite --checkpoint (a .safetensors file) with only its logit scale set to SCALE, then exit")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.write_scale is not None:
        from pathlib import Path

        from tools.world.pretrain import rewrite_logit_scale

        if not args.checkpoint.endswith(".safetensors"):
            p.error("--write-scale needs --checkpoint as a .safetensors file (e.g. "
                    "atlas_fast/checkpoints/atlas-world.safetensors)")
        rewrite_logit_scale(Path(args.checkpoint), args.write_scale)
        print(f"{args.checkpoint}: logit scale set to {args.write_scale:g}")
        return
    backbone = load_backbone(BackboneConfig("atlas-world", args.checkpoint))
    model, tokenizer = backbone.model.eval(), backbone.tokenizer
    print(f"checkpoint logit scale: {model.logit_scale.exp().item():.2f}\n")
    cos, labels = pretraining_style_cosines(model, tokenizer, args.seeds, args.batches)
    print(calibration_curve(f"held-out pretraining-style images (seeds {args.seeds}, {len(labels)} images)", cos,
                            labels).format() + "\n")
    cos, labels = layout_cosines(model, tokenizer, BENCHMARK_LAYOUT, seed=args.seeds[0], per_class=8)
    print(calibration_curve(f"benchmark-layout images (seed {args.seeds[0]}, {len(labels)} images, no crops)", cos,
                            labels).format())


if __name__ == "__main__":
    main()
