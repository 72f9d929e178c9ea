"""``atlas-fast experiment NAME [options]``: any table or figure of the paper (see :mod:`atlas_fast.experiments`)."""

from __future__ import annotations

import argparse
import ast
import textwrap
from pathlib import Path

from atlas_fast.errors import UsageError, did_you_mean

LIST_WIDTH = 100  # columns of ``--list``: each summary is wrapped to them, never cut


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
        raise UsageError(f"Unknown experiment {args.name!r}{did_you_mean(args.name, experiment_names())}; valid: {', '.join(experiment_names())}.")
    if args.list or args.name is None:
        print(experiment_listing(experiment_table()))
        return 0 if args.list else 2
    from atlas_fast.experiments.common import run_experiment

    run_experiment(load_experiment(args.name), args.options)
    return 0


def summary(name: str) -> str:
    """The first paragraph of experiment ``name``'s docstring on one line (what it shows, whole sentences), read
    from its source without importing it."""
    import atlas_fast.experiments as experiments

    tree = ast.parse(Path(experiments.__path__[0], f"{name}.py").read_text(encoding="utf-8"))
    return " ".join((ast.get_docstring(tree) or "").strip().split("\n\n")[0].split())


def experiment_listing(rows: list[tuple[str, str, str]]) -> str:
    """``--list``: each experiment's name and paper item, then its summary wrapped below them (the summary without
    the item it starts with: no "Fig. 1: Fig. 1: ...")."""
    lines = []
    width = max(len(name) for name, _, _ in rows)
    for name, paper, _ in rows:
        what = summary(name)
        item = paper.split(" (")[0]
        what = what[len(item) + 2:] if what.startswith(item + ": ") else what
        lines.append(f"{name:<{width}}  {paper}")
        lines.extend(textwrap.wrap(what, LIST_WIDTH, initial_indent="    ", subsequent_indent="    ",
                                   break_on_hyphens=False))
    return "\n".join(lines)
