"""``atlas-fast search``: a hyper-parameter study (:mod:`atlas_fast.search`) from the command line. Nothing here
imports torch or Optuna at module level: ``--help`` and argument errors stay instant."""

from __future__ import annotations

import argparse

from atlas_fast.app.options import (add_data_root, add_method_options, add_options, add_progress, add_seeds,
                                    check_methods, method_name, method_options, train_config, variant_from_args)
from atlas_fast.vocabulary import OBJECTIVES, PRUNERS, SAMPLERS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast search``."""
    search = subparsers.add_parser(
        "search", help="search hyper-parameters on the validation split (Optuna: TPE, pruning, resumable storage)",
        description="Search a method's recipe fields, ATLaS knobs and method options with Optuna, selecting on the "
                    "few-shot validation split (the test split is never read during the study); bad trials are "
                    "pruned from their per-epoch validation accuracy. The study lives in a storage (SQLite beside "
                    "the results by default): the same command resumes it, several processes may share it. "
                    "Afterwards the best configuration is retrained with --final-seeds and tested (normal records "
                    "for `atlas-fast report`); the trials table, plots, best.json and the `atlas-fast train` line "
                    "that reruns it are written to RESULTS_DIR/search/STUDY/.",
        epilog="examples of --param: alpha=0.1:1.0  lr=log:1e-4:1e-1  K=int:1:5  theta=0.1:0.6:0.1  "
               "kind=ls,csl,isl  n_ctx=2,4,8")
    search.add_argument("--datasets", "--dataset", dest="datasets", nargs="+", required=True, metavar="DATASET",
                        help="dataset(s) a trial trains on (its value is the mean over them and the seeds)")
    add_data_root(search)
    add_options(search, ("model", "pretrained"))
    search.add_argument("--method", default="coop", type=method_name(learning_only=True),
                        help="the prompt method (default coop)")
    add_options(search, ("recipe_family", "setting", "shots"))
    add_seeds(search, [1])
    add_options(search, ("soft_kind",))  # the base run's soft labels
    space = search.add_argument_group("the study")
    space.add_argument("--param", action="append", default=[], metavar="NAME=SPEC", required=True,
                       help="a searched parameter (repeat): LOW:HIGH, LOW:HIGH:STEP, log:LOW:HIGH, int:LOW:HIGH or "
                            "A,B,C; names: lr epochs batch_size views shots, K theta tau_c inv_tau_c alpha w delta "
                            "kind, and the method's options (e.g. n_ctx)")
    space.add_argument("--objective", choices=OBJECTIVES, default="accuracy",
                       help="validation metric to maximise (default: accuracy of the classes the run trains on)")
    space.add_argument("--trials", type=int, default=50, help="trials in the study, all processes together (50)")
    space.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    space.add_argument("--pruner", choices=PRUNERS, default="hyperband")
    space.add_argument("--sampler-seed", type=int, default=0, help="seed of the sampler (default 0)")
    space.add_argument("--storage", default=None,
                       help="Optuna storage URL (default sqlite:///RESULTS_DIR/search/STUDY/study.db)")
    space.add_argument("--study-name", default=None, help="default: derived from the study's definition")
    space.add_argument("--batch-trials", type=int, default=None,
                       help="trials trained together as one module (default: 12 runs' worth on a GPU, 1 on the CPU)")
    space.add_argument("--final-seeds", type=int, nargs="+", default=None,
                       help="seeds the best configuration is retrained and tested with (default: --seeds)")
    space.add_argument("--no-final", action="store_true",
                       help="only work on the study (e.g. the workers of a SLURM array); no retraining")
    space.add_argument("--heartbeat", type=float, default=20.0,
                       help="seconds between a trial's signs of life; a trial silent for 6x this is taken over")
    space.add_argument("--lock-timeout", type=float, default=60.0,
                       help="seconds to wait for a locked SQLite storage before giving up (default 60)")
    optim = search.add_argument_group("fixed recipe overrides and execution")
    add_method_options(optim)
    add_options(optim, ("epochs", "batch_size", "lr", "views", "device", "precision", "graph_steps",
                            "cache_root", "results_dir"))
    add_progress(optim)
    search.set_defaults(func=run_search_command)


def run_search_command(args: argparse.Namespace) -> int:
    from atlas_fast.search.space import parse_param

    check_methods([args.method], learning_only=True)
    space = dict(parse_param(text) for text in args.param)  # syntax first: nothing heavy imported for a typo
    options = method_options(args.method_option, args.method, [args.method])
    from atlas_fast.data.check import require_layouts  # no torch

    require_layouts(args.datasets, args.data_root)  # every layout fault at once, before torch is imported
    from atlas_fast.report.stats import counted
    from atlas_fast.search import SearchConfig, run_search

    variant = variant_from_args(args)
    base = train_config(args, dataset=args.datasets[0], data_root=args.data_root, method=args.method,
                        method_options=options, seed=args.seeds[0], soft_labels=variant.soft_labels,
                        schedule=variant.schedule)
    search = SearchConfig(base, space, datasets=args.datasets, seeds=args.seeds, objective=args.objective,
                          n_trials=args.trials, sampler=args.sampler, pruner=args.pruner,
                          sampler_seed=args.sampler_seed, storage=args.storage, study_name=args.study_name,
                          batch_trials=args.batch_trials, final_seeds=args.final_seeds, finalize=not args.no_final,
                          heartbeat_seconds=args.heartbeat, grace_seconds=6 * args.heartbeat,
                          lock_timeout=args.lock_timeout)
    result = run_search(search, progress=not args.no_progress)
    reused = sum(1 for record in result.records if record.get("skipped"))
    if result.trials_now == 0 and reused == len(result.records):
        print(f"nothing left to run: study {result.study_name} already holds its {counted(result.trials, 'trial')}"
              + (f" and the {reused} final run(s) are finished" if reused else "") + "; its summary again:")
    print(f"study {result.study_name}: {result.trials} trials ({result.trials_now} trained now), {result.epochs} "
          f"epochs trained; storage {result.storage}")
    print(f"best (validation {args.objective}) {result.best_value:.2f}: "
          + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.best_params.items()))
    print(f"rerun: {result.command}")
    for name, path in result.files.items():
        print(f"  {name}: {path}")
    if "final.md" in result.files:
        print(result.files["final.md"].read_text(encoding="utf-8").rstrip())
    return 0
