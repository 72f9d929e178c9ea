"""PromptKD's training step with the teacher's prompted view features read from the cache (atlas_fast) against running
the teacher's prompted image tower every step (the official trainer), side by side in one process, and the step at
ImageNet's shapes against the memory planner's estimate.

Both rows train the same student (visual prompts, projector; forward, backward, SGD step, fp32 on the CPU, fp16
autocast on a GPU) on the same random pixels; they alternate step by step so that a changing load hits both alike.
Time is the median of ``--steps`` timed steps each, after one untimed step per row (which encodes the teacher's text
features of the classes once, as a run does). Counted evidence beside it: the FLOPs of one step of each row
(``torch.utils.flop_counter``), which no load changes.

Memory (``--memory``): one step at C = 1,000 and the recipe's batch 8; "activations" is what autograd saves for the
backward pass (unique storages, frozen weights excluded), exact and device-independent, beside
``engine/memory.step_bytes_per_run`` (the planner's per-run estimate) for the same method, shapes and precision.

Usage::

    python benchmarks/promptkd_teacher.py                                    # tiny student, tiny teacher
    python benchmarks/promptkd_teacher.py --student ViT-B-16 --teacher ViT-L-14 --steps 2   # the official shapes
    python benchmarks/promptkd_teacher.py --student ViT-B-16 --teacher ViT-B-32 --memory --steps 0
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.engine.feed import PixelBatch  # noqa: E402
from atlas_fast.methods.registry import build_method  # noqa: E402
from atlas_fast.methods.promptkd import PromptKDConfig, promptkd_recipe  # noqa: E402


def load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def config_for(args: argparse.Namespace, student) -> PromptKDConfig:
    """The base-to-new recipe's student and teacher, with depths cut to the towers (random weights, no prompts)."""
    config, _ = promptkd_recipe("paper", "base2new", 16, "ImageNet")
    layers = len(student.model.visual.transformer.resblocks)
    teacher_layers = 3 if args.teacher.startswith("atlas-tiny") else 12
    return PromptKDConfig(**{**config.to_dict(), "depth_vision": min(config.depth_vision, layers),
                             "teacher": args.teacher, "teacher_pretrained": "none", "teacher_prompts": "none",
                             "teacher_depth_text": min(9, teacher_layers),
                             "teacher_depth_vision": min(9, teacher_layers)})


def step(method, optimizer, inputs, amp: bool, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
        loss = method.training_loss(inputs, None, None)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def flops(method, optimizer, inputs, amp: bool, device: torch.device) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step(method, optimizer, inputs, amp, device)
    return counter.get_total_flops()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--student", default="atlas-tiny")
    parser.add_argument("--teacher", default="atlas-tiny-teacher")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8, help="images per step (the recipe's 8)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row (0: no timing)")
    parser.add_argument("--memory", action="store_true", help="also the step at C = 1,000 against the planner")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    amp = device.type == "cuda"
    student = load_backbone(BackboneConfig(args.student, None), device)
    config = config_for(args, student)
    size = student.preprocessing.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    torch.manual_seed(0)
    pixels = torch.randn(args.batch, 3, size, size, device=device)
    print(f"student {args.student}, teacher {args.teacher} (random weights, prompts at init), batch {args.batch}, "
          f"{'fp16 autocast' if amp else 'fp32'} on {device}, {torch.get_num_threads()} thread(s), "
          f"load {load()} at start")

    if args.steps:
        names = [f"class {i}" for i in range(args.classes)]
        method = build_method("promptkd", student, names, config).to(device).train()
        optimizer = torch.optim.SGD(method.parameters(), lr=1e-6, momentum=0.9, weight_decay=5e-4)
        with torch.no_grad():
            cached = method.teacher.encode_image(pixels)  # what the teacher's cache file holds for these views
        rows = {"teacher features cached (atlas_fast)": PixelBatch(pixels, cached),
                "teacher run every step (official)": pixels}
        for inputs in rows.values():  # untimed: the teacher's text features, the allocator
            step(method, optimizer, inputs, amp, device)
        times = {name: [] for name in rows}
        for _ in range(args.steps):  # alternating, so the load hits both rows alike
            for name, inputs in rows.items():
                times[name].append(step(method, optimizer, inputs, amp, device))
        counted = {name: flops(method, optimizer, inputs, amp, device) for name, inputs in rows.items()}
        print(f"\n| row (C = {args.classes}) | ms / step (median of {args.steps}) | GFLOPs / step |\n|---|---|---|")
        for name in rows:
            print(f"| {name} | {1000 * statistics.median(times[name]):.1f} | {counted[name] / 1e9:.2f} |")
        cached_s, official_s = (statistics.median(t) for t in times.values())
        cached_f, official_f = counted.values()
        print(f"\nteacher every step / teacher cached: {official_s / cached_s:.2f}x time, "
              f"{official_f / cached_f:.2f}x FLOPs (load {load()} at the end)")
        del method, optimizer

    if args.memory:
        from atlas_fast.engine import memory

        classes = 1000
        names = [f"class {i}" for i in range(classes)]
        method = build_method("promptkd", student, names, config).to(device).train()
        frozen = {p.untyped_storage().data_ptr() for p in student.model.parameters()}
        sizes: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in frozen:
                sizes[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.no_grad():
            cached = method.teacher.encode_image(pixels)
            method.teacher_text()
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = method.training_loss(PixelBatch(pixels, cached), None, None)
        loss.backward()
        saved = sum(sizes.values())
        estimate = memory.step_bytes_per_run(type(method), student, classes, args.batch, amp)
        print(f"\nstep at C = {classes}, batch {args.batch}: autograd keeps {saved / 2**20:.1f} MiB for backward; "
              f"the planner estimates {estimate / 2**20:.1f} MiB per run ({estimate / saved:.2f}x; frozen weights "
              f"{memory.frozen_bytes(student, amp) / 2**20:.0f} MiB student + the teacher's "
              f"{sum(p.numel() * p.element_size() for p in method.teacher.model.parameters()) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
