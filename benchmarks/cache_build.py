"""Feature-cache build throughput (images/s) and disk bytes per 1,000 cached features, on synthetic JPEGs.

Two random-weight backbones (no download): the 32-px ``atlas-tiny`` test model and a ViT-B/16-shaped CLIP at
224 px. Each is built from scratch (view 0 plus ``--views`` augmented views per image), then rebuilt to show that
a second build encodes nothing. Run from the repository root::

    python benchmarks/cache_build.py [--images 512] [--vit-images 128] [--views 3] [--workers N] [--device cuda]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from atlas_fast.clip.backbones import BackboneConfig, load_backbone
from atlas_fast.cache import FeatureCache
from atlas_fast.data.base import Datum


def write_images(folder: Path, count: int, width: int = 500, height: int = 375) -> list[Datum]:
    """``count`` noisy JPEGs of a typical benchmark size (500x375, like OxfordPets/Caltech photos)."""
    rng = np.random.default_rng(0)
    items = []
    for i in tqdm(range(count), desc="Writing synthetic JPEGs", unit="img"):
        path = folder / "images" / f"img_{i:05d}.jpg"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            base = rng.integers(0, 256, size=3)
            noise = rng.normal(0, 40, size=(height // 5, width // 5, 3))
            pixels = np.clip(base + np.kron(noise, np.ones((5, 5, 1))), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(path, quality=90)
        items.append(Datum(str(path), i % 10, f"class_{i % 10}", f"images/img_{i:05d}.jpg"))
    return items


def bench(name: str, config: BackboneConfig, items: list[Datum], views: int, cache_root: Path, workers: int | None,
          device: str | None, batch_size: int) -> None:
    backbone = load_backbone(config)
    cache = FeatureCache(cache_root)
    first = cache.build(backbone, "Synthetic", items, num_views=views, batch_size=batch_size, num_workers=workers,
                        device=device)
    start = time.perf_counter()
    second = cache.build(backbone, "Synthetic", items, num_views=views, batch_size=batch_size, num_workers=workers,
                         device=device, progress=False)
    rebuild_s = time.perf_counter() - start
    load_start = time.perf_counter()
    features = cache.load(backbone, "Synthetic", items, views=range(views + 1))
    load_s = time.perf_counter() - load_start
    stored = len(items) * (views + 1)
    size = first.path.stat().st_size
    print(f"\n== {name}: {backbone.describe()}, {backbone.preprocessing.image_size}px, D={backbone.embed_dim}, "
          f"device={device or ('cuda' if torch.cuda.is_available() else 'cpu')}, threads={torch.get_num_threads()}")
    print(f"build : {first.encoded} features ({len(items)} images x {views + 1} views) in {first.seconds:.1f} s "
          f"= {first.images_per_s:.1f} images/s")
    print(f"again : encoded {second.encoded}, reused {second.reused} in {rebuild_s:.2f} s")
    print(f"load  : {tuple(features.shape)} float32 in {load_s:.3f} s")
    print(f"disk  : {size} bytes for {stored} features = {size / stored * 1000 / 1e6:.3f} MB per 1,000 features "
          f"(float16 payload alone: {backbone.embed_dim * 2 * 1000 / 1e6:.3f} MB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=512, help="images for the tiny model")
    parser.add_argument("--vit-images", type=int, default=128, help="images for the ViT-B/16-shaped model")
    parser.add_argument("--views", type=int, default=3, help="augmented views per image (plus view 0)")
    parser.add_argument("--vit-views", type=int, default=0, help="augmented views per image for ViT-B/16")
    parser.add_argument("--workers", type=int, default=None, help="decoding processes (default: by CPU count)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default=None, help="torch device (default cuda if available)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where images and caches go (default: temp)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        items = write_images(work / "data", max(args.images, args.vit_images))
        bench("atlas-tiny", BackboneConfig("atlas-tiny", None), items[:args.images], args.views, work / "cache",
              args.workers, args.device, args.batch_size)
        bench("ViT-B/16 (random weights)", BackboneConfig("ViT-B-16", None), items[:args.vit_images],
              args.vit_views, work / "cache", args.workers, args.device, args.batch_size)


if __name__ == "__main__":
    main()
