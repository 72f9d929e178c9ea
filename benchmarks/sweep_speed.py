"""Runs per hour of a 12-run sweep: R runs batched in one module (R = 1, 4, 12) and the Ray executor (1 vs 2 workers).

The grid is Table III's shape: CoOp, + ATLaS, + ATLaS-CSL, + ATLaS-ISL x seeds 1-3 (base-to-new, the paper's CoOp
recipe and ATLaS presets) on a synthetic 50-class dataset in the OxfordPets layout (25 base classes), with a
ViT-B/16-shaped CLIP with random weights (speed does not depend on the weights) and a few epochs. The feature cache is
built once beforehand (by a warm-up sweep, timed separately) and shared; every configuration then trains the whole grid into its own
empty results folder, so nothing is skipped, and its records are compared with the R = 1 records (largest
difference of any metric: batching must not change the numbers).

Usage::

    python benchmarks/sweep_speed.py                 # R = 1, 4, 12 locally, then Ray with 1 and 2 workers
    python benchmarks/sweep_speed.py --quick         # 2 epochs, R = 1 and 12, no Ray
    python benchmarks/sweep_speed.py --threads 1     # on a busy machine

Runs unchanged on a GPU (``--device auto`` picks it; Ray workers then get ``1 / workers`` GPU each).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atlas_fast.clip.backbones import BackboneConfig  # noqa: E402
from atlas_fast.sweep import Execution, paper_variants, grid_configs, run_configs  # noqa: E402
from atlas_fast.engine import TrainConfig  # noqa: E402

COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple", "brown", "grey"]
ANIMALS = ["cat", "dog", "bird", "horse", "sheep"]


def write_dataset(root: Path, classes: int, train: int, test: int) -> None:
    """``oxford_pets/images/*.jpg`` (32x32, one random colour each) + ``split_zhou_OxfordPets.json`` with
    ``classes`` readable class names."""
    import json

    folder = root / "oxford_pets"
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    split: dict[str, list] = {"train": [], "val": [], "test": []}
    for label in range(classes):
        cycle, index = divmod(label, len(COLOURS) * len(ANIMALS))  # names stay unique past 50 classes
        name = f"{COLOURS[index % len(COLOURS)]}_{ANIMALS[index // len(COLOURS)]}" + (f"_{cycle}" if cycle else "")
        for part, count in (("train", train), ("val", 1), ("test", test)):
            for i in range(count):
                rel = f"{name}_{part}{i}.jpg"
                colour = tuple(rng.randrange(256) for _ in range(3))
                Image.new("RGB", (32, 32), colour).save(folder / "images" / rel)
                split[part].append([rel, label, name])
    (folder / "split_zhou_OxfordPets.json").write_text(json.dumps(split))


def timed_sweep(configs: list[TrainConfig], results: Path, execution: Execution) -> tuple[float, list[dict]]:
    configs = [TrainConfig(**{**c.__dict__, "results_dir": results}) for c in configs]
    start = time.perf_counter()
    records = run_configs(configs, execution, progress=False)
    seconds = time.perf_counter() - start
    if any(r["skipped"] for r in records):
        raise RuntimeError("a timed sweep found finished records; every configuration needs an empty folder")
    return seconds, records


def largest_difference(records: list[dict], reference: list[dict]) -> float:
    return max(abs(r["metrics"][m] - e["metrics"][m]) for r, e in zip(records, reference) for m in ("base", "new", "H"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--classes", type=int, default=50)
    p.add_argument("--shots", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--views", type=int, default=1, help="cached augmented views (default 1: a short cache build)")
    p.add_argument("--runs", type=int, nargs="+", default=[1, 4, 12], help="R values (default 1 4 12)")
    p.add_argument("--ray-workers", type=int, nargs="*", default=[1, 2], help="default 1 2; none: skip Ray")
    p.add_argument("--ray-batch-runs", type=int, default=1, help="R inside each Ray task (default 1: 12 tasks)")
    p.add_argument("--model", default="ViT-B-16")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="2 epochs, R = 1 and 12, no Ray")
    args = p.parse_args()
    if args.quick:
        args.epochs, args.runs, args.ray_workers = 2, [1, 12], []
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else (
        "cpu" if args.device == "auto" else args.device)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_dataset(root / "data", args.classes, train=args.shots + 1, test=1)
        base = TrainConfig("OxfordPets", root / "data", BackboneConfig(args.model, None), shots=args.shots,
                           epochs=args.epochs, views=args.views, device=device, cache_root=root / "cache",
                           progress=False)
        configs = grid_configs(base, ["OxfordPets"], paper_variants("base2new"), [1, 2, 3])
        print(f"grid: {len(configs)} runs (CoOp, + ATLaS/-CSL/-ISL x 3 seeds), {args.classes} classes "
              f"({args.classes // 2} base), {args.shots} shots, {args.epochs} epochs, {args.views} cached view(s), "
              f"{args.model} random weights, "
              f"device {device}, torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
        start = time.perf_counter()
        # the cache, the few-shot subsets and the soft labels are built once, by a warm-up sweep
        timed_sweep(configs, root / "warmup", Execution("local", max(args.runs)))
        print(f"cache build + warm-up sweep (not in the table): {time.perf_counter() - start:.1f} s\n", flush=True)

        print("| executor | R (runs per module) | seconds | runs/hour | speed-up vs R=1 | max metric diff vs R=1 |")
        print("|---|---:|---:|---:|---:|---:|")
        reference, reference_seconds = None, None
        for runs in args.runs:
            seconds, records = timed_sweep(configs, root / f"local-R{runs}", Execution("local", runs))
            if reference is None:
                reference, reference_seconds = records, seconds
            print(f"| local | {runs} | {seconds:.1f} | {3600 * len(configs) / seconds:.0f} | "
                  f"{reference_seconds / seconds:.2f}x | {largest_difference(records, reference):.2e} |", flush=True)
        if args.ray_workers:
            import ray

            gpus = 1.0 / max(args.ray_workers) if device == "cuda" else 0.0
            ray_reference = None
            for workers in args.ray_workers:
                options = {"workers": workers, "num_cpus": max(args.ray_workers), "gpus_per_group": gpus}
                seconds, records = timed_sweep(configs, root / f"ray-{workers}",
                                               Execution("ray", args.ray_batch_runs, options))
                ray_reference = ray_reference or seconds
                print(f"| ray, {workers} worker(s) | {args.ray_batch_runs} | {seconds:.1f} | "
                      f"{3600 * len(configs) / seconds:.0f} | {reference_seconds / seconds:.2f}x "
                      f"({ray_reference / seconds:.2f}x vs 1 worker) | {largest_difference(records, reference):.2e} |",
                      flush=True)
            ray.shutdown()
        print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
