"""``--estimate`` against the measured time of the same command, side by side in one run: price a command from a fresh
cache and calibration (what the estimate itself took, and of that what measuring the units took), run it for real,
and print predicted and measured per phase with the load average beside each.

The command is given after ``--`` as ``atlas-fast`` would take it, without ``--cache-root``, ``--results-dir`` and
``--out``: this script sets them under ``--root`` (emptied first), so the estimate and the run start from nothing.
Measured per phase comes from the records' timings (``inputs``: the feature cache's build and the soft labels;
``train``; ``evaluate``, with the record); the rest of the wall time is the command's start, planning, its report
and its process's end.
Run from the repository root, e.g. (the stand-ins: ``atlas-fast data standins ROOT --datasets OxfordPets
DescribableTextures EuroSAT --test-fraction 0.05``)::

    python benchmarks/estimate_check.py --root /tmp/estimate -- experiment table3_base_to_new --data-root ROOT \\
        --datasets OxfordPets DescribableTextures --methods coop --seeds 1 --epochs 5 \\
        --model atlas-world --pretrained atlas-world

or one of the sizes of :data:`CASES` on the embedded world (``--case small|medium|large``; ``large`` is CoOp's three
seeds at the recipe's 200 epochs on WorldPhotos from a fresh cache: 68,937 features to encode, most of its time the
cache build)::

    python benchmarks/estimate_check.py --root /tmp/estimate --case large

Each phase's row gives predicted / measured as a ratio; the target is within 25 % (0.8 to 1.25) at every size.
``--build-check IMAGES VIEWS`` prices the cache build per feature beside a real build of the same features (the large
case's 201 views per image: ``--build-check 16 200``), in wall and CPU time, alternating rounds.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path


# Jobs of three sizes on the embedded world (generated under --root/data on first use), each from a fresh cache.
WORLD = ["--world", "--data-root", "{root}/data"]
CASES = {
    "small": ["experiment", "table3_base_to_new", *WORLD, "--datasets", "WorldPhotos", "--methods", "coop",
              "--seeds", "1", "--epochs", "5"],
    "medium": ["experiment", "table3_base_to_new", *WORLD, "--datasets", "WorldPhotos", "--methods", "coop",
               "--seeds", "1", "2", "3", "--epochs", "20"],
    "large": ["experiment", "table3_base_to_new", *WORLD, "--datasets", "WorldPhotos", "--methods", "coop"],
}


def load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def run(command: list[str]) -> tuple[float, str, str]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "atlas_fast.cli", *command], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"atlas-fast {' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return seconds, result.stdout, result.stderr


def predicted_phases(markdown: str) -> dict[str, float]:
    """The estimate's ``| phase | time |`` rows, in seconds."""
    phases = {}
    for name, value, unit in re.findall(r"^\| (?:\*\*)?([a-z -]+?)(?:\*\*)? \| (?:\*\*)?([\d.]+) (s|min|h)(?:\*\*)? \|$",
                                        markdown, re.M):
        phases[name] = float(value) * {"s": 1, "min": 60, "h": 3600}[unit]
    return phases


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (a build's decoding worker)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def build_check(root: Path, images: int, views: int, rounds: int) -> None:
    """The cache build's price per feature against the real build of the same features, side by side, alternating
    ``rounds`` times (median): the encode unit at 64 views per batch (what was priced before) and at the build's own
    batch, the cut unit (the workers' decoding) on the dataset's files, and :class:`~atlas_fast.cache.FeatureCache`
    building ``images`` WorldPhotos training images x ``views`` + 1 views from nothing, in wall and CPU time (CPU
    time holds under load)."""
    import statistics

    import torch

    from atlas_fast.cache import FeatureCache
    from atlas_fast.cache.build import batch_views, default_workers
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone
    from atlas_fast.data import load_dataset
    from atlas_fast.pricing.command_units import measure_decode, measure_encode
    from atlas_fast.pricing.facts import spare_cores

    backbone = load_backbone(BackboneConfig("atlas-world", "atlas-world"))
    data = load_dataset("WorldPhotos", root / "data")
    items, batch = list(data.train[:images]), batch_views(views + 1)
    features = len(items) * (views + 1)
    overlap = spare_cores(default_workers(torch.device("cpu")))
    times: dict[str, list[tuple[float, float]]] = {}
    print(f"{features} features ({len(items)} images x {views + 1} views, {batch} per encoder batch), "
          f"{torch.get_num_threads()} thread(s), decoding {'beside' if overlap else 'in turn with'} the encoder; "
          f"load {load()}")
    for _ in range(rounds):
        decode = measure_decode(backbone, images=[d.impath for d in (*data.train[:4], *data.test[:4])], pixels=True)
        for size in dict.fromkeys((64, batch)):
            clock = cpu_seconds()
            encode = measure_encode(backbone, batch=size)
            cpu = (cpu_seconds() - clock) / (size * (encode.repeats + 1))  # the untimed call included
            per_view = (max(encode.seconds, decode.seconds) if overlap else encode.seconds + decode.seconds) + (
                decode.fixed_seconds / (views + 1))
            times.setdefault(f"priced at the encode unit of {size} views per batch", []).append((per_view, cpu))
        shutil.rmtree(root / "build-check", ignore_errors=True)
        clock, start = cpu_seconds(), time.perf_counter()
        FeatureCache(root / "build-check").build(backbone, "WorldPhotos", items, num_views=views, progress=False)
        times.setdefault("the real build", []).append(((time.perf_counter() - start) / features,
                                                       (cpu_seconds() - clock) / features))
    real = [statistics.median(values) for values in zip(*times["the real build"])]
    print(f"load {load()} at the end\n| per feature | wall, ms | / the build's | CPU, ms (encoder's or whole build's) "
          f"| / the build's |\n|---|---:|---:|---:|---:|")
    for name, values in times.items():
        wall, cpu = (statistics.median(column) for column in zip(*values))
        print(f"| {name} | {1e3 * wall:.3f} | {wall / real[0]:.2f} | {1e3 * cpu:.3f} | {cpu / real[1]:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="emptied, then holds the cache, results and outputs")
    parser.add_argument("--case", choices=sorted(CASES), help="a job of that size on the embedded world")
    parser.add_argument("--build-check", nargs=2, type=int, metavar=("IMAGES", "VIEWS"),
                        help="instead: the cache build's price per feature beside the real build of IMAGES WorldPhotos "
                             "images x VIEWS + 1 views (e.g. 16 200, the large case's images)")
    parser.add_argument("--rounds", type=int, default=3, help="--build-check's alternated rounds (median)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- and the atlas-fast command to price and run")
    args = parser.parse_args()
    if args.build_check:
        if args.root.exists():
            shutil.rmtree(args.root)
        world = [word.format(root=args.root) for word in CASES["small"]]
        run(world + ["--dry-run", "--cache-root", str(args.root), "--results-dir", str(args.root), "--out",
                     str(args.root)])  # generates the world's images under --root/data
        build_check(args.root, *args.build_check, args.rounds)
        return
    command = [word for word in args.command if word != "--"]
    if args.case:
        command = [word.format(root=args.root) for word in CASES[args.case]]
    if not command:
        parser.error("give --case or a command after --")
    if args.root.exists():
        shutil.rmtree(args.root)
    args.root.mkdir(parents=True)
    if args.case:  # --world generates the world's images on first use: here, outside the timed commands
        dry = str(args.root / "dry")
        run(command + ["--dry-run", "--cache-root", dry, "--results-dir", dry, "--out", dry])
        shutil.rmtree(dry, ignore_errors=True)
    paths = ["--cache-root", str(args.root / "cache"), "--results-dir", str(args.root / "results")]
    if command[0] == "experiment":
        paths += ["--out", str(args.root / "out")]
    before = load()
    estimate_seconds, markdown, _ = run(command + paths + ["--estimate"])
    print(markdown)
    calibration = re.search(r"measured now \(([\d.]+) s\)", markdown)
    print(f"\nthe estimate took {estimate_seconds:.1f} s (load before: {before}), of which measuring the units "
          f"{calibration.group(1) if calibration else '?'} s")
    again, _, _ = run(command + paths + ["--estimate"])
    print(f"a second estimate of the same command (units reused): {again:.1f} s")

    before = load()
    wall, _, _ = run(command + paths + ["--no-progress"])
    after = load()
    records = [json.loads(p.read_text()) for p in sorted((args.root / "results").glob("*/*.json"))]
    groups: dict[tuple, dict[str, float]] = {}
    for record in records:
        timings = record.get("timings", {})
        # the runs of a group share their training's seconds (each record holds the group's)
        key = (record["config"]["dataset"], record["config"]["method"], timings.get("train"))
        group = groups.setdefault(key, {"inputs": 0.0, "train": float(timings.get("train", 0.0)), "evaluate": 0.0,
                                        "total": 0.0})
        group["inputs"] += float(timings.get("inputs", 0.0))
        group["evaluate"] += float(timings.get("evaluate", 0.0))
        group["total"] = max(group["total"], float(timings.get("group_total", 0.0)))  # its last record's
    measured = {name: sum(g[name] for g in groups.values()) for name in ("inputs", "train", "evaluate", "total")}
    predicted = predicted_phases(markdown)
    rows = [("cache build + soft labels (inputs)", predicted.get("cache build", 0) + predicted.get("soft labels", 0),
             measured["inputs"]),
            ("training", predicted.get("training", 0), measured["train"]),
            ("evaluation + per-run overhead", predicted.get("evaluation", 0) + predicted.get("per-run overhead", 0),
             measured["evaluate"]),
            ("setup, report and process end (measured: the wall time outside the groups)",
             predicted.get("setup", 0) + predicted.get("report", 0) + predicted.get("process end", 0),
             wall - measured["total"]),
            ("total", predicted.get("total", 0), wall)]
    print(f"\n{len(records)} runs in {len(groups)} groups; load average {before} before the run, {after} after")
    print("| phase | predicted | measured | predicted / measured |\n|---|---:|---:|---:|")
    for name, p, m in rows:
        print(f"| {name} | {p:.1f} s | {m:.1f} s | {p / m:.2f} |" if m else f"| {name} | {p:.1f} s | {m:.1f} s | |")


if __name__ == "__main__":
    main()
