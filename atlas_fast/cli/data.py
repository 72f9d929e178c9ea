"""``atlas-fast data check`` and ``atlas-fast data sort-imagenet-val`` (see :mod:`atlas_fast.data.check`); nothing
heavy is imported until a command runs."""

from __future__ import annotations

import argparse
from pathlib import Path

ALL = "all"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast data check|sort-imagenet-val``."""
    data = subparsers.add_parser("data", help="check a data root (layout, counts, images) or fix ImageNet's val "
                                              "folder")
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


def _requested(data_root: Path, datasets: list[str] | None) -> tuple[list[str], list[str]]:
    """(datasets to check, benchmarks left out because their folder is absent)."""
    from atlas_fast.data.datasets import BUILTIN_DATASETS, get_spec

    if datasets and ALL not in datasets:
        return datasets, []
    if datasets:  # "all": the 15 benchmarks, present or not
        return list(BUILTIN_DATASETS), []
    present = [n for n in BUILTIN_DATASETS if (data_root.expanduser() / get_spec(n).folder).is_dir()]
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
