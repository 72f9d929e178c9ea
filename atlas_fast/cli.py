"""The ``atlas-fast`` command line. Each command group adds its subparsers in one ``add_<group>_commands`` function
and handles them in functions named ``run_<group>_<command>``; :func:`build_parser` lists the groups."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence


def _pretrained(value: str) -> str | None:
    return None if value.lower() in ("none", "random", "") else value


def _split_names(value: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in value.split(",") if s.strip())
    bad = [s for s in names if s not in ("train", "val", "test")]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--split takes a comma list of train,val,test; got {value!r}.")
    return names


def add_cache_commands(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast cache build|info``."""
    cache = subparsers.add_parser("cache", help="build or list the HDF5 image-feature cache")
    commands = cache.add_subparsers(dest="cache_command", required=True)

    build = commands.add_parser(
        "build", help="encode the images of a dataset (views 0..V for train, view 0 for val/test); only what is missing",
        description="Encode the images of a dataset once with a frozen CLIP image encoder. Train images get views "
                    "0..V (0 = test transform, 1..V = seeded augmentations), val/test images view 0. With --shots "
                    "and --seed, train/val are the few-shot subsets (test stays full).")
    build.add_argument("--dataset", required=True, help="dataset registry name, e.g. OxfordPets")
    build.add_argument("--data-root", required=True, type=Path, help="folder that holds the dataset folders")
    build.add_argument("--model", default="ViT-B-16", help="open_clip model name (default ViT-B-16)")
    build.add_argument("--pretrained", type=_pretrained, default="openai",
                       help="open_clip tag, checkpoint file, or 'none' for random weights (default openai)")
    build.add_argument("--views", type=int, default=0, help="augmented views per train image (default 0)")
    build.add_argument("--aug-seed", type=int, default=0, help="seed of the augmented views (default 0)")
    build.add_argument("--shots", type=int, default=None, help="few-shot K: train/val become K-shot subsets")
    build.add_argument("--seed", type=int, nargs="+", default=None,
                       help="few-shot seed(s), e.g. --seed 1 2 3 (required with --shots)")
    build.add_argument("--split", type=_split_names, default=("train", "val", "test"),
                       help="comma list of the splits to encode (default train,val,test)")
    build.add_argument("--subsample", choices=("all", "base", "new"), default="all",
                       help="base-to-new class subset (default all)")
    build.add_argument("--cache-root", type=Path, default=Path("cache"), help="cache folder (default ./cache)")
    build.add_argument("--batch-size", type=int, default=64, help="images per encoder batch (default 64)")
    build.add_argument("--workers", type=int, default=None, help="image decoding processes (default: by CPU count)")
    build.add_argument("--device", default=None, help="torch device (default cuda if available, else cpu)")
    build.add_argument("--precision", choices=("auto", "fp32", "fp16", "bf16"), default="auto",
                       help="encoder precision (default auto: fp16 autocast on CUDA, fp32 on CPU)")
    build.add_argument("--storage-dtype", choices=("float16", "float32"), default="float16",
                       help="dtype of stored features for new cache files (default float16)")
    build.set_defaults(func=run_cache_build)

    info = commands.add_parser("info", help="list what is cached, with sizes")
    info.add_argument("--cache-root", type=Path, default=Path("cache"), help="cache folder (default ./cache)")
    info.set_defaults(func=run_cache_info)


def run_cache_build(args: argparse.Namespace) -> int:
    from atlas_fast.backbones import BackboneConfig, load_backbone
    from atlas_fast.cache import FeatureCache
    from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes

    if (args.shots is None) != (args.seed is None):
        raise SystemExit("error: --shots and --seed go together (e.g. --shots 16 --seed 1 2 3).")
    if args.views < 0:
        raise SystemExit(f"error: --views must be >= 0, got {args.views}.")
    splits = load_dataset(args.dataset, args.data_root)
    if args.shots is None:
        variants = [splits]
    else:
        variants = [fewshot_subset(splits, args.shots, seed, store_dir=args.cache_root / splits.name / "split_fewshot")
                    for seed in args.seed]
    variants = [subsample_classes(v, args.subsample) for v in variants]

    train = [d for v in variants for d in v.train] if "train" in args.split else []
    eval_items = [d for v in variants for name in ("val", "test") if name in args.split for d in getattr(v, name)]

    device = args.device
    backbone = load_backbone(BackboneConfig(args.model, args.pretrained), device or "cpu")
    cache = FeatureCache(args.cache_root, storage_dtype=args.storage_dtype)
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
              f"({report.images_per_s:.1f} img/s) -> {report.path}")
    print(f"Done: encoded {total_encoded}, reused {total_reused} features.")
    return 0


def run_cache_info(args: argparse.Namespace) -> int:
    from atlas_fast.cache import FeatureCache

    print(FeatureCache(args.cache_root).info())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atlas-fast", description="Feature-cache-first prompt tuning of CLIP.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_cache_commands(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``atlas-fast`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
