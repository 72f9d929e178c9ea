"""``atlas-fast train``: train prompt methods (optionally with ATLaS) over seeds and print base/new/H."""

from __future__ import annotations

import argparse
import warnings

from atlas_fast.app.options import (LABEL_OPTIONS, WORLD_BACKBONE, add_data_and_backbone, add_method_options,
                                    add_methods, add_options, add_progress, add_seeds, add_workers, check_methods,
                                    method_options, resolve_backbone, train_config, variant_from_args,
                                    world_method_options)


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
    add_methods(train, ["coop"])
    add_options(train, ("recipe_family", "setting", "shots", "fewshot_order"))
    add_seeds(train, [1])
    add_options(train, ("subsample",))
    add_options(train.add_argument_group("label schedule (ATLaS and baselines)"), tuple(LABEL_OPTIONS))
    optim = train.add_argument_group("recipe overrides and execution")
    add_method_options(optim)
    add_options(optim, ("epochs", "batch_size", "lr", "views", "aug_seed", "eval_every_epoch", "device",
                            "precision", "graph_steps", "cache_root", "results_dir", "save_predictions"))
    add_options(optim, ("batch_runs",))
    add_workers(optim)
    add_progress(optim)
    add_options(optim, ("estimate", "content_hash"))
    train.set_defaults(func=run_train)


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
