"""Training step time of the methods beyond the paper that train from cached features (TCP, CLIP-LoRA on the text
tower, KDPL on CoOp and CoCoOp), each against its pixel path, side by side in one process.

* pixel: each step decodes and augments the batch's views (``--decode``), runs the frozen image tower on them (and,
  for KDPL, the teacher's image tower), then the method's loss and its backward, as the reference trainers do.
  For CLIP-LoRA this is the registered ``clip-lora`` with ``encoder=text`` (the engine's pixel path).
* cached: the same views' features come from the feature cache (the student's and, for KDPL, the teacher's own
  file), so only the method's loss and backward run.

Both paths start from the same initialisation and take the same batches; the script prints the largest difference
of their losses (rounding noise: the computations are equal). Each path runs ``--steps`` timed steps after one
warm-up step; the table gives the median seconds per step and the ratio pixel / cached. The recipe's batch size is
used (TCP 32, CLIP-LoRA 32, KDPL-CoOp 32, KDPL-CoCoOp 1) at ``--classes`` classes. Model: a ViT-B/16-shaped CLIP
with random weights by default (the ratios do not depend on the weights); KDPL's teacher is ``--teacher`` (default:
the student's architecture; the paper's ViT-H-14 makes the pixel path's teacher pass ~15x dearer).

Usage::

    python benchmarks/beyond_methods.py --threads 2
    python benchmarks/beyond_methods.py --model atlas-world --pretrained atlas-world --classes 12
    python benchmarks/beyond_methods.py --teacher ViT-H-14-quickgelu --device cuda   # on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from atlas_fast.atlas.criterion import LossCriterion  # noqa: E402
from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.clip.transforms import load_views  # noqa: E402
from atlas_fast.engine.loop import build_optimizer, set_epoch_lr, set_step_lr  # noqa: E402
from atlas_fast.methods.registry import method_class  # noqa: E402
from train_speed import write_images  # noqa: E402

METHODS = ("tcp", "clip-lora-text", "kdpl-coop", "kdpl-cocoop")


def method_config(name: str, backbone, teacher: tuple[str, str]):
    """The method's base-to-new recipe config, its depths cut to the backbone and KDPL's teacher set."""
    import dataclasses

    config, recipe = method_class(name).recipe_function("paper", "base2new", 16, "ImageNet")
    changes = {}
    if hasattr(config, "teacher"):
        changes.update(teacher=teacher[0], teacher_pretrained=teacher[1])
    if hasattr(config, "depth"):
        changes["depth"] = min(config.depth, len(backbone.model.transformer.resblocks))
    return dataclasses.replace(config, **changes), recipe


def time_steps(method, batches, step_inputs, steps: int) -> tuple[list[float], list[float]]:
    """Seconds and losses of ``steps`` timed steps after one warm-up step; ``step_inputs(batch)`` makes a step's
    inputs from the batch (decoding and encoding included, for the pixel path)."""
    _, recipe = method_class(method.name).recipe_function("paper", "base2new", 16, "ImageNet")
    optimizer = build_optimizer(method, recipe)
    if recipe.iterations is None:
        set_epoch_lr(optimizer, recipe, min(1, recipe.epochs - 1))
    else:
        set_step_lr(optimizer, recipe, 0)
    seconds, losses = [], []
    for i in range(steps + 1):
        start = time.perf_counter()
        inputs, labels = step_inputs(batches[i % len(batches)])
        criterion = LossCriterion(lambda z, r: torch.nn.functional.cross_entropy(z, labels), [len(labels)])
        loss = method.training_loss(inputs, labels, criterion)
        optimizer.step(torch.autograd.grad(loss.sum(), optimizer.params, allow_unused=True))
        if method.device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            seconds.append(time.perf_counter() - start)
            losses.append(float(loss.detach()))
    return seconds, losses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ViT-B-16")
    p.add_argument("--pretrained", default="none")
    p.add_argument("--teacher", default=None, help="KDPL's teacher model (default: --model)")
    p.add_argument("--teacher-pretrained", default=None, help="its tag, file or none (default: --pretrained)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    pretrained = None if args.pretrained.lower() == "none" else args.pretrained
    backbone = load_backbone(BackboneConfig(args.model, pretrained), device)
    teacher = (args.teacher or args.model, args.teacher_pretrained or args.pretrained)
    classnames = [f"class number {i}" for i in range(args.classes)]
    spec = backbone.transform_for(0)
    rows, agree = [], True
    with tempfile.TemporaryDirectory() as folder:
        items = write_images(Path(folder), 4, 8, "train", seed=0)  # 64 x 80 photos: decoding is a small share
        for name in args.methods:
            entry = method_class(name)
            config, recipe = method_config(name, backbone, teacher)
            batch = recipe.batch_size
            labels = [torch.arange(batch) % args.classes for _ in range(args.steps + 1)]
            images = [[items[(i * batch + j) % len(items)] for j in range(batch)] for i in range(args.steps + 1)]

            def decode(step: int) -> torch.Tensor:
                return torch.stack([load_views(d.impath, d.key, [1 + step], spec)[0] for d in images[step]])

            torch.manual_seed(0)
            cached = entry.build(backbone, classnames, config).to(device)
            other = entry.view_teacher(config, backbone)
            width = backbone.embed_dim + (other.embed_dim if other is not None else 0)

            @torch.no_grad()
            def features(pixels: torch.Tensor) -> torch.Tensor:
                own = backbone.encode_image(pixels)
                return torch.cat([own, other.encode_image(pixels)], dim=-1) if other is not None else own

            pixel_method = entry.build(backbone, classnames, config).to(device)
            if name == "clip-lora-text":  # the engine's own pixel path: clip-lora with the text tower adapted
                from atlas_fast.methods.clip_lora import CLIPLoRAConfig

                pixel_method = method_class("clip-lora").build(
                    backbone, classnames, CLIPLoRAConfig(**{**config.to_dict(), "encoder": "text"})).to(device)

                def pixel_inputs(step):
                    return decode(step).to(device), labels[step].to(device)
            else:
                def pixel_inputs(step):
                    return features(decode(step).to(device)), labels[step].to(device)
            pixel_method.load_checkpoint_state(cached.state_for_checkpoint())
            stored = {step: features(decode(step).to(device)) for step in range(args.steps + 1)}  # the cache
            assert stored[0].shape[-1] == width
            torch.manual_seed(1)  # the same dropout masks on both paths (CLIP-LoRA)
            pixel_seconds, pixel_losses = time_steps(pixel_method.train(), list(range(args.steps + 1)), pixel_inputs,
                                                     args.steps)
            torch.manual_seed(1)
            cached_seconds, cached_losses = time_steps(
                cached.train(), list(range(args.steps + 1)), lambda step: (stored[step], labels[step].to(device)),
                args.steps)
            gap = max(abs(a - b) for a, b in zip(pixel_losses, cached_losses))
            agree = agree and gap < 1e-2 * max(1.0, max(abs(v) for v in cached_losses))
            pixel, fast = statistics.median(pixel_seconds), statistics.median(cached_seconds)
            rows.append(f"| {entry.printed_name} | {args.classes} | {batch} | {pixel * 1e3:.1f} | {fast * 1e3:.1f} | "
                        f"{pixel / fast:.1f}x | {gap:.1e} |")
    print(f"Model {args.model} ({args.pretrained}), KDPL teacher {teacher[0]} ({teacher[1]}), device {device}, "
          f"{torch.get_num_threads()} thread(s); median of {args.steps} step(s) after one warm-up\n")
    print("| method | C | batch | pixel path ms/step (decode + frozen towers + loss) | cached ms/step | ratio | "
          "largest loss difference |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(f"\nlosses agree between the paths: {agree}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
