"""``atlas-fast train``: train prompt methods (optionally with ATLaS) over seeds and print base/new/H."""

from __future__ import annotations

import argparse
import warnings

from atlas_fast.app.catalogue import method_names, pixel_method_names
from atlas_fast.app.options import (Distinct, add_data_and_backbone, add_method_options, add_progress, add_run_options,
                                    add_seeds, add_workers, check_methods, method_name, method_options,
                                    resolve_backbone, train_config, world_method_options, WORLD_BACKBONE)
from atlas_fast.errors import UsageError
from atlas_fast.vocabulary import (DELTAS, NO_SOFT_LABELS, SCHEDULE_CHOICES, SOFT_LABEL_CHOICES, SOFT_LABEL_KINDS,
                                   SOFT_LABEL_SCHEDULES)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast train``."""
    train = subparsers.add_parser(
        "train", help="train a prompt method (optionally with ATLaS) and print base/new/H",
        description="Train a prompt method (text-prompt methods from cached image features; those that prompt or "
                    "adapt the image encoder on decoded pixels of the same seeded views), "
                    "evaluate it and write a result record; the cache is built for what is missing and an identical "
                    "finished run is skipped. One run per method and seed; a table with the mean over seeds closes "
                    "the output.")
    add_data_and_backbone(train)
    train.add_argument("--methods", "--method", dest="methods", nargs="+", default=["coop"], metavar="METHOD",
                       type=method_name(), action=Distinct, help=f"prompt method(s): {', '.join(method_names())} (default coop); dept-* = DePT's head "
                            "on coop/cocoop/kgcoop/maple, zsclip = zero-shot CLIP (nothing trained); "
                            f"{', '.join(pixel_method_names())} prompt or adapt the image encoder and train on "
                            "pixels, the others on cached image features")
    add_run_options(train, ("recipe_family", "setting", "shots", "fewshot_order"))
    add_seeds(train, [1])
    add_run_options(train, ("subsample",))
    atlas = train.add_argument_group("label schedule (ATLaS and baselines)")
    atlas.add_argument("--atlas", dest="soft_kind", choices=SOFT_LABEL_CHOICES, default=NO_SOFT_LABELS,
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
    atlas.add_argument("--delta", choices=DELTAS, default=None,
                       help="when ISL rectifies (default: preset)")
    atlas.add_argument("--w", type=float, default=None, help="CSL weight of --atlas mix (default 0.3)")
    atlas.add_argument("--top-k", type=int, default=None, help="CSL: keep the k most similar classes per row")
    atlas.add_argument("--ols-alpha", type=float, default=0.5, help="OLS weight of the one-hot CE (default 0.5)")
    atlas.add_argument("--tfkd-a", type=float, default=0.9, help="TF-KD teacher's true-class probability (0.9)")
    atlas.add_argument("--tfkd-alpha", type=float, default=0.1, help="TF-KD weight of the KL term (default 0.1)")
    atlas.add_argument("--tfkd-tau", type=float, default=20.0, help="TF-KD temperature (default 20)")
    optim = train.add_argument_group("recipe overrides and execution")
    add_method_options(optim)
    add_run_options(optim, ("epochs", "batch_size", "lr", "views", "aug_seed", "eval_every_epoch", "device",
                            "precision", "graph_steps", "cache_root", "results_dir", "save_predictions"))
    optim.add_argument("--batch-runs", type=int, default=None,
                       help="seeds trained together in one module (default: all of them, up to 12 on a GPU / 4 on "
                            "the CPU); 1 trains them one by one. Same records either way")
    add_workers(optim)
    add_progress(optim)
    optim.add_argument("--estimate", action="store_true",
                       help="price the runs on this machine (time per phase, features to encode, cache bytes, peak "
                            "memory) from units measured once and kept under --cache-root; train nothing")
    add_run_options(optim, ("content_hash",))
    train.set_defaults(func=run_train)


def variant_from_args(args: argparse.Namespace):
    """The :class:`~atlas_fast.atlas.variants.LabelVariant` (schedule and soft labels) the ``train`` flags ask for."""
    from atlas_fast.atlas.variants import label_variant, schedule_name

    name = schedule_name(args.schedule, args.soft_kind)
    if name in SOFT_LABEL_SCHEDULES and args.soft_kind == NO_SOFT_LABELS:
        raise UsageError(f"--schedule {name} trains on soft labels: choose them with --atlas "
                         f"{'|'.join(SOFT_LABEL_KINDS)}.")
    if name not in SOFT_LABEL_SCHEDULES and args.soft_kind != NO_SOFT_LABELS:
        raise UsageError(f"--schedule {name} uses no offline soft labels; drop --atlas {args.soft_kind}.")
    schedule_flags = {"ols": {"alpha": args.ols_alpha},
                      "tfkd": {"a": args.tfkd_a, "alpha": args.tfkd_alpha, "tau": args.tfkd_tau}}
    soft_overrides = {key: getattr(args, key) for key in ("theta", "tau_c", "alpha", "delta", "w", "top_k")
                      if getattr(args, key) is not None}
    return label_variant(args.setting, args.soft_kind, args.schedule, period=args.K,
                         schedule_options=schedule_flags.get(args.schedule), **soft_overrides)


def run_train(args: argparse.Namespace) -> int:
    check_methods(args.methods)  # names and syntax first: nothing heavy is imported for a typo
    options = {method: method_options(args.method_option, method, args.methods) for method in args.methods}
    from atlas_fast.data.check import require_layouts

    require_layouts([args.dataset], args.data_root)  # every layout fault at once, before any work
    implied = args.model is None
    resolve_backbone(args)  # a World* dataset without --model implies the world's CLIP
    if implied and args.model == WORLD_BACKBONE[0]:  # its towers are shallower than the recipes' prompt depths (as
        # with experiments' --world; a --model given by hand keeps its --method-option as given)
        world = [item for item in world_method_options() if item.partition(":")[0] in args.methods]
        options = {method: method_options(world + args.method_option, method, args.methods)
                   for method in args.methods}
    from atlas_fast.report.formats import train_results
    from atlas_fast.sweep import Execution, run_configs

    variant = variant_from_args(args)
    configs = [train_config(args, dataset=args.dataset, data_root=args.data_root, method=method,
                            method_options=options[method], seed=seed, soft_labels=variant.soft_labels,
                            schedule=variant.schedule)
               for method in args.methods for seed in args.seeds]
    if args.batch_runs is not None and args.batch_runs > 1 and len(args.seeds) > 1:  # asked for, so say so
        from atlas_fast.engine.group import batches_runs
        from atlas_fast.methods.registry import method_class

        for method in args.methods:
            if not batches_runs(method_class(method)):
                warnings.warn(f"{method} does not support batched runs: --batch-runs {args.batch_runs} trains its "
                              "seeds one by one.")
    if args.estimate:
        from atlas_fast.pricing import estimate_configs

        print(estimate_configs(configs, Execution("local", args.batch_runs), command_start=True).markdown())
        return 0
    from atlas_fast.errors import RunsFailed

    try:
        records = run_configs(configs, Execution("local", args.batch_runs), progress=not args.no_progress)
    except RunsFailed as exc:  # the runs that trained are printed before the error names those that failed
        done = [r for r in exc.records if r is not None]
        for method in args.methods:
            runs = [r for r in done if r["config"]["method"] == method]
            if runs:
                print(train_results(args.dataset, [method], [r["config"]["seed"] for r in runs], runs))
        raise
    print(train_results(args.dataset, args.methods, args.seeds, records))
    return 0
