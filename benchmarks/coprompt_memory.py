"""CoPrompt's training step at ImageNet's shapes beside the memory planner's estimate (``engine/memory.py``).

One step of CoPrompt (its ImageNet recipe: J = 12, M = 4, batch 4; forward, backward) at C classes on random pixels
and random cached features of the second view, with the description features computed beforehand (a run computes
them once per process; K x C x D fp32, reported apart). Two figures beside the planner's per-run estimate
(``step_bytes_per_run``) for the same method, shapes and precision:

* "autograd keeps": what autograd saves for the backward pass (unique storages, frozen weights excluded), exact and
  independent of the machine's load;
* the host RSS before the step and its peak during it (sampled), on the CPU.

Usage::

    python benchmarks/coprompt_memory.py                                   # tiny model, C = 10 (a smoke test)
    python benchmarks/coprompt_memory.py --model ViT-B-16 --classes 1000   # ImageNet's shapes (random weights)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_fast.atlas.criterion import LossCriterion  # noqa: E402
from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.engine import memory  # noqa: E402
from atlas_fast.engine.feed import PixelBatch  # noqa: E402
from atlas_fast.methods.registry import build_method  # noqa: E402
from atlas_fast.methods.coprompt import coprompt_recipe  # noqa: E402
from atlas_fast.pricing.timing import PeakMemory, host_rss  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="atlas-tiny", help="open_clip model, random weights (default: %(default)s)")
    p.add_argument("--classes", type=int, default=10, help="C (ImageNet: 1000; default: %(default)s)")
    p.add_argument("--descriptions", type=int, default=2, help="descriptions per class (ImageNet's file: 50)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    amp = device.type == "cuda"
    backbone = load_backbone(BackboneConfig(args.model, None), device)
    config, recipe = coprompt_recipe("paper", "base2new", 16, "ImageNet")
    towers = min(len(backbone.model.transformer.resblocks), len(backbone.model.visual.transformer.resblocks))
    names = [f"class {i}" for i in range(args.classes)]
    path = Path(tempfile.mkdtemp()) / "descriptions.json"
    path.write_text(json.dumps({n: [f"a photo of {n}, description {k}." for k in range(args.descriptions)]
                                for n in names}))
    config = replace(config, depth=min(config.depth, towers), descriptions=str(path))
    torch.manual_seed(0)
    method = build_method("coprompt", backbone, names, config).to(device).train()
    size = backbone.preprocessing.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    pixels = torch.randn(recipe.batch_size, 3, size, size, device=device)
    second = torch.randn(recipe.batch_size, backbone.embed_dim, device=device)  # the second view's cached features
    labels = torch.arange(recipe.batch_size, device=device) % args.classes
    targets = method.description_targets(device)  # once per process in a run
    frozen = {p.untyped_storage().data_ptr() for p in backbone.model.parameters()}
    sizes: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in frozen:
            sizes[storage.data_ptr()] = storage.nbytes()
        return tensor

    before = host_rss()
    clock = time.perf_counter()
    with PeakMemory(device) as peak:
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = method.training_loss(PixelBatch(pixels, second), labels, LossCriterion(
                lambda logits, r: torch.nn.functional.cross_entropy(logits, labels), [len(labels)]))
        loss.backward()
    seconds = time.perf_counter() - clock
    saved = sum(sizes.values())
    estimate = memory.step_bytes_per_run(type(method), backbone, args.classes, recipe.batch_size, amp)
    fixed = memory.frozen_bytes(backbone, amp)
    mib = 2 ** 20
    print(f"CoPrompt {args.model} C={args.classes} batch {recipe.batch_size} J={config.depth} M={config.n_ctx} "
          f"({'fp16 autocast' if amp else 'fp32'}, {device.type}): step {seconds:.1f} s")
    print(f"autograd keeps {saved / mib:.1f} MiB for backward; the planner estimates {estimate / mib:.1f} MiB per run "
          f"({estimate / saved:.2f}x) + {fixed / mib:.0f} MiB frozen")
    print(f"host RSS {before / mib:.0f} MiB before the step, peak {peak.host / mib:.0f} MiB "
          f"(+{(peak.host - before) / mib:.0f} MiB)" + (f"; device peak {peak.device_bytes / mib:.0f} MiB"
                                                        if amp else ""))
    print(f"description features (K x C x D fp32, once per process): {targets.numel() * 4 / mib:.1f} MiB")
    return 0 if saved <= estimate else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
