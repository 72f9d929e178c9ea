"""``atlas-fast train``: train prompt methods (optionally with ATLaS) over seeds and print base/new/H."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from atlas_fast.app.catalogue import method_names
from atlas_fast.app.options import (add_data_and_backbone, add_method_options, add_progress, add_seeds, add_workers,
                                    check_methods, method_name, method_options, resolve_backbone,
                                    WORLD_BACKBONE)
from atlas_fast.errors import UsageError

# --atlas and --schedule choices (the ATLaS package's, atlas_fast.atlas.variants, spelled here so that parsing
# imports no torch; tests/test_cli_start.py checks the two agree).
SOFT_CHOICES = ("none", "ls", "csl", "isl", "mix")
SCHEDULE_CHOICES = ("auto", "atlas", "joint", "ols", "tfkd")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast train``."""
    train = subparsers.add_parser(
        "train", help="train a prompt method (optionally with ATLaS) and print base/new/H",
        description="Train a prompt method (text-prompt methods from cached image features; ivlp, maple and "
                    "promptsrc, which prompt the image encoder, on decoded pixels of the same seeded views), "
                    "evaluate it and write a result record; the cache is built for what is missing and an identical "
                    "finished run is skipped. One run per method and seed; a table with the mean over seeds closes "
                    "the output.")
    add_data_and_backbone(train)
    train.add_argument("--methods", "--method", dest="methods", nargs="+", default=["coop"], metavar="METHOD",
                       type=method_name(), help=f"prompt method(s): {', '.join(method_names())} (default coop); dept-* = DePT's head "
                            "on coop/cocoop/kgcoop/maple, zsclip = zero-shot CLIP (nothing trained); ivlp, maple, "
                            "promptsrc, dept-maple prompt the image encoder and train on pixels")
    train.add_argument("--recipe", choices=("paper", "original"), default="paper",
                       help="recipe family: the ATLaS paper's (default) or the method repository's own")
    train.add_argument("--setting", choices=("base2new", "few_shot", "cross_dataset"), default="base2new",
                       help="protocol: picks the recipe, the ATLaS presets and the class subset (default base2new)")
    train.add_argument("--shots", type=int, default=16, help="training images per class (default 16)")
    add_seeds(train, [1])
    train.add_argument("--subsample", choices=("all", "base", "new"), default=None,
                       help="training classes (default: base for base2new, all otherwise)")
    atlas = train.add_argument_group("label schedule (ATLaS and baselines)")
    atlas.add_argument("--atlas", choices=SOFT_CHOICES, default="none",
                       help="soft labels: none (plain method), ls (uniform), csl (class-wise), isl (instance-wise), "
                            "mix (w*CSL + (1-w)*ISL)")
    atlas.add_argument("--schedule", choices=SCHEDULE_CHOICES, default="auto",
                       help="auto = atlas with --atlas, one-hot without; joint = CE(y) + CE(soft) every step; "
                            "ols / tfkd = the online-LS and teacher-free-KD baselines (no --atlas)")
    atlas.add_argument("--K", type=int, default=None, help="ATLaS period: soft labels every K-th epoch "
                                                           "(default: the setting's preset, 1 = always soft)")
    atlas.add_argument("--theta", type=float, default=None, help="LS smoothing (default: preset)")
    atlas.add_argument("--tau-c", type=float, default=None, help="CSL temperature (default: preset)")
    atlas.add_argument("--alpha", type=float, default=None, help="ISL rectification coefficient (default: preset)")
    atlas.add_argument("--delta", choices=("wrong_only", "always"), default=None,
                       help="when ISL rectifies (default: preset)")
    atlas.add_argument("--w", type=float, default=None, help="CSL weight of --atlas mix (default 0.3)")
    atlas.add_argument("--top-k", type=int, default=None, help="CSL: keep the k most similar classes per row")
    atlas.add_argument("--ols-alpha", type=float, default=0.5, help="OLS weight of the one-hot CE (default 0.5)")
    atlas.add_argument("--tfkd-a", type=float, default=0.9, help="TF-KD teacher's true-class probability (0.9)")
    atlas.add_argument("--tfkd-alpha", type=float, default=0.1, help="TF-KD weight of the KL term (default 0.1)")
    atlas.add_argument("--tfkd-tau", type=float, default=20.0, help="TF-KD temperature (default 20)")
    optim = train.add_argument_group("recipe overrides and execution")
    add_method_options(optim)
    optim.add_argument("--epochs", type=int, default=None, help="override the recipe's epochs")
    optim.add_argument("--batch-size", type=int, default=None, help="override the recipe's batch size")
    optim.add_argument("--lr", type=float, default=None, help="override the recipe's learning rate")
    optim.add_argument("--views", type=int, default=None, help="cached augmented views (default: = epochs)")
    optim.add_argument("--aug-seed", type=int, default=0, help="seed of the augmented views (default 0)")
    optim.add_argument("--eval-every-epoch", action="store_true", help="record accuracy after every epoch")
    optim.add_argument("--device", default="auto", help="torch device (default: cuda if available, else cpu)")
    optim.add_argument("--precision", choices=("auto", "fp32", "amp"), default="auto",
                       help="auto = fp16 autocast on CUDA, fp32 on CPU")
    optim.add_argument("--graph-steps", choices=("auto", "on", "off"), default="auto",
                       help="replay cached training steps from CUDA graphs (same numbers, faster): auto = wherever "
                            "a graph applies (CUDA, a method on cached features); on = refuse runs where none does; "
                            "off = eager steps")
    optim.add_argument("--cache-root", type=Path, default=Path("cache"), help="cache folder (default ./cache)")
    optim.add_argument("--results-dir", type=Path, default=Path("results"), help="records (default ./results)")
    optim.add_argument("--batch-runs", type=int, default=None,
                       help="seeds trained together in one module (default: all of them, up to 12 on a GPU / 4 on "
                            "the CPU); 1 trains them one by one. Same records either way")
    add_workers(optim)
    add_progress(optim)
    optim.add_argument("--estimate", action="store_true",
                       help="price the runs on this machine (time per phase, features to encode, cache bytes, peak "
                            "memory) from units measured once and kept under --cache-root; train nothing")
    optim.add_argument("--content-hash", action="store_true",
                       help="identify images by a hash of their bytes, not size+mtime (reads every image)")
    train.set_defaults(func=run_train)


def label_variant(args: argparse.Namespace):
    """The :class:`~atlas_fast.atlas.variants.LabelVariant` (schedule and soft labels) the ``train`` flags ask for."""
    from atlas_fast.atlas.variants import atlas_variant

    name = args.schedule if args.schedule != "auto" else ("onehot" if args.atlas == "none" else "atlas")
    if name in ("atlas", "joint") and args.atlas == "none":
        raise UsageError(f"--schedule {name} trains on soft labels: choose them with --atlas ls|csl|isl|mix.")
    if name in ("onehot", "ols", "tfkd") and args.atlas != "none":
        raise UsageError(f"--schedule {name} uses no offline soft labels; drop --atlas {args.atlas}.")
    schedule_flags = {"ols": {"alpha": args.ols_alpha},
                      "tfkd": {"a": args.tfkd_a, "alpha": args.tfkd_alpha, "tau": args.tfkd_tau}}
    soft_overrides = {key: getattr(args, key) for key in ("theta", "tau_c", "alpha", "delta", "w", "top_k")
                      if getattr(args, key) is not None}
    return atlas_variant(args.setting, args.atlas, args.schedule, period=args.K,
                         schedule_options=schedule_flags.get(args.schedule), **soft_overrides)


def run_train(args: argparse.Namespace) -> int:
    check_methods(args.methods)  # names and syntax first: nothing heavy is imported for a typo
    options = {method: method_options(args.method_option, method) for method in args.methods}
    from atlas_fast.data.check import require_layouts

    require_layouts([args.dataset], args.data_root)  # every layout fault at once, before any work
    implied = args.model is None
    resolve_backbone(args)  # a World* dataset without --model implies the world's CLIP
    if implied and args.model == WORLD_BACKBONE[0]:  # its towers are shallower than the recipes' prompt depths (as
        # with experiments' --world; a --model given by hand keeps its --method-option as given)
        from atlas_fast.experiments.common import world_method_options

        options = {method: method_options(world_method_options() + args.method_option, method)
                   for method in args.methods}
    from atlas_fast.report.tables import train_results
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig
    from atlas_fast.sweep import Execution, run_configs
    from atlas_fast.sweep.grid import distinct

    distinct(args.seeds, "--seeds")  # a seed given twice would count twice in the closing mean
    distinct(args.methods, "--methods")
    variant = label_variant(args)
    configs = [TrainConfig(
        dataset=args.dataset, data_root=args.data_root, backbone=BackboneConfig(args.model, args.pretrained),
        method=method, method_options=options[method], recipe=args.recipe,
        setting=args.setting, shots=args.shots, seed=seed, subsample=args.subsample,
        soft_labels=variant.soft_labels, schedule=variant.schedule, views=args.views, aug_seed=args.aug_seed,
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, eval_every_epoch=args.eval_every_epoch,
        device=args.device, precision=args.precision,
        graph_steps={"auto": None, "on": True, "off": False}[args.graph_steps],
        cache_root=args.cache_root, results_dir=args.results_dir, progress=not args.no_progress,
        content_hash=args.content_hash, workers=args.workers)
        for method in args.methods for seed in args.seeds]
    if args.batch_runs is not None and args.batch_runs > 1 and len(args.seeds) > 1:  # asked for, so say so
        from atlas_fast.methods.base import method_class

        for method in args.methods:
            if not method_class(method).supports_batched_runs:
                warnings.warn(f"{method} does not support batched runs: --batch-runs {args.batch_runs} trains its "
                              "seeds one by one.")
    if args.estimate:
        from atlas_fast.pricing import estimate_configs

        print(estimate_configs(configs, Execution("local", args.batch_runs), command_start=True).markdown())
        return 0
    records = run_configs(configs, Execution("local", args.batch_runs), progress=not args.no_progress)
    print(train_results(args.dataset, args.methods, args.seeds, records))
    return 0
