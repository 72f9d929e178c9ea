"""Does the demo's table depend on the CPU thread count, where does it come from, and what does a single thread
(``--deterministic``) cost? Side by side, in one run of this script.

Three reduced demos from nothing (CoOp, + ATLaS, -CSL, -ISL on WorldPhotos, ``--epochs E`` and as many cached views,
``--seeds ...``), each in a fresh ``atlas-fast`` process, on one generated world:

* A: ``--threads 1`` (its own feature cache and results)
* B: ``--threads 2`` (its own feature cache and results)
* C: ``--threads 2`` training on a copy of A's feature cache (so only training and evaluation ran at 2 threads)
* D: ``--deterministic`` (no ``--threads``: one thread whatever the machine offers; its own cache and results;
  skipped with ``--no-deterministic``)

and compares, bit for bit: A's and B's cached features (the encoder at 1 vs 2 threads), A's and C's records
(metrics and learned tensors: training and evaluation at 1 vs 2 threads), A's and B's (the whole demo), A's and D's
(``--deterministic`` is ``--threads 1``: they must agree bit for bit).
Each demo's wall time is printed beside the load average before it; the machine's other jobs move the times, not the
comparisons. Run from the repository root::

    python benchmarks/determinism.py [--epochs 20] [--seeds 1 2] [--out /tmp/determinism]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def demo(out: Path, name: str, threads: int | None, cache: Path, epochs: int, seeds: list[str], *extra: str) -> float:
    """One reduced demo in a fresh process (``threads`` None: no ``--threads``); returns its wall seconds (printed
    with the load before it)."""
    command = [sys.executable, "-m", "atlas_fast.cli", *(["--threads", str(threads)] if threads else []), "demo",
               "--data-root",
               str(out / "world"), "--cache-root", str(cache), "--results-dir", str(out / name), "--epochs",
               str(epochs), "--views", str(epochs), "--seeds", *seeds, "--no-progress", *extra]
    before = load()
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stderr[-3000:]}")
    (out / f"{name}.txt").write_text(result.stdout)
    print(f"{name}: {f'--threads {threads} ' if threads else ''}{' '.join(extra)}: {seconds:.1f} s (load before: "
          f"{before})", flush=True)
    return seconds


def records(folder: Path) -> dict[str, tuple[dict, Path]]:
    return {p.name: (json.loads(p.read_text()), p.with_suffix(".pt")) for p in sorted(folder.glob("*/*.json"))}


def compare_records(a: Path, b: Path) -> list[str]:
    """Per record (by name): whether the metrics and the learned tensors are bit-identical."""
    import torch

    left, right = records(a), records(b)
    lines = []
    if set(left) != set(right):
        return [f"different records: {sorted(set(left) ^ set(right))}"]
    for name, (record, tensors) in left.items():
        other, other_tensors = right[name]
        metrics = {k: v for k, v in record["metrics"].items() if k != "zero_shot"}
        other_metrics = {k: v for k, v in other["metrics"].items() if k != "zero_shot"}
        learned = torch.load(tensors, weights_only=True)
        other_learned = torch.load(other_tensors, weights_only=True)
        same_tensors = learned.keys() == other_learned.keys() and all(
            torch.equal(learned[k], other_learned[k]) for k in learned)
        gap = max((learned[k] - other_learned[k]).abs().max().item() for k in learned) if not same_tensors else 0.0
        lines.append(f"  {record['config']['schedule']['name']}/{(record['config'].get('soft_labels') or {}).get('kind')}"
                     f" seed {record['config']['seed']}: metrics {'equal' if metrics == other_metrics else 'DIFFER'}"
                     f" {metrics if metrics != other_metrics else ''}{other_metrics if metrics != other_metrics else ''};"
                     f" learned tensors {'bit-identical' if same_tensors else f'differ (max |diff| {gap:.3g})'}")
    return lines


def compare_caches(a: Path, b: Path) -> str:
    """Whether the cached features of two cache roots are bit-identical (rows matched by image key)."""
    import h5py
    import numpy as np

    (fa,), (fb,) = sorted(a.glob("*/*.h5")), sorted(b.glob("*/*.h5"))
    with h5py.File(fa, "r") as x, h5py.File(fb, "r") as y:
        rows = {k: i for i, k in enumerate(y["keys"].asstr()[...])}
        keys = list(x["keys"].asstr()[...])
        done_x, done_y = x["done"][...], y["done"][...]
        features_x, features_y = x["features"][...], y["features"][...]
    compared = differing = 0
    worst = 0.0
    for i, key in enumerate(keys):
        j = rows[key]
        both = done_x[i] & done_y[j]
        fx, fy = features_x[i][both].astype(np.float32), features_y[j][both].astype(np.float32)
        compared += fx.size
        differing += int((fx != fy).sum())
        worst = max(worst, float(np.abs(fx - fy).max()) if fx.size else 0.0)
    return (f"{compared} feature values compared, {differing} differ"
            + (f" (max |diff| {worst:.3g}, stored as {features_x.dtype})" if differing else " (bit-identical)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seeds", nargs="+", default=["1", "2"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/atlas_determinism"))
    parser.add_argument("--no-deterministic", action="store_true", help="leave out demo D")
    parser.add_argument("--compare-only", action="store_true", help="compare what --out holds; run nothing")
    args = parser.parse_args()
    out = args.out
    seconds: dict[str, float] = {}
    if args.compare_only:
        seconds = {name: 0.0 for name in "ABCD" if (out / f"{name}.txt").is_file()}
    else:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        seconds["A"] = demo(out, "A", 1, out / "cache-A", args.epochs, args.seeds)
        seconds["B"] = demo(out, "B", 2, out / "cache-B", args.epochs, args.seeds)
        shutil.copytree(out / "cache-A", out / "cache-C")
        seconds["C"] = demo(out, "C", 2, out / "cache-C", args.epochs, args.seeds)
    if not args.no_deterministic and not args.compare_only:
        seconds["D"] = demo(out, "D", None, out / "cache-D", args.epochs, args.seeds, "--deterministic")
    print(f"\nencoder, 1 vs 2 threads (caches A, B): {compare_caches(out / 'cache-A', out / 'cache-B')}")
    print("training and evaluation, 1 vs 2 threads, one cache (A vs C):")
    print("\n".join(compare_records(out / "A", out / "C")))
    print("the whole demo, 1 vs 2 threads (A vs B):")
    print("\n".join(compare_records(out / "A", out / "B")))
    if "D" in seconds:
        print("--deterministic vs --threads 1 (A vs D):")
        print("\n".join(compare_records(out / "A", out / "D")))
    tables = {name: (out / f"{name}.txt").read_text().split("\n\n")[0] for name in seconds}
    print("\ntables identical:", {f"A={name}": tables["A"] == tables[name] for name in seconds if name != "A"})
    print("wall seconds:", {name: round(s, 1) for name, s in seconds.items()}, "(C reused A's cache)")


if __name__ == "__main__":
    main()
