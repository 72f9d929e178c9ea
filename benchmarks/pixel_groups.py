"""Pixel methods trained as groups, side by side in one process: what R runs in one prompted-tower pass, views decoded
once per step and one evaluation pass per group buy, on the tiny model (a CPU's measure of what a GPU is bound by:
operations dispatched per step, decodes, worker starts).

Sections, each for IVLP, MaPLe, PromptSRC and DePT-MaPLe (``--methods``) on a synthetic OxfordPets-layout dataset:

1. **ATen operations per run and step**, R = 1 vs R = 12 (3 seeds x the 4 label variants of Table III): every
   operation the training loop dispatches (``TorchDispatchMode``: step assembly, forward, backward, optimiser,
   bookkeeping; the decoding of the views, which a GPU machine does in worker processes, left out), divided by
   the steps and the runs, every step at R (the fork of section 5 off). Target: R = 12 at most 1/8 of R = 1.
2. **Wall time per run**, R = 1 (the runs one by one, each evaluated alone) vs R = 4 (2 seeds x 2 variants as one
   group, its epoch 0 trained by a trunk of 2 runs as the engine does), a whole command each (4 epochs: training,
   evaluation, records), median of ``--repeats`` alternating rounds after an untimed one.
   Target: R = 4 at most half of R = 1.
3. **Decoding pools and decodes**: a 4-run command with ``--workers`` decoding processes: worker pools started per
   command (a pool per epoch and per evaluated class set before); with the views decoded in this process, how many
   times each training (image, view) of an epoch and each test image is decoded. Targets: one pool per command
   (at most one per split read), one decode per test image per group.
4. **Pixels**: the views the feed serves are the old loader's (a DataLoader over each run's items per epoch, as
   atlas_fast had it before the feed), bit for bit, through worker processes.
5. **The shared first epochs trained once**: Table III's group of a dataset (3 seeds x plain, ATLaS, ATLaS-CSL,
   ATLaS-ISL, K = 2, 5 epochs as IVLP's and MaPLe's recipes) with epoch 0 trained by one trunk run per seed and
   then forked, against the same group unforked: training seconds (median of ``--repeats``) and the largest
   difference of any metric and learned tensor.

``--baseline-src DIR`` (another checkout, e.g. ``git archive <commit> | tar -x -C DIR``) runs section 3 and the
R = 1 / R = 4 commands of section 2 there too, in a child process, so the old figures print beside the new ones.

Usage::

    python benchmarks/pixel_groups.py                           # all sections, 1 thread
    python benchmarks/pixel_groups.py --baseline-src /tmp/old   # + the same commands on an older checkout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("ivlp", "maple", "promptsrc", "dept-maple")


def load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def write_dataset(root: Path, classes: int, train: int, test: int) -> None:
    """A synthetic OxfordPets: ``classes`` classes, 48x40 JPEGs of random noise (decoding and cropping cost
    something), ``split_zhou_OxfordPets.json``."""
    from PIL import Image

    folder = root / "oxford_pets"
    (folder / "images").mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    split: dict[str, list] = {"train": [], "val": [], "test": []}
    for label in range(classes):
        name = f"breed_{label}"
        for part, count in (("train", train), ("val", 1), ("test", test)):
            for i in range(count):
                rel = f"{name}_{part}{i}.jpg"
                pixels = torch.randint(0, 256, (40, 48, 3), generator=generator, dtype=torch.uint8)
                Image.fromarray(pixels.numpy()).save(folder / "images" / rel, quality=90)
                split[part].append([rel, label, name])
    (folder / "split_zhou_OxfordPets.json").write_text(json.dumps(split))


def method_config(method: str):
    """The method's paper base-to-new config, its prompt depths cut to the tiny model's 2 blocks."""
    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.pricing.units import method_config_for

    return method_config_for(method, None, shared_backbone(BackboneConfig("atlas-tiny", None)))


def configs(work: Path, method: str, results: str, seeds, variants, workers: int = 0, epochs: int = 2):
    from atlas_fast.atlas.schedules import Alternating, OneHot
    from atlas_fast.atlas.softlabels import soft_label_preset
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig

    kinds = {"plain": (OneHot(), None)}
    kinds.update({kind: (Alternating(2), soft_label_preset("base2new", kind)) for kind in ("ls", "csl", "isl")})
    return [TrainConfig("OxfordPets", work / "data", backbone=BackboneConfig("atlas-tiny", None), method=method,
                        method_config=method_config(method), shots=4, seed=seed, epochs=epochs, batch_size=4,
                        lr=0.002, views=epochs, device="cpu", cache_root=work / "cache",
                        results_dir=work / results, progress=False, workers=workers, schedule=kinds[v][0],
                        soft_labels=kinds[v][1])
            for v in variants for seed in seeds]


# ---------------------------------------------------------------------------------------------- 1. operations

def count_operations(work: Path, method: str, runs: int) -> tuple[float, int]:
    """(ATen operations per run and step of the training loop, steps) for a group of ``runs`` runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import atlas_fast.engine.group as group
    import atlas_fast.engine.pixels as pixels
    import atlas_fast.engine.step as step
    from atlas_fast.sweep import Execution, run_configs

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.operations, self.paused = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.operations += not self.paused
            return func(*args, **(kwargs or {}))

    counter, steps = Count(), []
    real_train, real_step, real_decode = group.train_runs, step.TrainStep.__call__, pixels.decode_view

    def counted_train(*args, **kwargs):
        with counter:
            return real_train(*args, **kwargs)

    def counted_step(*args, **kwargs):
        steps.append(1)
        return real_step(*args, **kwargs)

    def uncounted_decode(*args, **kwargs):  # decoding: worker processes on a GPU machine
        counter.paused += 1
        try:
            return real_decode(*args, **kwargs)
        finally:
            counter.paused -= 1

    seeds, variants = ((1, 2, 3), ("plain", "ls", "csl", "isl")) if runs == 12 else ((1,), ("plain",))
    real_plan = group.plan_fork  # every step at R (a fork would train epoch 0 at R = 3: section 5)
    group.train_runs, step.TrainStep.__call__, pixels.decode_view = counted_train, counted_step, uncounted_decode
    group.plan_fork = lambda *args: None
    try:
        records = run_configs(configs(work, method, f"ops-{method}-{runs}", seeds, variants),
                              Execution("local", runs), progress=False)
    finally:
        group.train_runs, step.TrainStep.__call__, pixels.decode_view = real_train, real_step, real_decode
        group.plan_fork = real_plan
    assert all(r["timings"]["batch_runs"] == runs for r in records), "the runs did not train as one group"
    return counter.operations / len(steps) / runs, len(steps)


# ---------------------------------------------------------------------------------------------- 2. wall time

WALL_EPOCHS = 4


def command_seconds(work: Path, method: str, runs: int, tag: str, cpu: list[float] | None = None) -> float:
    """Seconds per run of a 4-run command (2 seeds x 2 variants, :data:`WALL_EPOCHS` epochs) trained in groups of
    ``runs``; ``cpu`` gets the process's CPU seconds per run (less sensitive than wall time to other jobs on the
    cores: one thread, so CPU time is the work done)."""
    from atlas_fast.sweep import Execution, run_configs

    grid = configs(work, method, f"wall-{method}-{runs}-{tag}", (1, 2), ("plain", "ls"), epochs=WALL_EPOCHS)
    start, start_cpu = time.perf_counter(), time.process_time()
    records = run_configs(grid, Execution("local", runs), progress=False)
    seconds = time.perf_counter() - start
    if cpu is not None:
        cpu.append((time.process_time() - start_cpu) / len(grid))
    assert not any(r.get("skipped") for r in records)
    return seconds / len(grid)


# ---------------------------------------------------------------------------------------------- 3. pools, decodes

def pools_and_decodes(work: Path, method: str, runs: int, workers: int, tag: str) -> dict:
    """A 4-run command (2 seeds x 2 variants, groups of ``runs``): worker pools started with ``workers`` decoding
    processes; then, decoding in this process, decodes per training (image, view) of an epoch (over the distinct
    ones the runs read) and per test image."""
    from torch.utils.data import dataloader

    import atlas_fast.engine.pixels as pixels
    from atlas_fast.sweep import Execution, run_configs

    starts = []
    real_init = dataloader._MultiProcessingDataLoaderIter.__init__

    def counted_init(self, *args, **kwargs):
        starts.append(1)
        real_init(self, *args, **kwargs)

    grid = configs(work, method, f"pools-{method}-{runs}-{tag}", (1, 2), ("plain", "ls"), workers=workers)
    dataloader._MultiProcessingDataLoaderIter.__init__ = counted_init
    try:
        run_configs(grid, Execution("local", runs), progress=False)
    finally:
        dataloader._MultiProcessingDataLoaderIter.__init__ = real_init
    if hasattr(pixels, "close_decoding_pools"):
        pixels.close_decoding_pools()

    decodes: list[tuple[str, tuple]] = []
    real_load = pixels.load_views

    def counted_load(impath, key, views, spec):
        decodes.append((key, tuple(views)))
        return real_load(impath, key, views, spec)

    grid = configs(work, method, f"decodes-{method}-{runs}-{tag}", (1, 2), ("plain", "ls"))
    pixels.load_views = counted_load
    try:
        records = run_configs(grid, Execution("local", runs), progress=False)
    finally:
        pixels.load_views = real_load
    tests = [key for key, views in decodes if views == (0,)]
    trained = [(key, views) for key, views in decodes if views != (0,)]
    read = sum(r["data"]["num_train"] for r in records) * grid[0].epochs  # the views the runs' steps read
    return {"pools": len(starts), "splits": 2, "test_decodes_per_image": len(tests) / len(set(tests)),
            "train_decodes_per_view_read": len(trained) / read}


# ---------------------------------------------------------------------------------------------- 4. pixels

def old_loader_batches(items, spec, view, order, batch_size, workers):
    """The loader atlas_fast had before the feed (a DataLoader over one run's items per epoch and view)."""
    from torch.utils.data import DataLoader, Dataset

    from atlas_fast.clip.transforms import load_views

    class OneView(Dataset):
        def __len__(self):
            return len(items)

        def __getitem__(self, index):
            datum = items[index]
            return load_views(datum.impath, datum.key, [view], spec)[0], index

    loader = DataLoader(OneView(), batch_sampler=[chunk.tolist() for chunk in order.split(batch_size)],
                        num_workers=workers)
    yield from loader


def same_pixels(work: Path, workers: int) -> tuple[bool, int]:
    """Whether the feed (two runs on the same items through one pool) serves the old loader's pixels, and how many
    views were compared: 3 epochs' augmented views and the test view."""
    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.data import load_dataset
    from atlas_fast.engine.pixels import DecodingPool, ImageViews, ViewFeed

    backbone = shared_backbone(BackboneConfig("atlas-tiny", None))
    dataset = load_dataset("OxfordPets", work / "data")
    pool = DecodingPool(workers)
    feed = ViewFeed(pool)
    equal, compared = True, 0
    try:
        for items, views in ((dataset.train, (1, 2, 3)), (dataset.test, (0,))):
            for view in views:
                order = torch.randperm(len(items), generator=torch.Generator().manual_seed(view))
                runs = [ImageViews(items, backbone, aug_seed=0, feed=feed) for _ in range(2)]
                streams = [r.batches(view, order, 4) for r in runs]
                old = old_loader_batches(items, runs[0].spec, view, order, 4, workers)
                for (first, _), (second, _), (reference, _) in zip(*streams, old):
                    equal &= torch.equal(first, reference) and torch.equal(second, reference)
                    compared += len(reference)
    finally:
        pool.close()
    return equal, compared


# ---------------------------------------------------------------------------------------------- 5. fork

def fork_against_unforked(work: Path, method: str, repeats: int) -> tuple[float, float, float, float]:
    """(training seconds forked, unforked, largest metric difference, largest learned-tensor difference) of a
    12-run group of 5 epochs."""
    import atlas_fast.engine.group as group
    from atlas_fast.engine.record import load_learned
    from atlas_fast.sweep import Execution, run_configs

    real_plan = group.plan_fork
    seconds: dict[bool, list[float]] = {True: [], False: []}
    records = {}
    for repeat in range(repeats):
        for forked in ((True, False) if repeat % 2 == 0 else (False, True)):
            group.plan_fork = real_plan if forked else (lambda *args: None)
            try:
                grid = configs(work, method, f"fork-{method}-{forked}-{repeat}", (1, 2, 3),
                               ("plain", "ls", "csl", "isl"), epochs=5)
                records[forked] = run_configs(grid, Execution("local", 12), progress=False)
            finally:
                group.plan_fork = real_plan
            seconds[forked].append(records[forked][0]["timings"]["train"])
    metrics = max(abs(a["metrics"][name] - b["metrics"][name]) for a, b in zip(records[True], records[False])
                  for name in a["metrics"] if name != "zero_shot")
    tensors = max((load_learned(a["path"])[name] - load_learned(b["path"])[name]).abs().max().item()
                  for a, b in zip(records[True], records[False]) for name in load_learned(a["path"]))
    return statistics.median(seconds[True]), statistics.median(seconds[False]), metrics, tensors


# ---------------------------------------------------------------------------------------------- driver

def child(work: Path, methods: list[str], workers: int, repeats: int) -> dict:
    """What a baseline checkout measures (sections 2 and 3), as JSON."""
    torch.set_num_threads(1)
    out = {}
    for method in methods:
        command_seconds(work, method, 4, "baseline-warmup")  # the cache's views of these epochs, not timed
        wall: dict[int, list[float]] = {1: [], 4: []}
        for repeat in range(repeats):
            for runs in ((1, 4) if repeat % 2 == 0 else (4, 1)):
                wall[runs].append(command_seconds(work, method, runs, f"baseline-{repeat}"))
        out[method] = {"pools": pools_and_decodes(work, method, 4, workers, "baseline"),
                       "wall": {runs: statistics.median(values) for runs, values in wall.items()}}
    return out


def baseline(work: Path, src: Path, methods: list[str], workers: int, repeats: int) -> dict | None:
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = [sys.executable, __file__, "--work", str(work), "--workers", str(workers), "--repeats", str(repeats),
               "--methods", *methods, "--child"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=src)
    if done.returncode != 0:
        print(f"baseline failed: {done.stderr.strip().splitlines()[-1] if done.stderr else done.returncode}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds of the wall-time commands")
    parser.add_argument("--workers", type=int, default=2, help="decoding processes of section 3's pool count")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sections", default="ops,wall,pools,pixels,fork")
    parser.add_argument("--baseline-src", type=Path, help="an older checkout: sections 2 and 3 there too")
    parser.add_argument("--work", type=Path, help="folder for the data, cache and records (default: a temp dir)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.child:  # a baseline's child imports the checkout on its PYTHONPATH
        sys.path.insert(0, str(ROOT))
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(child(args.work, args.methods, args.workers, args.repeats)), flush=True)
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="pixel_groups_"))
    if not (work / "data").exists():
        write_dataset(work / "data", classes=6, train=6, test=4)
    sections = set(args.sections.split(","))
    print(f"# pixel groups: atlas-tiny (random weights), CPU, {args.threads} thread(s), torch {torch.__version__}; "
          f"load average {load()} at the start")
    from atlas_fast.sweep import Execution, run_configs

    for method in args.methods:  # the cache, soft labels and teacher text, built once, not timed
        run_configs(configs(work, method, f"warmup-{method}", (1, 2, 3), ("plain", "ls", "csl", "isl")),
                    Execution("local", 12), progress=False)
    old = (baseline(work, args.baseline_src.resolve(), args.methods, args.workers, args.repeats)
           if args.baseline_src else None)

    if "ops" in sections:
        print("\n## 1. ATen operations per run and step of the training loop (decoding left out)\n")
        print("| method | R = 1 | R = 12 | R = 12 / R = 1 | target |")
        print("|---|---:|---:|---:|---|")
        for method in args.methods:
            one, _ = count_operations(work, method, 1)
            twelve, _ = count_operations(work, method, 12)
            print(f"| {method} | {one:.0f} | {twelve:.1f} | {twelve / one:.3f} | <= 0.125: "
                  f"{'met' if twelve / one <= 0.125 else 'NOT met'} |", flush=True)

    if "wall" in sections:
        print(f"\n## 2. Wall time per run of a 4-run command (2 seeds x 2 variants, {WALL_EPOCHS} epochs; training, "
              f"evaluation and records), median of {args.repeats} alternating rounds\n")
        print("| method | R = 1 (s/run) | R = 4 (s/run) | R = 4 / R = 1 | target | CPU s/run R = 1 / R = 4 | "
              "CPU R = 4 / R = 1 |" + (" baseline R = 1 / R = 4 (s/run) |" if old else ""))
        print("|---|---:|---:|---:|---|---:|---:|" + ("---:|" if old else ""))
        for method in args.methods:
            command_seconds(work, method, 4, "warmup")  # the cache's views of these epochs, not timed
            times: dict[int, list[float]] = {1: [], 4: []}
            cpu: dict[int, list[float]] = {1: [], 4: []}
            for repeat in range(args.repeats):
                for runs in ((1, 4) if repeat % 2 == 0 else (4, 1)):
                    times[runs].append(command_seconds(work, method, runs, str(repeat), cpu[runs]))
            one, four = statistics.median(times[1]), statistics.median(times[4])
            cpu_one, cpu_four = statistics.median(cpu[1]), statistics.median(cpu[4])
            extra = f" {old[method]['wall']['1']:.3f} / {old[method]['wall']['4']:.3f} |" if old else ""
            print(f"| {method} | {one:.3f} | {four:.3f} | {four / one:.2f} | <= 0.5: "
                  f"{'met' if four / one <= 0.5 else 'NOT met'} | {cpu_one:.3f} / {cpu_four:.3f} | "
                  f"{cpu_four / cpu_one:.2f} |{extra}", flush=True)

    if "pools" in sections:
        print(f"\n## 3. A 4-run command (R = 4, 2 epochs, base/new/all evaluated): decoding pools ({args.workers} "
              f"workers) and decodes\n")
        print("| method | code | pools started | per split read | training views decoded per view a run read | "
              "decodes per test image |")
        print("|---|---|---:|---:|---:|---:|")
        for method in args.methods:
            rows = [("this checkout", pools_and_decodes(work, method, 4, args.workers, "this"))]
            if old:
                rows.append(("baseline", old[method]["pools"]))
            for label, r in rows:
                print(f"| {method} | {label} | {r['pools']} | {r['pools'] / r['splits']:.2f} | "
                      f"{r['train_decodes_per_view_read']:.2f} | {r['test_decodes_per_image']:.2f} |", flush=True)

    if "pixels" in sections:
        equal, compared = same_pixels(work, args.workers)
        print(f"\n## 4. The feed's pixels vs the old loader's ({args.workers} workers): bit-equal {equal} "
              f"({compared} views compared, two runs read each)")
    if "fork" in sections:
        print("\n## 5. Table III's group of a dataset (12 runs, 5 epochs, K = 2): epoch 0 trained by one trunk run "
              "per seed, then forked, against unforked\n")
        print("| method | training s, forked | unforked | forked / unforked | largest metric difference | "
              "largest learned-tensor difference |")
        print("|---|---:|---:|---:|---:|---:|")
        for method in args.methods:
            forked, unforked, metrics, tensors = fork_against_unforked(work, method, args.repeats)
            print(f"| {method} | {forked:.2f} | {unforked:.2f} | {forked / unforked:.2f} | {metrics:.1e} | "
                  f"{tensors:.1e} |", flush=True)
    print(f"\nload average {load()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
