"""Training step time of CoCoOp and DePT-CoOp, the reference's full forward vs atlas_fast's cached path, and CoCoOp's
evaluation throughput with and without chunked batching, side by side in one process.

* full: every step runs the frozen image encoder on the batch's view pixels and the text tower over all 77 token
  positions of every prompt, as the reference trainers do (``docs/method-zoo.md``, section CoCoOp). CoCoOp encodes B x C
  sequences per step.
* cached: the same views' features come from the feature cache (built once, time reported) and the text tower runs
  truncated to the longest prompt (exact under the causal mask).

Both paths start from the same initialisation and take the same batches; the script prints the largest difference
of their losses over the timed steps (rounding noise, since the computations are equal). Full epochs of the full
path take hours on a CPU (CoCoOp trains with batch 1 on B x C prompts), so each path runs ``--steps`` timed steps
after one warm-up step, and seconds per epoch = median step time x steps per epoch of the recipe's batch size at
``--shots`` shots per class (16 in the papers). Evaluation: CoCoOp's test logits of ``--eval-images`` cached test
features, one text-encoder call per image (the reference's loop) vs chunks of up to ``--eval-sequences`` prompts per
call; the logits must agree. Model: a ViT-B/16-shaped CLIP with random weights (``BackboneConfig("ViT-B-16",
None)``); the ratios do not depend on the weights.

Usage::

    python benchmarks/method_speed.py --threads 2          # C = 10 and 50
    python benchmarks/method_speed.py --classes 10 --steps 2   # a short check
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from atlas_fast.atlas.criterion import LossCriterion  # noqa: E402
from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.cache import FeatureCache  # noqa: E402
from atlas_fast.engine.loop import build_optimizer, set_epoch_lr  # noqa: E402
from atlas_fast.methods.cocoop import CoCoOp, cocoop_recipe  # noqa: E402
from atlas_fast.methods.dept import DePTCoOp, dept_coop_recipe  # noqa: E402
from atlas_fast.clip.text_encoder import PromptTextEncoder  # noqa: E402
from atlas_fast.clip.transforms import load_views  # noqa: E402
from train_speed import write_images  # noqa: E402


class FullLengthTextEncoder(PromptTextEncoder):
    """The reference's TextEncoder: prompts padded with the embedding of token 0 to the full context length (77)
    and run through every position under the causal mask."""

    def forward(self, prompt_embeddings: torch.Tensor, eot_index: torch.Tensor, deep_prompts=()) -> torch.Tensor:
        if deep_prompts:
            raise NotImplementedError("the benchmark's full-length encoder has no deep prompts")
        model = self.model
        *lead, used, width = prompt_embeddings.shape
        padding = model.token_embedding(torch.zeros(self.context_length - used, dtype=torch.long,
                                                    device=prompt_embeddings.device))
        x = torch.cat([prompt_embeddings, padding.expand(*lead, -1, -1).to(prompt_embeddings.dtype)], dim=-2)
        x = model.transformer(x.reshape(-1, self.context_length, width) + model.positional_embedding,
                              attn_mask=model.attn_mask)
        x = model.ln_final(x)[torch.arange(x.shape[0]), eot_index.to(x.device).expand(*lead).reshape(-1)]
        projection = model.text_projection
        x = projection(x) if isinstance(projection, torch.nn.Linear) else x @ projection
        return x.reshape(*lead, -1)


class FullForwardCoCoOp(CoCoOp):
    """CoCoOp as the reference computes it at every step: image encoder on pixels, 77-token prompts."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.text_encoder = FullLengthTextEncoder(self.backbone)

    def training_loss(self, pixels, labels, criterion):
        return super().training_loss(self.backbone.model.encode_image(pixels), labels, criterion)


class FullForwardDePTCoOp(DePTCoOp):
    """DePT-CoOp as the reference computes it at every step: image encoder on pixels, 77-token prompts."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.base.text_encoder = FullLengthTextEncoder(self.backbone)

    def training_loss(self, pixels, labels, criterion):
        return super().training_loss(self.backbone.model.encode_image(pixels), labels, criterion)


METHODS = {"CoCoOp": (CoCoOp, FullForwardCoCoOp, cocoop_recipe),
           "DePT-CoOp": (DePTCoOp, FullForwardDePTCoOp, dept_coop_recipe)}


def time_steps(method, inputs: torch.Tensor, labels: torch.Tensor, recipe, steps: int) -> tuple[list[float], list[float]]:
    """Seconds and loss of ``steps`` optimisation steps (after one untimed warm-up step) on fixed batches."""
    optimizer = build_optimizer(method, recipe)
    set_epoch_lr(optimizer, recipe, min(1, recipe.epochs - 1))
    method.train()
    seconds, losses = [], []
    for step in range(steps + 1):
        index = torch.arange(step * recipe.batch_size, (step + 1) * recipe.batch_size) % len(labels)
        batch_labels = labels[index]
        start = time.perf_counter()
        criterion = LossCriterion(lambda logits, r: F.cross_entropy(logits, batch_labels), [len(batch_labels)])
        loss = method.training_loss(inputs[index], batch_labels, criterion).sum()
        optimizer.step(torch.autograd.grad(loss, optimizer.params, allow_unused=True))
        if inputs.is_cuda:
            torch.cuda.synchronize()
        if step:
            seconds.append(time.perf_counter() - start)
            losses.append(float(loss.detach()))
    return seconds, losses


def train_rows(backbone, classes: int, shots: int, steps: int, folder: Path, device: torch.device) -> list[dict]:
    """Per method: s/step and estimated s/epoch of both paths at ``classes`` classes."""
    train = write_images(folder, classes, 1, "train", seed=classes)  # one image per class is enough to time steps
    names = tuple(dict.fromkeys(d.classname for d in train))
    labels = torch.tensor([d.label for d in train], device=device)
    cache = FeatureCache(folder / "cache", storage_dtype="float32")
    start = time.perf_counter()
    cache.build(backbone, f"bench{classes}", train, num_views=1, progress=False)
    build_seconds = time.perf_counter() - start
    features = cache.load(backbone, f"bench{classes}", train, views=[1])[:, 0].to(device)
    spec = backbone.transform
    pixels = torch.stack([load_views(d.impath, d.key, [1], spec)[0] for d in train]).to(device)
    rows = []
    for name, (cached_class, full_class, recipe_function) in METHODS.items():
        config, recipe = recipe_function("paper", "base2new", 16, "bench")
        result = {"method": name, "classes": classes, "batch": recipe.batch_size, "build_s": build_seconds,
                  "steps_per_epoch": math.ceil(classes * shots / recipe.batch_size)}
        losses = {}
        for path, cls, inputs in (("cached", cached_class, features), ("full", full_class, pixels)):
            torch.manual_seed(0)
            method = cls(backbone, names, config).to(device)
            seconds, losses[path] = time_steps(method, inputs, labels, recipe, steps)
            result[f"{path}_step_s"] = float(np.median(seconds))
        result["loss_diff"] = max(abs(a - b) for a, b in zip(losses["cached"], losses["full"]))
        rows.append(result)
    return rows


def eval_row(backbone, classes: int, images: int, budget: int, device: torch.device) -> dict:
    """CoCoOp's test logits of ``images`` cached features: one text-encoder call per image vs chunked calls."""
    torch.manual_seed(0)
    names = tuple(f"class {i}" for i in range(classes))
    method = CoCoOp(backbone, names, cocoop_recipe("paper", "base2new", 16, "bench")[0]).to(device).eval()
    features = torch.randn(images, backbone.embed_dim, device=device)
    timings, logits = {}, {}
    for mode, sequences in (("per image", classes), ("chunked", budget)):
        method.eval_sequences = sequences
        start = time.perf_counter()
        logits[mode] = method.eval_logits(features)
        if device.type == "cuda":
            torch.cuda.synchronize()
        timings[mode] = images / (time.perf_counter() - start)
    return {"classes": classes, "images": images, "per_image_ips": timings["per image"],
            "chunked_ips": timings["chunked"], "images_per_call": method.eval_chunk(),
            "max_diff": float((logits["per image"] - logits["chunked"]).abs().max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[10, 50], help="class counts C (default 10 50)")
    parser.add_argument("--shots", type=int, default=16, help="shots per class for the per-epoch estimate (16)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per path (after 1 warm-up; default 3)")
    parser.add_argument("--eval-images", type=int, default=64, help="test images for the throughput (default 64)")
    parser.add_argument("--eval-sequences", type=int, default=CoCoOp.eval_sequences,
                        help=f"prompts per text-encoder call when chunked (default {CoCoOp.eval_sequences})")
    parser.add_argument("--model", default="ViT-B-16", help="open_clip model, random weights (default ViT-B-16)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    backbone = load_backbone(BackboneConfig(args.model, None), device)
    print(f"{backbone.describe()} on {device} ({torch.get_num_threads()} threads), fp32; each path: median of "
          f"{args.steps} steps after 1 warm-up; s/epoch = s/step x steps of a {args.shots}-shot epoch at the "
          f"recipe's batch size")
    print("| method | C | batch | steps/epoch | full s/step | cached s/step | full s/epoch | cached s/epoch | "
          "speed-up | max loss diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    agree = True
    with tempfile.TemporaryDirectory(prefix="atlas_method_speed_") as tmp:
        for classes in args.classes:
            for r in train_rows(backbone, classes, args.shots, args.steps, Path(tmp) / f"c{classes}", device):
                agree &= r["loss_diff"] < 1e-3
                print(f"| {r['method']} | {classes} | {r['batch']} | {r['steps_per_epoch']} | {r['full_step_s']:.3f} | "
                      f"{r['cached_step_s']:.4f} | {r['full_step_s'] * r['steps_per_epoch']:.1f} | "
                      f"{r['cached_step_s'] * r['steps_per_epoch']:.1f} | "
                      f"{r['full_step_s'] / r['cached_step_s']:.1f}x | {r['loss_diff']:.1e} |", flush=True)
    print(f"\nCoCoOp evaluation ({args.eval_images} cached test images; chunks of up to {args.eval_sequences} "
          f"prompts per text-encoder call)")
    print("| C | per-image calls (img/s) | chunked (img/s) | images per call | speed-up | max logit diff |")
    print("|---:|---:|---:|---:|---:|---:|")
    for classes in args.classes:
        r = eval_row(backbone, classes, args.eval_images, args.eval_sequences, device)
        agree &= r["max_diff"] < 1e-3
        print(f"| {classes} | {r['per_image_ips']:.1f} | {r['chunked_ips']:.1f} | {r['images_per_call']} | "
              f"{r['chunked_ips'] / r['per_image_ips']:.1f}x | {r['max_diff']:.1e} |", flush=True)
    print(f"\nlosses and logits agree between the paths: {agree}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
