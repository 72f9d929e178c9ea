"""What every experiment module shares: its command line, the base run config, running the plan and the outputs.

An experiment module (run with ``atlas-fast experiment NAME`` or ``python -m atlas_fast.experiments NAME``) defines
``PAPER`` (the table or figure it reproduces), ``plan(args) -> list[TrainConfig]`` (the runs, in a fixed order),
``report(args, records) -> str`` (the records in plan order -> tables and plots) and optionally ``add_arguments(parser)`` and ``DATASETS`` (default ``--datasets``). :func:`run_experiment` does the rest:
``--dry-run`` lists the runs and how many are finished; ``--estimate`` prices them on this machine
(:mod:`atlas_fast.pricing`); otherwise the runs go to ``--executor`` in groups of
``--batch-runs`` and the report is written to ``--out``. ``--world`` runs the module on the embedded world: options
left at their defaults take the world's counterparts (the module's ``WORLD_DEFAULTS``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Sequence

from atlas_fast.data.datasets import ELEVEN
from atlas_fast.app.options import (add_download, add_method_options, add_methods, add_options, add_progress,
                                    add_seeds, add_workers, apply_download, check_range, method_options,
                                    resolve_backbone, train_config)
from atlas_fast.data.check import require_layouts
from atlas_fast.errors import UsageError
from atlas_fast.vocabulary import EXECUTORS
from atlas_fast.report.figures import plot_rows
from atlas_fast.report.formats import latex_label, latex_table, markdown_table, write_csv
from atlas_fast.report.rows import TableRow

# The engine and the sweep (torch) are imported where runs are planned, trained and reported, so that an
# experiment's --help and argument errors answer at once (tests/test_cli_start.py).
if TYPE_CHECKING:
    from atlas_fast.engine import TrainConfig
    from atlas_fast.sweep import Execution


def parser(description: str, datasets: Sequence[str] = ELEVEN) -> argparse.ArgumentParser:
    """Options common to the experiment modules (backbone, data, seeds, recipe overrides, execution, outputs)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data-root", default=None,
                   help="folder holding the datasets in the CoOp layout (required, except with --world)")
    p.add_argument("--world", action="store_true",
                   help="run on the embedded world (atlas_fast.world): its datasets stand in for the paper's, the "
                        "shipped atlas-world CLIP for ViT-B/16; the benchmark is generated under --data-root "
                        f"(default {WORLD_DATA_ROOT})")
    p.add_argument("--world-images", type=int, nargs=3, default=list(WORLD_IMAGES), metavar=("TRAIN", "VAL", "TEST"),
                   help="with --world: images per class generated for each split (default: %(default)s)")
    p.add_argument("--datasets", nargs="+", default=list(datasets), help="default: %(default)s")
    add_options(p, ("model", "pretrained"))
    add_download(p)
    add_seeds(p, [1, 2, 3])
    add_options(p, ("recipe_family", "epochs", "views", "device", "graph_steps", "cache_root", "results_dir",
                        "save_predictions"))
    p.add_argument("--out", default="results/experiments", help="where tables and plots are written")
    run = p.add_argument_group("execution")
    run.add_argument("--dry-run", action="store_true", help="list the runs (and which are finished); train nothing")
    add_options(run, ("estimate",))
    add_progress(run)
    run.add_argument("--executor", choices=EXECUTORS, default="local",
                     help="local (this process), ray (one task per group) or slurm (submitit job array)")
    add_options(run, ("batch_runs",))
    run.add_argument("--ray-address", default=None, help="Ray cluster address (default: start a local Ray)")
    run.add_argument("--gpus-per-group", type=float, default=None,
                     help="GPUs per Ray task / SLURM array task (fractions share a GPU under Ray; default 0 on "
                          "Ray, 1 on SLURM)")
    run.add_argument("--ray-workers", type=int, default=None, help="Ray: groups in flight at once (default: all)")
    add_workers(p)
    run.add_argument("--slurm-partition", default=None)
    run.add_argument("--slurm-timeout-min", type=int, default=240)
    run.add_argument("--slurm-folder", default="results/submitit", help="submitit logs and pickles")
    return p


# --world: the world's counterparts of the paper's datasets (atlas_fast/world/README.md), the shipped CLIP and the
# prompt depths of the multi-modal methods cut to its 4-layer towers (app.options.world_method_options).
WORLD_DATA_ROOT = "data/world"
WORLD_IMAGES = (32, 4, 50)


def apply_world(args: argparse.Namespace, parser: argparse.ArgumentParser, module: ModuleType) -> None:
    """``--world``: replace every option the user left at its default by the world's counterpart (the module's
    ``WORLD_DEFAULTS``, e.g. WorldPhotos for ImageNet; else the six base-to-new world datasets for the paper's 11;
    an unset ``--model``/``--pretrained`` then resolves to the world's CLIP, as for any World* dataset), then
    generate (or reuse) the world datasets the experiment reads."""
    from atlas_fast.app.options import world_method_options
    from atlas_fast.world.benchmark import BASE_TO_NEW, SplitSizes, generate_benchmark

    if args.data_root is None:
        args.data_root = WORLD_DATA_ROOT
    default = parser.get_default
    for option, value in {"datasets": list(BASE_TO_NEW), **getattr(module, "WORLD_DEFAULTS", {})}.items():
        if getattr(args, option) == default(option):
            setattr(args, option, list(value))
    if hasattr(args, "method_option"):  # the user's options come later and so win (see method_options)
        args.method_option = world_method_options() + args.method_option
    needed = list(dict.fromkeys(list(args.datasets) + list(getattr(args, "targets", None) or [])))
    generate_benchmark(args.data_root, needed, sizes=SplitSizes(*args.world_images), progress=True)


# What the base-to-new tables and figures print: base, new and H (from those two). Their runs evaluate only these
# class sets (TrainConfig.evaluate), not the "all" set no table reads (two thirds of CoCoOp's evaluation); every
# module that prints them asks for the same sets, so they share their finished records.
BASE_NEW = ("base", "new")


# The paper's text-side methods (its "DePT" is DePT on CoOp), trained from the feature cache, and every method of
# its Tables I-III: those and the multi-modal IVLP and MaPLe (pixel path). The appendix adds PromptSRC.
PAPER_TEXT_METHODS = ("coop", "cocoop", "dept-coop")
PAPER_METHODS = PAPER_TEXT_METHODS + ("ivlp", "maple")


def method_args(p: argparse.ArgumentParser, default: Sequence[str]) -> None:
    """``--methods`` (one block of rows each; ``--method`` is the same option), ``--zero-shot`` (a zero-shot CLIP row
    first) and ``--method-option``."""
    add_methods(p, default, learning_only=True)
    p.add_argument("--zero-shot", action="store_true", help="add a zero-shot CLIP row (zsclip) first")
    add_method_options(p)


def execution_from_args(args: argparse.Namespace) -> Execution:
    """The sweep's :class:`~atlas_fast.sweep.Execution` from the execution options."""
    from atlas_fast.sweep import Execution
    from atlas_fast.sweep.grid import check_gpus

    check_gpus(args.gpus_per_group)
    check_range("--ray-workers", args.ray_workers, 1)
    check_range("--slurm-timeout-min", args.slurm_timeout_min, 1)
    if args.executor == "ray":
        options: dict[str, Any] = {"address": args.ray_address, "gpus_per_group": args.gpus_per_group or 0.0,
                                   "workers": args.ray_workers}
    elif args.executor == "slurm":
        gpus = 1 if args.gpus_per_group is None else args.gpus_per_group
        if gpus != int(gpus):
            raise UsageError(f"SLURM allocates whole GPUs: --gpus-per-group {gpus} (use Ray to share one).")
        options = {"folder": args.slurm_folder, "partition": args.slurm_partition,
                   "timeout_min": args.slurm_timeout_min, "gpus_per_node": int(gpus)}
    else:
        options = {}
    return Execution(args.executor, args.batch_runs, options)


def base_config(args: argparse.Namespace, setting: str, shots: int = 16, **changes: Any) -> TrainConfig:
    """The run every row of a table starts from (:func:`~atlas_fast.app.options.train_config` of the run options);
    rows replace the schedule, soft labels, dataset and seed. Inner progress bars are off: the sweep prints a line
    per run."""
    if "method" in changes and "method_options" not in changes:
        changes["method_options"] = method_options(getattr(args, "method_option", []), changes["method"])
    return train_config(args, dataset=args.datasets[0], data_root=args.data_root, setting=setting, shots=shots,
                        **{"progress": False, **changes})


def build_parser(module: ModuleType) -> argparse.ArgumentParser:
    """The module's command line: the common options, the module's own, and its docstring as help."""
    from atlas_fast.experiments import summary

    p = parser(summary(module.__doc__) or module.__name__,
               datasets=getattr(module, "DATASETS", ELEVEN))
    p.prog = f"atlas-fast experiment {module.__name__.rsplit('.', 1)[-1]}"
    if hasattr(module, "add_arguments"):
        module.add_arguments(p)
    return p


def run_experiment(module: ModuleType | str, argv: Sequence[str] | None = None) -> str:
    """Parse ``argv`` for ``module``, then list (``--dry-run``) or train its runs and write its report."""
    if isinstance(module, str):
        module = sys.modules[module]
    module_parser = build_parser(module)
    args = module_parser.parse_args(argv)
    apply_download(args)
    from atlas_fast.app.options import command_graph_steps

    # graphs asked for on a device without them: refused before the world is generated (torch is imported only then;
    # a sweep's workers elsewhere may hold the GPU this machine lacks)
    if command_graph_steps(args) and args.executor == "local":
        from atlas_fast.engine.spec import refuse_graph_steps_off_cuda

        refuse_graph_steps_off_cuda(True, getattr(args, "device", "auto"))
    if args.world:
        apply_world(args, module_parser, module)
    elif args.data_root is None:
        module_parser.error("--data-root is required (or --world to run on the embedded world)")
    resolve_backbone(args)
    require_layouts([*getattr(args, "datasets", []), *(getattr(args, "targets", None) or [])], args.data_root)
    from atlas_fast.sweep import describe_plan, plan_sweep, run_configs
    from atlas_fast.errors import distinct

    if args.batch_runs is None:
        args.batch_runs = getattr(module, "BATCH_RUNS", None)  # e.g. Table V times runs trained alone
    for option in ("seeds", "datasets", "methods", "targets"):  # a value counted twice would weigh twice
        if getattr(args, option, None) is not None:
            distinct(getattr(args, option), f"--{option}")
    execution = execution_from_args(args)
    configs = module.plan(args)
    check_before_runs(args)  # the dry run checks exactly what the real run checks
    if args.dry_run:
        from atlas_fast.sweep.executors import make_executor

        make_executor(execution.executor, **execution.options)  # its options are checked as the real run's are
        planned = plan_sweep(configs, execution)
        device = planned[0].device.type if planned else "cpu"
        listing = describe_plan(planned, execution.runs_per_group(device))
        print(listing)
        return listing
    if args.estimate and not configs:  # e.g. Fig. 3's case study: its report is all it does
        name = module.__name__.rsplit(".", 1)[-1]
        text = (f"Estimate: {name} trains nothing (it plans no runs), so there is nothing to price; its report "
                f"loads the backbone and encodes the few images it draws, in about the time of a `cache build` of "
                f"them. Run it without --estimate.")
        print(text)
        return text
    if args.estimate:
        from atlas_fast.pricing import estimate_configs

        text = estimate_configs(configs, execution, command_start=True, report=report_sample).markdown()
        print(text)
        return text
    records = run_configs(configs, execution, progress=not args.no_progress)
    return module.report(args, records)


def check_before_runs(args: argparse.Namespace) -> None:
    """What the report will need, checked before the first run trains: the output folder is writable and every
    evaluation-only dataset (``--targets``) is known and laid out under ``--data-root``."""
    from atlas_fast.data import load_dataset
    from atlas_fast.files import check_writable

    check_writable(Path(args.out), "The --out folder")
    for target in getattr(args, "targets", None) or []:
        load_dataset(target, args.data_root)


def chunks(records: Sequence[dict[str, Any]], size: int) -> list[Sequence[dict[str, Any]]]:
    """Consecutive blocks of ``size`` records (plans are built block by block: one block per grid point)."""
    return [records[i:i + size] for i in range(0, len(records), size)]


def write_text(out: str | Path, name: str, text: str) -> Path:
    """Write ``<out>/<name>`` (folders created) and return its path."""
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def publish(out: str | Path, name: str, text: str) -> str:
    """Write ``text`` to ``<out>/<name>``, print it and return it (what every ``report`` ends with)."""
    path = write_text(out, name, text)
    print(text)
    print(f"\nwritten: {path}")
    return text


def report_sample(out: Path) -> None:
    """What an experiment's report writes, on a four-row table: the work ``--estimate`` times once per machine to
    price the report (matplotlib's start is most of it)."""
    import contextlib
    import io

    from atlas_fast.report.rows import TableRow

    rows = [TableRow(name, {"base": 80.0 + i, "new": 60.0 + i, "H": 68.0 + i}, {"base": 1.0, "new": 1.0}, 3, ("A",),
                     "CoOp") for i, name in enumerate(("CoOp", "+ ATLaS", "+ ATLaS-CSL", "+ ATLaS-ISL"))]
    with contextlib.redirect_stdout(io.StringIO()):  # write_table prints the table: not the estimate's output
        write_table(rows, "sample", "Sample", out)


def write_table(rows: Sequence[TableRow], name: str, title: str, out: str | Path) -> str:
    """Write ``<out>/<name>.{md,tex,csv,png,pdf}`` (Markdown, booktabs LaTeX labelled ``tab:<name>``, CSV with the
    paired differences' intervals, bar plot as PNG and PDF), print and return the Markdown. ``title`` heads the
    Markdown and is the LaTeX caption; the plot has none (its caption belongs to the paper)."""
    write_text(out, f"{name}.tex", latex_table(rows, caption=title, label=latex_label(name)))
    write_csv(rows, Path(out) / f"{name}.csv")
    plot_rows(rows, Path(out) / f"{name}.png")
    return publish(out, f"{name}.md", markdown_table(rows, title))
