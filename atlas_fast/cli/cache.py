"""``atlas-fast cache build|info``: encode a dataset's images into the HDF5 feature cache, list what is cached."""

from __future__ import annotations

import argparse

from atlas_fast.app.options import add_data_and_backbone, add_options, add_workers, check_range, resolve_backbone
from atlas_fast.vocabulary import CACHE_PRECISIONS, CLASS_SETS, STORAGE_DTYPES
from atlas_fast.errors import UsageError


def _split_names(value: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in value.split(",") if s.strip())
    bad = [s for s in names if s not in ("train", "val", "test")]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--split takes a comma list of train,val,test; got {value!r}.")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast cache build|info``."""
    cache = subparsers.add_parser("cache", help="build or list the HDF5 image-feature cache")
    commands = cache.add_subparsers(dest="cache_command", required=True)

    build = commands.add_parser(
        "build", help="encode the images of a dataset (views 0..V for train, view 0 for val/test); only what is missing",
        description="Encode the images of a dataset once with a frozen CLIP image encoder. Train images get views "
                    "0..V (0 = test transform, 1..V = seeded augmentations), val/test images view 0. With --shots "
                    "and --seed, train/val are the few-shot subsets (test stays full).")
    add_data_and_backbone(build)
    build.add_argument("--views", type=int, default=0, help="augmented views per train image (default 0)")
    add_options(build, ("aug_seed",))
    build.add_argument("--shots", type=int, default=None, help="few-shot K: train/val become K-shot subsets")
    build.add_argument("--seeds", "--seed", dest="seeds", type=int, nargs="+", default=None, metavar="SEED",
                       help="few-shot seed(s), e.g. --seeds 1 2 3 (required with --shots)")
    build.add_argument("--split", type=_split_names, default=("train", "val", "test"),
                       help="comma list of the splits to encode (default train,val,test)")
    build.add_argument("--subsample", choices=CLASS_SETS, default="all",
                       help="base-to-new class subset (default all)")
    add_options(build, ("cache_root",))
    build.add_argument("--batch-size", type=int, default=64, help="images per encoder batch (default 64)")
    add_workers(build)
    build.add_argument("--device", default=None, help="torch device (default cuda if available, else cpu)")
    build.add_argument("--precision", choices=CACHE_PRECISIONS, default="auto",
                       help="encoder precision (default auto: fp16 autocast on CUDA, fp32 on CPU)")
    build.add_argument("--storage-dtype", choices=STORAGE_DTYPES, default="float16",
                       help="dtype of stored features for new cache files (default float16)")
    add_options(build, ("content_hash",))
    build.set_defaults(func=run_cache_build)

    info = commands.add_parser("info", help="list what is cached, with sizes (--verify: check every checksum)")
    add_options(info, ("cache_root",))
    info.add_argument("--verify", action="store_true",
                      help="read every chunk and check its checksum; exit status 1 if a file is damaged")
    info.set_defaults(func=run_cache_info)


def run_cache_build(args: argparse.Namespace) -> int:
    from atlas_fast.data.check import require_layouts  # no torch

    if (args.shots is None) != (args.seeds is None):
        raise UsageError("--shots and --seeds go together (e.g. --shots 16 --seeds 1 2 3).")
    if args.views < 0:
        raise UsageError(f"--views must be >= 0, got {args.views}.")
    require_layouts([args.dataset], args.data_root)  # the data root's faults before torch is imported
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone
    from atlas_fast.engine.config import resolve_device
    from atlas_fast.cache import FeatureCache
    from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes
    from atlas_fast.data.fewshot import MAX_SEED
    from atlas_fast.engine.config import MAX_BATCH_SIZE, MAX_VIEWS, MAX_WORKERS
    from atlas_fast.errors import distinct

    check_range("--shots", args.shots, 1)  # a K below 1 would encode the whole dataset
    check_range("--views", args.views, 0, MAX_VIEWS)
    check_range("--aug-seed", args.aug_seed, 0, MAX_SEED)
    check_range("--batch-size", args.batch_size, 1, MAX_BATCH_SIZE)
    check_range("--workers", args.workers, 0, MAX_WORKERS)
    for seed in distinct(args.seeds or [], "--seeds"):
        check_range("--seeds", seed, 0, MAX_SEED)
    resolve_backbone(args)  # a World* dataset without --model/--pretrained: the world's CLIP
    splits = load_dataset(args.dataset, args.data_root)
    if args.shots is None:
        variants = [splits]
    else:
        variants = [fewshot_subset(splits, args.shots, seed, store_dir=args.cache_root / splits.name / "split_fewshot")
                    for seed in args.seeds]
    variants = [subsample_classes(v, args.subsample) for v in variants]

    train = [d for v in variants for d in v.train] if "train" in args.split else []
    eval_items = [d for v in variants for name in ("val", "test") if name in args.split for d in getattr(v, name)]

    device = str(resolve_device(args.device or "auto"))
    backbone = load_backbone(BackboneConfig(args.model, args.pretrained), device)
    cache = FeatureCache(args.cache_root, storage_dtype=args.storage_dtype, content_hash=args.content_hash)
    common = dict(aug_seed=args.aug_seed, batch_size=args.batch_size, num_workers=args.workers, device=device,
                  precision=args.precision)
    total_encoded = total_reused = 0
    for label, items, views in (("train", train, args.views), ("val/test", eval_items, 0)):
        if not items:
            continue
        report = cache.build(backbone, splits.name, items, num_views=views, **common)
        total_encoded += report.encoded
        total_reused += report.reused
        print(f"{splits.name} {label}: {len(set(d.key for d in items))} images x views 0..{views}: "
              f"encoded {report.encoded}, reused {report.reused}, {report.seconds:.1f} s "
              f"({report.images_per_s:.1f} views/s) -> {report.path}")
    print(f"Done: encoded {total_encoded}, reused {total_reused} features.")
    return 0


def run_cache_info(args: argparse.Namespace) -> int:
    from atlas_fast.cache import FeatureCache

    cache = FeatureCache(args.cache_root)
    entries = cache.entries(verify=args.verify)
    print(cache.info(verify=args.verify, entries=entries))
    return 1 if args.verify and any(e.problem for e in entries) else 0
