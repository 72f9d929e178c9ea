"""``atlas-fast eval``: test saved runs' learned prompts on a dataset (cross-dataset, other class subsets)."""

from __future__ import annotations

import argparse
from pathlib import Path

from atlas_fast.app.options import add_data_root, add_options, add_progress, dataset_name
from atlas_fast.vocabulary import CLASS_SETS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast eval``."""
    evaluate = subparsers.add_parser(
        "eval", help="evaluate saved runs' learned prompts on a dataset (cross-dataset, other class subsets)",
        description="Load the learned tensors saved beside result record(s) and test them on a dataset's test "
                    "split with that dataset's class names, e.g. an ImageNet-trained CoOp on OxfordPets.")
    evaluate.add_argument("--record", type=Path, nargs="+", required=True, help="result record JSON file(s)")
    evaluate.add_argument("--dataset", required=True, type=dataset_name, help="dataset to evaluate on")
    add_data_root(evaluate)
    evaluate.add_argument("--subsample", choices=CLASS_SETS, default="all",
                          help="class subset of the test split (default all)")
    evaluate.add_argument("--shots", type=int, default=None, help="few-shot K defining base/new (default: the run's)")
    evaluate.add_argument("--seed", type=int, default=None, help="few-shot seed defining base/new (default: the run's)")
    add_options(evaluate, ("cache_root", "device", "save_predictions"))
    add_progress(evaluate)
    evaluate.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from atlas_fast.data.check import require_layouts  # no torch

    require_layouts([args.dataset], args.data_root)  # the data root's faults before torch is imported
    from atlas_fast.report.formats import eval_result_line
    from atlas_fast.engine import evaluate_saved

    accuracies = []
    for record in args.record:
        result = evaluate_saved(record, args.dataset, args.data_root, args.subsample, shots=args.shots,
                                seed=args.seed, cache_root=args.cache_root, device=args.device,
                                progress=not args.no_progress, save_predictions=args.save_predictions)
        accuracies.append(result["accuracy"])
        print(eval_result_line(result, record))
    if len(accuracies) > 1:
        print(f"mean over {len(accuracies)} runs: {sum(accuracies) / len(accuracies):.2f}")
    return 0
