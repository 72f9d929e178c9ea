"""``atlas-fast experiment NAME [options]``: any table or figure of the paper (see :mod:`atlas_fast.experiments`)."""

from __future__ import annotations

import argparse

from atlas_fast.errors import UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast experiment``."""
    experiment = subparsers.add_parser(
        "experiment", help="run the experiment module of a paper table or figure (--list names them)",
        description="Run one experiment module of atlas_fast.experiments: its runs (grouped, finished ones skipped) "
                    "on --executor local|ray|slurm, then its table/plot. Options after NAME go to the module: "
                    "`atlas-fast experiment NAME --help` lists them; --dry-run lists the runs and which are finished.")
    experiment.add_argument("--list", action="store_true", help="list the experiments and the paper item of each")
    experiment.add_argument("name", nargs="?", help="experiment module, e.g. table3_base_to_new")
    experiment.add_argument("options", nargs=argparse.REMAINDER, help="the module's options")
    experiment.set_defaults(func=run_experiment_command)


def run_experiment_command(args: argparse.Namespace) -> int:
    from atlas_fast.experiments import experiment_names, experiment_table, load_experiment

    if args.name is not None and args.name not in experiment_names():  # before torch is imported
        raise UsageError(f"Unknown experiment {args.name!r}; valid: {', '.join(experiment_names())}.")
    if args.list or args.name is None:
        rows = experiment_table()
        width = max(len(name) for name, _, _ in rows)
        for name, paper, what in rows:
            item = paper.split(" (")[0]
            what = what[len(item) + 2:] if what.startswith(item + ": ") else what  # no "Fig. 1: Fig. 1: ..."
            print(f"{name:<{width}}  {paper:<32}  {what}")
        return 0 if args.list else 2
    from atlas_fast.experiments.common import run_experiment

    run_experiment(load_experiment(args.name), args.options)
    return 0
