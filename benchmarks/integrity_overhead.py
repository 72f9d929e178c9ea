"""What data identity and cache integrity cost: a cache build and load, and the start of a training run, with the
checks on and off, measured side by side in one run.

"off" disables, by patching this process only, what issue 7 added: image identities (every row gets one constant
id), fletcher32 checksums, the keys digest and the per-transaction space reservation; for a training start it skips
the data listing and fingerprint that now come before the skip check of a finished run. "content" identifies images
by a BLAKE2b of their bytes (``--content-hash``). Random-weight tiny model, synthetic JPEGs; run from the repository
root::

    PYTHONPATH=. python benchmarks/integrity_overhead.py [--images 1000] [--views 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import h5py
import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

import atlas_fast.cache.build as cache_build
import atlas_fast.cache.format as cache_format
import atlas_fast.cache.read as cache_read
from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.cache import FeatureCache
from atlas_fast.data import load_dataset
from atlas_fast.data.identity import subset_fingerprint
from atlas_fast.engine.spec import plan_run
from atlas_fast.engine import TrainConfig, run

TINY = BackboneConfig("atlas-tiny", None)


def write_dataset(root: Path, images: int, classes: int = 20) -> Path:
    """An OxfordPets-layout dataset (split JSON + JPEGs of 160x120) with ``images`` train images, a fifth as many
    test images."""
    import json

    folder = root / "oxford_pets"
    rng = np.random.default_rng(0)
    split = {"train": [], "val": [], "test": []}
    total = images + images // 5
    for i in tqdm(range(total), desc="writing JPEGs", unit="img"):
        name, label = f"img_{i:06d}.jpg", i % classes
        path = folder / "images" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = np.clip(rng.integers(0, 256, 3) + rng.normal(0, 30, (120, 160, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(path, quality=85)
        split["train" if i < images else "test"].append([name, label, f"class_{label}"])
    (folder / "split_zhou_OxfordPets.json").write_text(json.dumps(split))
    return root


@contextlib.contextmanager
def checks_off():
    """Patch out what issue 7 added to the cache (this process only)."""
    create = h5py.Group.create_dataset

    def without_checksums(self, *args, **kwargs):
        kwargs.pop("fletcher32", None)
        return create(self, *args, **kwargs)

    with mock.patch.object(h5py.Group, "create_dataset", without_checksums), \
            mock.patch.object(cache_build, "image_identities", lambda items, content=False: ["-"] * len(items)), \
            mock.patch.object(cache_read, "image_identities", lambda items, content=False: ["-"] * len(items)), \
            mock.patch.object(cache_build, "keys_digest", lambda keys, ids: "-"), \
            mock.patch.object(cache_format, "keys_digest", lambda keys, ids: "-"), \
            mock.patch.object(cache_build, "reserve", lambda *args: None):
        yield


def timed(function, repeats: int) -> float:
    """Median seconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cache_rows(backbone, items, views: int, work: Path, repeats: int) -> list[tuple[str, float, float, float]]:
    """(mode, build s, rebuild-nothing-to-do s, load s) per mode; modes interleaved after one warm-up build."""
    modes = ("off", "on", "content")
    contexts = {"off": checks_off, "on": contextlib.nullcontext, "content": contextlib.nullcontext}
    FeatureCache(work / "warmup").build(backbone, "OxfordPets", items, num_views=views, batch_size=256,
                                        num_workers=0, progress=False)
    builds: dict[str, list[float]] = {mode: [] for mode in modes}
    caches = {}
    for r in range(repeats):
        for mode in modes:
            with contexts[mode]():
                caches[mode] = FeatureCache(work / f"{mode}{r}", content_hash=mode == "content")
                start = time.perf_counter()
                caches[mode].build(backbone, "OxfordPets", items, num_views=views, batch_size=256, num_workers=0,
                                   progress=False)
                builds[mode].append(time.perf_counter() - start)
    rows = []
    for mode in modes:
        cache = caches[mode]
        with contexts[mode]():
            rebuild = timed(lambda: cache.build(backbone, "OxfordPets", items, num_views=views, num_workers=0,
                                                progress=False), repeats)
            load = timed(lambda: cache.load(backbone, "OxfordPets", items, views=range(views + 1)), repeats)
        rows.append((mode, statistics.median(builds[mode]), rebuild, load))
    return rows


def start_rows(data: Path, work: Path, repeats: int) -> list[tuple[str, float]]:
    """Seconds to return a finished run's record (the skip path of a sweep), and what its data steps cost."""
    config = TrainConfig("OxfordPets", data, backbone=TINY, setting="few_shot", shots=16, epochs=1, views=1,
                         cache_root=work / "cache", results_dir=work / "results", progress=False)
    run(config)  # trains once; every timed call below finds its record
    plan_only = timed(lambda: plan_run(config).key, repeats)  # before issue 7: a finished run was found here
    listing = timed(lambda: load_dataset("OxfordPets", data), repeats)
    full = load_dataset("OxfordPets", data)
    subset = plan_run(config).data.fewshot
    fingerprint = timed(lambda: subset_fingerprint(full, subset), repeats)
    content = timed(lambda: subset_fingerprint(full, subset, content=True), repeats)
    skipped = timed(lambda: run(config), repeats)
    return [("plan only (the old skip check)", plan_only), ("list the dataset (split JSON, stat each file)", listing),
            ("fingerprint the run's images (size, mtime)", fingerprint),
            ("fingerprint the run's images (content hash)", content),
            ("return a finished run now (plan + list + fingerprint + record check)", skipped)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000, help="train images (plus a fifth as many test images)")
    parser.add_argument("--views", type=int, default=2, help="augmented views per image in the cache build")
    parser.add_argument("--repeats", type=int, default=3, help="median of this many timings")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = write_dataset(work / "data", args.images)
        backbone = load_backbone(TINY)
        items = list(load_dataset("OxfordPets", data).train)
        print(f"\n== cache: {len(items)} images x {args.views + 1} views, atlas-tiny (32 px, D=64), float16, "
              f"{args.threads} thread(s), median of {args.repeats}")
        rows = cache_rows(backbone, items, args.views, work, args.repeats)
        base = {name: value for name, *value in rows}["off"]
        print(f"{'checks':8} {'build s':>9} {'ratio':>6} {'no-op rebuild s':>16} {'ratio':>6} {'load s':>8} "
              f"{'ratio':>6}")
        for mode, build, rebuild, load in rows:
            print(f"{mode:8} {build:9.3f} {build / base[0]:6.2f} {rebuild:16.4f} {rebuild / base[1]:6.2f} "
                  f"{load:8.4f} {load / base[2]:6.2f}")
        print(f"\n== training start: {len(items)} train + {len(items) // 5} test images, 16-shot few-shot run, "
              f"median of {args.repeats}")
        for name, seconds in start_rows(data, work, args.repeats):
            print(f"{seconds:9.4f} s  {name}")


if __name__ == "__main__":
    main()
