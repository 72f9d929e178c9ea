"""Where a feature-cache build's time goes, and the new build against the one before it, side by side in one run.

Three parts, each printing ratios measured in this run (``--parts`` picks them):

* ``views``: the CPU work per view, on one core: decoding an image, cutting a view (seeded crop, bicubic resize,
  flip) and ToTensor + Normalize; before (torchvision's functions on each PIL view, as the cache computed views up
  to this change) and now (8-bit pixels in the worker, normalised as one batch on the encoder's device); on the
  world benchmark's 32 x 32 PNGs at the world CLIP's 32 px and on 500 x 375 JPEGs (an average photo of the paper's
  datasets) at ViT-B/16's 224 px. Views are checked equal, bit for bit.
* ``write``: cache write throughput for images of 51 views (Table III's longest cached recipe: view 0 + 50) and of
  one view, random 512-dim features in float16, no encoder: the writer before (one transaction per encoded batch
  of 64 views, i.e. per image, in series) against the writer thread (transactions of whole 64-row blocks).
* ``build``: a whole build (``--model``: the demo's world CLIP on world images, or e.g. ViT-B-16 with random
  weights on 500 x 375 JPEGs; ``--views`` augmented views per image) against its encoding alone (normalising and
  encoding the same batches of cut views, as the build's own thread does) plus its view cutting alone (one process):
  the build before (``--baseline``'s code) and now, alternating for ``--rounds`` rounds, with the time by stage of
  the new one, and whether both files hold the same bytes.
* ``threads`` (not by default): the world CLIP's encoder alone on the demo's batches in fresh processes, with 2
  OpenMP threads as torch starts them, with 2 that sleep when they wait (``OMP_WAIT_POLICY=PASSIVE``) and with 1;
  whether the features are the same bits.

The code before is read from git (``--baseline``, default the commit this change started from); without git the
parts compare nothing and say so. Run from the repository root (the machine's load is printed with each part)::

    python benchmarks/cache_build.py [--parts views,write,build] [--images 192] [--views 50] [--baseline REV]
    python benchmarks/cache_build.py --parts build --model ViT-B-16 --images 8 --views 3    # ViT-B/16 on the CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from atlas_fast.cache import FeatureCache  # noqa: E402
from atlas_fast.cache.build import Writer, _batches  # noqa: E402
from atlas_fast.clip import transforms  # noqa: E402
from atlas_fast.clip.backbones import BackboneConfig, load_backbone  # noqa: E402
from atlas_fast.data.base import Datum  # noqa: E402

BASELINE = "f9ca88d"  # the commit before the writer thread and 8-bit views
PAYLOAD_DIM = 512  # ViT-B/16's features


def load() -> str:
    return "load " + " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else ""


def baseline_module(rev: str, path: str, name: str) -> ModuleType | None:
    """``path`` as it was at ``rev``, imported as module ``name`` (None when git cannot show it)."""
    try:
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True,
                                text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    folder = Path(tempfile.mkdtemp(prefix="atlas_baseline_"))
    (folder / f"{name}.py").write_text(source)
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def baseline(rev: str) -> tuple[ModuleType, ModuleType] | None:
    """(transforms, build) of ``rev``; the old build module computes views with the old transforms."""
    old_transforms = baseline_module(rev, "atlas_fast/clip/transforms.py", "baseline_transforms")
    old_build = baseline_module(rev, "atlas_fast/cache/build.py", "baseline_build")
    if old_transforms is None or old_build is None:
        return None
    old_build.load_views = old_transforms.load_views
    return old_transforms, old_build


def world_images(folder: Path, count: int) -> list[Datum]:
    """``count`` training images of the demo's world benchmark (generated under ``folder``)."""
    from atlas_fast.data import load_dataset
    from atlas_fast.world.benchmark import DECLINE_DATASET, SplitSizes, generate_benchmark

    train = max(1, -(-count // 24))
    generate_benchmark(folder, [DECLINE_DATASET], sizes=SplitSizes(train=train, val=1, test=1), progress=False)
    return load_dataset(DECLINE_DATASET, folder).train[:count]


def photos(folder: Path, count: int) -> list[Datum]:
    """``count`` noisy 500 x 375 JPEGs (quality 90)."""
    rng = np.random.default_rng(0)
    items = []
    for i in range(count):
        path = folder / "images" / f"photo_{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        noise = rng.normal(0, 40, size=(75, 100, 3))
        pixels = np.clip(rng.integers(0, 256, size=3) + np.kron(noise, np.ones((5, 5, 1))), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
        items.append(Datum(str(path), 0, "photo", f"images/photo_{i:04d}.jpg"))
    return items


def timed(call, repeats: int = 3) -> float:
    """Fastest of ``repeats`` calls (seconds): the least disturbed by other jobs on a shared machine."""
    best = float("inf")
    for _ in range(repeats):
        clock = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - clock)
    return best


# ----------------------------------------------------------------------------------------------------------- views

def part_views(work: Path, old: tuple[ModuleType, ModuleType] | None, views: int) -> None:
    torch.set_num_threads(1)
    cases = [("world PNG 32x32 -> 32 px", world_images(work / "world", 16), 32),
             ("JPEG 500x375 -> 224 px", photos(work / "photos", 8), 224)]
    print(f"\n== CPU work per view, one core ({load()}); {views} augmented views + view 0 per image; fastest of 3")
    print(f"| images | decode / image | crop + resize / view | before: view / view | now: 8-bit view | "
          f"now: normalise | before / now |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, items, size in cases:
        spec = transforms.TransformSpec.from_preprocessing(transforms.Preprocessing(size))
        wanted = list(range(views + 1))
        count = len(items) * len(wanted)
        images = [transforms.read_image(d.impath) for d in items]
        decode = timed(lambda: [transforms.read_image(d.impath) for d in items]) / len(items)

        def crops() -> None:
            for d, image in zip(items, images):
                for v in wanted[1:]:
                    g = torch.Generator().manual_seed(transforms.view_seed(0, d.key, v))
                    top, left, h, w = transforms.random_resized_crop_params(image.width, image.height,
                                                                            spec.crop_scale, spec.crop_ratio, g)
                    image.crop((left, top, left + w, top + h)).resize((size, size), Image.Resampling.BICUBIC)

        resize = timed(crops) / (count - len(items))
        pixels = [transforms.load_view_pixels(d.impath, d.key, wanted, spec) for d in items]
        cut = (timed(lambda: all(transforms.load_view_pixels(d.impath, d.key, wanted, spec) is not None
                                 for d in items)) / len(items) - decode) / len(wanted)
        normalise = timed(lambda: all(transforms.normalize_pixels(p, spec) is not None for p in pixels)) / count
        new_views = [transforms.normalize_pixels(p, spec) for p in pixels]
        if old is not None:
            before = (timed(lambda: all(old[0].load_views(d.impath, d.key, wanted, spec) is not None
                                        for d in items)) / len(items) - decode) / len(wanted)
            equal = all(torch.equal(a, old[0].load_views(d.impath, d.key, wanted, spec))
                        for a, d in zip(new_views, items))
            ratio = f"{before / (cut + normalise):.2f}x" + ("" if equal else " (VIEWS DIFFER)")
            before_text = f"{before * 1e6:.0f} us"
        else:
            ratio, before_text = "n/a", "n/a (no git)"
        print(f"| {name} | {decode * 1e6:.0f} us | {resize * 1e6:.0f} us | {before_text} | {cut * 1e6:.0f} us | "
              f"{normalise * 1e6:.0f} us | {ratio} |")
    print("(views equal bit for bit before and now)" if old is not None else "")


# ----------------------------------------------------------------------------------------------------------- write

def prepared_file(root: Path, backbone, items: list[Datum], views: int) -> tuple[FeatureCache, Path, list]:
    """A cache file with rows for ``items`` and room for ``views`` views; the units a build would encode."""
    cache = FeatureCache(root)
    path = cache.path_for(backbone, "Synthetic")
    from atlas_fast.cache.format import expected_attrs
    from atlas_fast.data.identity import image_identities

    spec = backbone.transform
    path.parent.mkdir(parents=True, exist_ok=True)
    units, _ = cache._prepare(path, backbone, expected_attrs(backbone, "Synthetic", spec), items,
                              image_identities(items, False), list(range(views + 1)), "fp32",
                              torch.device("cpu"))
    return cache, path, units


def part_write(work: Path, old: tuple[ModuleType, ModuleType] | None, images: int) -> None:
    backbone = load_backbone(BackboneConfig("ViT-B-16", None))  # the file's layout (512-dim); nothing is encoded
    (work / "blank.jpg").write_bytes(b"")  # the rows' image identity; nothing is decoded here
    items = [Datum(str(work / "blank.jpg"), 0, "x", f"images/img_{i:05d}.jpg") for i in range(images)]
    print(f"\n== Cache write throughput ({load()}): {images} images, random {PAYLOAD_DIM}-dim float16 features, "
          f"batches of 64 views as the encoder hands them over")
    print("| views per image | before: MB/s (transactions) | now: MB/s (transactions) | now / before |")
    print("|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for views in (50, 0):
        rates = {}
        for version in ("before", "now"):
            if version == "before" and old is None:
                continue
            root = work / f"write-{version}-{views}"
            shutil.rmtree(root, ignore_errors=True)
            cache, path, units = prepared_file(root, backbone, items, views)
            batches = []
            for batch in _batches(units, 64):
                rows = np.array([units[i][1] for i in batch for _ in units[i][2]])
                cells = np.array([v for i in batch for v in units[i][2]])
                batches.append((rows, cells, rng.standard_normal((len(rows), PAYLOAD_DIM), dtype=np.float32)))
            payload = sum(len(r) for r, _, _ in batches) * PAYLOAD_DIM * 2
            clock = time.perf_counter()
            if version == "before":
                writer = old[1].CacheBuilder(root)
                for rows, cells, features in batches:
                    writer._commit(path, rows, cells, features)
                transactions = len(batches)
            else:
                with Writer(cache._commit, path, cache.transaction_bytes, cache.transaction_seconds) as writer:
                    for rows, cells, features in batches:
                        writer.put(rows, cells, features)
                transactions = writer.transactions
            seconds = time.perf_counter() - clock
            rates[version] = payload / seconds / 1e6
            rates[version + " n"] = transactions
        before = (f"{rates['before']:.1f} ({rates['before n']})" if "before" in rates else "n/a (no git)")
        ratio = f"{rates['now'] / rates['before']:.1f}x" if "before" in rates else "n/a"
        print(f"| {views + 1} | {before} | {rates['now']:.1f} ({rates['now n']}) | {ratio} |")


# ----------------------------------------------------------------------------------------------------------- build

def part_build(work: Path, old: tuple[ModuleType, ModuleType] | None, images: int, views: int,
               workers: int | None, model: str, rounds: int) -> None:
    import statistics

    import h5py

    world = model == "atlas-world"
    backbone = load_backbone(BackboneConfig(model, "atlas-world" if world else None))
    spec = backbone.transform
    items = world_images(work / "world", images) if world else photos(work / "photos", images)
    wanted = list(range(views + 1))
    units = [(d, i, wanted) for i, d in enumerate(items)]
    batches = _batches(units, 64)
    print(f"\n== Build vs its encoding + view cutting alone ({load()}): {model} ({spec.image_size} px), "
          f"{len(items)} {'world images' if world else 'JPEGs 500x375'} x {views + 1} views = "
          f"{len(items) * len(wanted)} features, {torch.get_num_threads()} threads; {rounds} round(s), before and "
          f"now alternating, median")
    versions = ["before", "now"] if old is not None else ["now"]
    measured: dict[str, list[float]] = {name: [] for name in ["cut", "encode", *versions]}
    for round_ in range(rounds):
        clock = time.perf_counter()  # what the workers do
        pixels = [transforms.load_view_pixels(d.impath, d.key, wanted, spec) for d in items]
        measured["cut"].append(time.perf_counter() - clock)
        clock = time.perf_counter()  # what the build's own thread does
        with torch.no_grad():
            for batch in batches:
                backbone.encode_image(transforms.normalize_pixels(np.concatenate([pixels[i] for i in batch]), spec))
        measured["encode"].append(time.perf_counter() - clock)
        del pixels
        for version in versions if round_ % 2 == 0 else versions[::-1]:
            root = work / f"build-{version}"
            shutil.rmtree(root, ignore_errors=True)
            builder = old[1].CacheBuilder(root) if version == "before" else FeatureCache(root)
            report = builder.build(backbone, "Images", items, num_views=views, num_workers=workers, progress=False)
            measured[version].append(report.seconds)
            if version == "now":
                stages = report
    median = {name: statistics.median(values) for name, values in measured.items()}
    alone = median["encode"] + median["cut"]
    print(f"| build | wall | / (encode {median['encode']:.1f} s + cut {median['cut']:.1f} s alone) |")
    print("|---|---:|---:|")
    for version in versions:
        print(f"| {version} | {median[version]:.1f} s | {median[version] / alone:.2f}x |")
    if old is not None:
        print(f"now / before: {median['now'] / median['before']:.2f}x the wall time (rounds: "
              f"{', '.join(f'{a / b:.2f}' for a, b in zip(measured['now'], measured['before']))})")
        with h5py.File(FeatureCache(work / "build-before").path_for(backbone, "Images"), "r") as a, \
                h5py.File(FeatureCache(work / "build-now").path_for(backbone, "Images"), "r") as b:
            same = all(np.array_equal(a[n][...], b[n][...]) for n in ("keys", "features", "done"))
        print(f"both files hold the same features, bit for bit: {same}")
    print(f"now, by stage (last round): encoding {stages.encode_seconds:.1f} s, waiting for views "
          f"{stages.input_wait_seconds:.1f} s (caller's thread); writing {stages.write_seconds:.2f} s in "
          f"{stages.transactions} transaction(s) beside it; {stages.workers} decoding worker(s)")
    size = stages.path.stat().st_size
    print(f"disk: {size / stages.encoded * 1000 / 1e6:.3f} MB per 1,000 features ({backbone.embed_dim}-dim float16: "
          f"{backbone.embed_dim * 2 * 1000 / 1e6:.3f} MB of it the features themselves)")


# --------------------------------------------------------------------------------------------------------- threads

ENCODER_CHILD = """
import sys, time, json, hashlib, torch
from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.clip import transforms
threads, seconds, folder = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
torch.set_num_threads(threads)
backbone = load_backbone(BackboneConfig("atlas-world", "atlas-world"))
batches = torch.load(folder + "/batches.pt")
out = {}
with torch.no_grad():
    for batch in batches:
        backbone.encode_image(batch)  # warm-up
    digest = hashlib.blake2b(b"".join(backbone.encode_image(b).numpy().tobytes() for b in batches)).hexdigest()
    for batch in batches:
        clock, n = time.perf_counter(), 0
        while time.perf_counter() - clock < seconds:
            backbone.encode_image(batch)
            n += 1
        out[len(batch)] = (time.perf_counter() - clock) / n / len(batch)
print(json.dumps({"per_view": out, "digest": digest}))
"""


def part_threads(work: Path, rounds: int) -> None:
    """The world CLIP's encoder alone on the demo's batches (201 views of one image; 64 test views), in fresh
    processes: 2 threads with OpenMP's default waiting, 2 threads with ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads
    sleep instead of spinning: the same split of the work, so the same bits), and 1 thread; alternated
    ``rounds`` times, the median of each."""
    import json
    import statistics

    backbone = load_backbone(BackboneConfig("atlas-world", "atlas-world"))
    items = world_images(work / "world", 2)
    spec = backbone.transform
    train = transforms.normalize_pixels(transforms.load_view_pixels(items[0].impath, items[0].key,
                                                                    list(range(201)), spec), spec)
    test = transforms.normalize_pixels(np.concatenate([transforms.load_view_pixels(d.impath, d.key, [0], spec)
                                                       for d in items] * 32), spec)
    torch.save([train, test], work / "batches.pt")
    settings = {"2 threads": ("2", {}), "2 threads, OMP_WAIT_POLICY=PASSIVE": ("2", {"OMP_WAIT_POLICY": "PASSIVE"}),
                "1 thread": ("1", {})}
    times: dict[str, dict[str, list[float]]] = {name: {} for name in settings}
    digests: dict[str, set[str]] = {name: set() for name in settings}
    print(f"\n== The world CLIP's encoder alone, fresh processes ({load()}), {rounds} alternated rounds, median")
    for _ in range(rounds):
        for name, (threads, env) in settings.items():
            result = subprocess.run([sys.executable, "-c", ENCODER_CHILD, threads, "3", str(work)], check=True,
                                    capture_output=True, text=True, cwd=ROOT,
                                    env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads, **env})
            data = json.loads(result.stdout.strip().splitlines()[-1])
            digests[name].add(data["digest"])
            for size, seconds in data["per_view"].items():
                times[name].setdefault(size, []).append(seconds)
    first = next(iter(settings))
    print("| encoder threads | ms/view, batch of 201 (train) | ms/view, batch of 64 (test) | vs 2 threads | "
          "features equal to 2 threads' |")
    print("|---|---:|---:|---:|---|")
    for name in settings:
        medians = {size: statistics.median(values) for size, values in times[name].items()}
        base = {size: statistics.median(values) for size, values in times[first].items()}
        ratio = " / ".join(f"{base[size] / medians[size]:.2f}x" for size in medians)
        same = "yes" if digests[name] == digests[first] and len(digests[name]) == 1 else "NO"
        print(f"| {name} | {1e3 * medians['201']:.2f} | {1e3 * medians['64']:.2f} | {ratio} | {same} |")
    print(f"({load()} at the end)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="views,write,build",
                        help="comma-separated: views, write, build, threads (default views,write,build)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternated rounds of the build and threads parts (default 3)")
    parser.add_argument("--baseline", default=BASELINE, help=f"git revision of the code before (default {BASELINE})")
    parser.add_argument("--images", type=int, default=192, help="images of the build part (default 192)")
    parser.add_argument("--views", type=int, default=50, help="augmented views per image (default 50)")
    parser.add_argument("--write-images", type=int, default=384, help="images of the write part (default 384)")
    parser.add_argument("--workers", type=int, default=None, help="decoding processes (default: the builder's)")
    parser.add_argument("--model", default="atlas-world",
                        help="the build part's CLIP: atlas-world (the demo's, on world images; default) or an "
                             "open_clip model with random weights on 500x375 JPEGs, e.g. ViT-B-16")
    parser.add_argument("--work-dir", type=Path, default=None, help="images and caches (default: a temp folder)")
    args = parser.parse_args()
    old = baseline(args.baseline)
    threads = torch.get_num_threads()
    print(f"code before: {args.baseline if old else 'not available (git show failed)'}; {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        parts = args.parts.split(",")
        if "views" in parts:
            part_views(work, old, args.views)
        torch.set_num_threads(threads)
        if "write" in parts:
            part_write(work, old, args.write_images)
        if "build" in parts:
            part_build(work, old, args.images, args.views, args.workers, args.model, args.rounds)
        if "threads" in parts:
            part_threads(work, args.rounds)
    print(f"\n{load()} at the end")


if __name__ == "__main__":
    main()
