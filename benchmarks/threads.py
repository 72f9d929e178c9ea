"""1 vs 2 intra-op CPU threads, side by side: a cached CoOp group (4 runs of CoOp + ATLaS-CSL trained together, the
demo's shape) and a feature-cache build, each without and with a synthetic load that this script starts itself (one
busy process per CPU this process may use).

Every measurement runs in a fresh process with ``OMP_NUM_THREADS`` and :func:`atlas_fast.set_threads` fixed, on a
synthetic OxfordPets layout and the shipped ``atlas-world`` CLIP (the demo's model, CPU): the cache is built once
beforehand for the group (not timed there); the cache build is timed from an empty cache (no decoding workers, so
the threads are the only parallelism). "No synthetic load" is not "idle" when other jobs share the machine: the
load average before each measurement is printed beside it. Run from the repository root::

    python benchmarks/threads.py [--epochs 20] [--classes 10] [--shots 8] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY_LOOP = "while True:\n    pass\n"


def _configs(data: Path, cache: Path, results: Path, epochs: int, shots: int):
    from atlas_fast.atlas.variants import label_variant
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig

    csl = label_variant("base2new", "csl")
    return [TrainConfig("OxfordPets", data, backbone=BackboneConfig("atlas-world", "atlas-world"), method="coop",
                        shots=shots, seed=seed, epochs=epochs, views=2, soft_labels=csl.soft_labels,
                        schedule=csl.schedule, device="cpu", cache_root=cache,
                        results_dir=results, progress=False)
            for seed in (1, 2, 3, 4)]


def worker(task: str, threads: int, data: Path, cache: Path, epochs: int, shots: int) -> dict:
    """One measurement in this (fresh) process: seconds of the task at ``threads`` threads."""
    import atlas_fast

    atlas_fast.set_threads(threads)
    import torch

    assert torch.get_num_threads() == threads
    if task == "group":
        from atlas_fast.engine import run_group

        with tempfile.TemporaryDirectory() as results:
            clock = time.perf_counter()
            records = run_group(_configs(data, cache, Path(results), epochs, shots))
            seconds = time.perf_counter() - clock
        assert not any(r["skipped"] for r in records)
        return {"seconds": seconds, "train_seconds": records[0]["timings"]["train"]}
    from atlas_fast.cache import FeatureCache
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone
    from atlas_fast.data import load_dataset

    splits = load_dataset("OxfordPets", data)
    backbone = load_backbone(BackboneConfig("atlas-world", "atlas-world"), "cpu")
    with tempfile.TemporaryDirectory() as folder:
        report = FeatureCache(folder).build(backbone, splits.name, list(splits.train) + list(splits.test),
                                            num_views=2, num_workers=0, device="cpu", progress=False)
    return {"seconds": report.seconds, "images_per_s": report.images_per_s}


def measure(task: str, threads: int, args: argparse.Namespace, data: Path, cache: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    env.pop("ATLAS_FAST_THREADS", None)
    command = [sys.executable, __file__, "--worker", task, "--threads", str(threads), "--data", str(data),
               "--cache", str(cache), "--epochs", str(args.epochs), "--shots", str(args.shots)]
    load = os.getloadavg()[0]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "load_before": load}


def start_load(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]


def stop_load(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
        process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="epochs of each CoOp run (default 20)")
    parser.add_argument("--classes", type=int, default=10, help="classes of the synthetic dataset (default 10)")
    parser.add_argument("--shots", type=int, default=8, help="training images per class (default 8)")
    parser.add_argument("--repeats", type=int, default=1, help="measurements per cell (the fastest is shown)")
    parser.add_argument("--worker", choices=("group", "cache"), help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.threads, args.data, args.cache, args.epochs, args.shots)))
        return 0

    sys.path.insert(0, str(ROOT / "tests"))
    from layouts import make_oxford_pets

    from atlas_fast.threads import available_cpus

    limit = available_cpus()
    with tempfile.TemporaryDirectory() as folder:
        data, cache = Path(folder) / "data", Path(folder) / "cache"
        make_oxford_pets(data, n_classes=args.classes, n_train=args.shots, n_val=2, n_test=4, size=64)
        measure("group", 1, args, data, cache)  # builds the group's cache (not timed) and warms the file cache
        rows = []
        for load_name, busy in (("none added", 0), (f"{limit.count} busy process(es)", limit.count)):
            processes = start_load(busy)
            try:
                time.sleep(1.0 if busy else 0.0)
                for task, row_name in (("group", f"CoOp + ATLaS-CSL group, 4 runs x {args.epochs} epochs"),
                                    ("cache", "cache build, 2 views")):
                    cells = {}
                    for threads in (1, 2):
                        results = [measure(task, threads, args, data, cache) for _ in range(args.repeats)]
                        cells[threads] = min(results, key=lambda r: r["seconds"])
                    rows.append((row_name, load_name, cells))
            finally:
                stop_load(processes)
    print(f"CPUs this process may use: {limit.count} ({limit.source}); machine CPUs: {os.cpu_count()}; "
          f"images: {args.classes} classes x ({args.shots} train + 4 test), 64 px; model atlas-world (CPU)")
    print("| task | synthetic load | 1 thread | 2 threads | t(1) / t(2) | load average before (1 / 2 threads) |")
    print("|---|---|---|---|---|---|")
    for row_name, load_name, cells in rows:
        one, two = cells[1], cells[2]
        print(f"| {row_name} | {load_name} | {one['seconds']:.2f} s | {two['seconds']:.2f} s | "
              f"{one['seconds'] / two['seconds']:.2f}x | {one['load_before']:.2f} / {two['load_before']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
