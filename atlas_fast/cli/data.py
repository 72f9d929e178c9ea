"""``atlas-fast data check`` and ``atlas-fast data sort-imagenet-val`` (see :mod:`atlas_fast.data.check`), and
``atlas-fast data standins`` (see :mod:`atlas_fast.world.standins`); nothing heavy is imported until a command runs."""

from __future__ import annotations

import argparse
from pathlib import Path

ALL = "all"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast data check|sort-imagenet-val|standins``."""
    data = subparsers.add_parser("data", help="check a data root (layout, counts, images), fix ImageNet's val "
                                              "folder, or write stand-ins of the 15 benchmarks")
    commands = data.add_subparsers(dest="data_command", required=True)
    check = commands.add_parser(
        "check", help="say what is present under a data root, its layout and counts, and what is wrong",
        description="For each dataset: its folder and layout, its counts against CoOp's published split sizes, and "
                    "one line per problem (which file, where it comes from, how to fix it); a sample of the images "
                    "is decoded (all with --full). Exit status 1 when a dataset asked for is broken.")
    check.add_argument("--data-root", required=True, type=Path, help="folder that holds the dataset folders")
    check.add_argument("--datasets", nargs="+", default=None, metavar="DATASET",
                       help="datasets to check, or 'all' for the 15 benchmarks (default: every benchmark whose "
                            "folder is present)")
    check.add_argument("--full", action="store_true", help="decode every image, not a sample")
    check.add_argument("--sample", type=int, default=None,
                       help="images decoded per dataset without --full (default 64; 0 decodes none)")
    check.set_defaults(func=run_data_check)

    sort = commands.add_parser(
        "sort-imagenet-val", help="move ImageNet's flat val images into images/val/<wnid>/ by the devkit",
        description="ILSVRC2012_img_val.tar extracts to one flat folder; this moves each image of "
                    "<data root>/imagenet/images/val into its class folder by the ILSVRC-2012 devkit's ground truth "
                    "(nothing moves if an image has no class).")
    sort.add_argument("--data-root", required=True, type=Path, help="folder that holds imagenet/")
    sort.add_argument("--devkit", required=True, type=Path,
                      help="ILSVRC2012_devkit_t12.tar.gz (image-net.org) or the folder it extracts to")
    sort.set_defaults(func=run_data_sort_imagenet_val)

    standins = commands.add_parser(
        "standins", help="write stand-ins of the 15 benchmarks: real layouts, class names and split sizes, "
                         "generated images",
        description="Writes each dataset in its real CoOp on-disk layout with its real class names and published "
                    "split sizes, but small generated JPEG images (32x32, from the seed), so that runs at the papers' "
                    "scale can be timed and tested without the real data. Test and val splits are written in full "
                    "unless --test-fraction is given; training sets hold --train-per-class images per class. Each "
                    "dataset folder gets a STANDIN.json manifest; a dataset already complete for the same request is "
                    "skipped, an interrupted one completed, one of another request rewritten.")
    standins.add_argument("root", type=Path, metavar="ROOT", help="data root to write the dataset folders into")
    standins.add_argument("--datasets", nargs="+", default=[ALL], metavar="DATASET",
                          help="benchmarks to write, or 'all' for the 15 (default: all)")
    standins.add_argument("--test-fraction", type=float, default=1.0, metavar="F",
                          help="fraction of each published test and val split to write, 0 < F <= 1 (default 1: "
                               "in full); every class keeps at least one image")
    standins.add_argument("--train-per-class", type=int, default=16, metavar="N",
                          help="training images per class (default 16, the most shots the papers use)")
    standins.add_argument("--seed", type=int, default=0, help="seed of the generated images (default 0)")
    standins.set_defaults(func=run_data_standins)


def _requested(data_root: Path, datasets: list[str] | None) -> tuple[list[str], list[str]]:
    """(datasets to check, benchmarks left out because their folder is absent)."""
    from atlas_fast.data.datasets import BUILTIN_DATASETS, dataset_spec

    if datasets and ALL not in datasets:
        return datasets, []
    if datasets:  # "all": the 15 benchmarks, present or not
        return list(BUILTIN_DATASETS), []
    present = [n for n in BUILTIN_DATASETS if (data_root.expanduser() / dataset_spec(n).folder).is_dir()]
    return present, [n for n in BUILTIN_DATASETS if n not in present]


def run_data_check(args: argparse.Namespace) -> int:
    """Print the check of each dataset; 1 if any is broken, 0 otherwise."""
    from atlas_fast.data.check import DEFAULT_SAMPLE, check_dataset
    from atlas_fast.errors import UsageError

    if args.sample is not None and (args.sample < 0 or args.full):
        raise UsageError("--sample takes a count >= 0 and goes without --full.")
    names, absent = _requested(args.data_root, args.datasets)
    if not names:
        raise UsageError(f"no benchmark folder under {args.data_root} (e.g. oxford_pets/, imagenet/); name the "
                         f"datasets with --datasets, or --datasets all to list what each needs.")
    broken = []
    for name in names:
        result = check_dataset(name, args.data_root, full=args.full,
                               sample=DEFAULT_SAMPLE if args.sample is None else args.sample)
        print("\n".join(result.lines()), flush=True)
        if result.broken:
            broken.append(result.name)
    if absent:
        print(f"not present (not checked): {', '.join(absent)}")
    print(f"{len(names) - len(broken)} of {len(names)} dataset(s) ok"
          + (f"; broken: {', '.join(broken)}" if broken else ""))
    return 1 if broken else 0


def run_data_sort_imagenet_val(args: argparse.Namespace) -> int:
    from atlas_fast.data.imagenet_val import sort_validation_images

    val_dir = args.data_root / "imagenet" / "images" / "val"
    moved = sort_validation_images(val_dir, args.devkit)
    print(f"moved {moved} image(s) into class folders under {val_dir}")
    return 0


def run_data_standins(args: argparse.Namespace) -> int:
    """Write the stand-ins asked for, one line each, then the totals."""
    import time

    from atlas_fast.errors import UsageError

    if not 0 < args.test_fraction <= 1:
        raise UsageError(f"--test-fraction {args.test_fraction:g} is outside the valid range 0 < F <= 1 "
                         f"(1 writes the published test and val splits in full).")
    if args.train_per_class < 1:
        raise UsageError(f"--train-per-class takes a count >= 1, not {args.train_per_class}.")
    if args.seed < 0:
        raise UsageError(f"--seed takes a number >= 0, not {args.seed}.")
    from atlas_fast.data.datasets import BUILTIN_DATASETS, dataset_spec
    from atlas_fast.world.standin_images import IMAGE_SIZE
    from atlas_fast.world.standin_plan import StandinRequest
    from atlas_fast.world.standins import describe, write_standin

    if ALL in args.datasets:
        names = list(BUILTIN_DATASETS)
    else:
        names = list(dict.fromkeys(dataset_spec(name).name for name in args.datasets))
        unknown = [name for name in names if name not in BUILTIN_DATASETS]
        if unknown:
            raise UsageError(f"no stand-in for {', '.join(unknown)}: stand-ins exist for the 15 benchmarks "
                             f"({', '.join(BUILTIN_DATASETS)}).")
    request = StandinRequest(args.test_fraction, args.train_per_class, args.seed)
    fraction = "in full" if args.test_fraction == 1 else f"{args.test_fraction:g} of each (at least 1 per class)"
    print(f"stand-ins under {args.root}: real layouts, class names and split sizes, generated {IMAGE_SIZE}x"
          f"{IMAGE_SIZE} JPEG images (not the real ones); test and val splits {fraction}; "
          f"{args.train_per_class} training image(s) per class; seed {args.seed}", flush=True)
    started = time.perf_counter()
    images = size = 0
    for name in names:
        result = write_standin(name, args.root, request)
        images += result.images_written
        size += result.bytes_written
        print(describe(result), flush=True)
    print(f"{len(names)} dataset(s); {images:,} image(s) written ({size / 1e6:.1f} MB of JPEG data) in "
          f"{time.perf_counter() - started:.1f} s")
    return 0
