"""Where a cached CoOp step's time goes on a GPU: host time vs device time per step, kernel launches per step, and
the kernels that take the device's time (torch.profiler), eager and R-batched.

    python benchmarks/gpu_profile.py                    # ViT-B/16-shaped text tower, random weights, C = 50
    python benchmarks/gpu_profile.py --classes 10 500 --runs 1 12

A step is launch-bound when its host time (the Python and dispatch work that queues the kernels) exceeds its
device time: then fewer, larger kernels (R-batched runs, CUDA graphs) pay, and faster kernels do not. Random
cached features stand in for a dataset (the step's cost does not depend on their values). ``--device cpu --model
atlas-tiny`` smoke-tests the script (no device times).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


class RandomFeatures:
    """Cached features held on the device, the same every epoch (the loop's ``train_inputs`` protocol; rows on the
    device, as the cached views offer them, so the step gathers its batch there)."""

    def __init__(self, features: torch.Tensor) -> None:
        self.features, self.device = features, features.device

    def device_rows(self):
        return self.features, 1

    def batches(self, epoch, order, batch_size):
        for index in order.to(self.device).split(batch_size):
            yield self.features[index], index


def profile(backbone, classes: int, runs: int, steps: int, device: torch.device, amp: bool, top: int) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from atlas_fast.atlas.schedules import OneHot
    from atlas_fast.engine.loop import TrainingRuns, train_runs
    from atlas_fast.engine.step import RunState
    from atlas_fast.methods.config import OptimRecipe
    from atlas_fast.methods.registry import method_class

    entry = method_class("coop")
    classnames = [f"class number {i}" for i in range(classes)]
    generator = torch.Generator().manual_seed(0)
    n = 32 * steps
    states = []
    for seed in range(1, runs + 1):
        features = torch.randn(n, backbone.embed_dim, generator=generator).to(device)
        labels = torch.randint(classes, (n,), generator=generator)
        states.append(RunState(RandomFeatures(features), labels, None, OneHot(), seed=seed, device=device))
    torch.manual_seed(0)
    method = entry.build(backbone, classnames, entry.config_class(ctx_init="a photo of a"), runs).to(device)
    recipe = OptimRecipe(epochs=1, batch_size=32, lr=0.002)
    train_runs(TrainingRuns(method, states), recipe, device, amp=amp, progress=False)  # warm-up: kernels, cuBLAS handles
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    wall = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        train_runs(TrainingRuns(method, states), recipe, device, amp=amp, progress=False)
        sync()
    wall = time.perf_counter() - wall
    events = prof.key_averages()
    kernels = sum(e.count for e in events if getattr(e, "device_type", None) is not None
                  and str(e.device_type).endswith("CUDA") and e.key not in ("", None))
    device_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in events
                    if str(getattr(e, "device_type", "")).endswith("CUDA"))
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    lines = [f"\n### C = {classes}, R = {runs}, {steps} steps of batch 32, {'AMP' if amp else 'fp32'}",
             f"wall (profiled) {1000 * wall / steps:.2f} ms/step; device busy {device_us / 1000 / steps:.2f} ms/step; "
             f"{kernels / steps:.0f} kernel launches/step",
             events.table(sort_by=sort, row_limit=top, max_name_column_width=60)]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="ViT-B-16")
    p.add_argument("--classes", type=int, nargs="+", default=[50])
    p.add_argument("--runs", type=int, nargs="+", default=[1, 12])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=15, help="kernels listed per profile")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("No CUDA device visible to torch.")
        return 2
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone

    backbone = load_backbone(BackboneConfig(args.model, None), args.device)
    for classes in args.classes:
        for runs in args.runs:
            print(profile(backbone, classes, runs, args.steps, device, device.type == "cuda", args.top), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
