"""The ``atlas-fast`` command line. Each command group adds its subparsers in one ``add_<group>_commands`` function
and handles them in functions named ``run_<group>_<command>``; :func:`build_parser` lists the groups.

Expected errors (bad data, arguments, files, checkpoints, a full disk: :func:`atlas_fast.errors.user_errors`) print ``error: ...``
naming the file or value and exit with status 2; ``--debug`` (anywhere on the line) shows the traceback instead."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Sequence

from atlas_fast.app.catalogue import method_names
from atlas_fast.app.collect import add_report_command
from atlas_fast.app.search_command import add_search_command
from atlas_fast.app.options import (add_download, add_method_options, add_progress, add_seeds, add_workers,
                                    apply_download, check_methods, method_options)
from atlas_fast.errors import UsageError, user_errors


def _pretrained(value: str) -> str | None:
    return None if value.lower() in ("none", "random", "") else value


def _add_data_and_backbone_args(parser: argparse.ArgumentParser) -> None:
    """--dataset, --data-root, --model, --pretrained: the options every data-reading command takes."""
    parser.add_argument("--dataset", required=True, help="dataset registry name, e.g. OxfordPets")
    parser.add_argument("--data-root", required=True, type=Path, help="folder that holds the dataset folders")
    parser.add_argument("--model", default="ViT-B-16", help="open_clip model name (default ViT-B-16)")
    parser.add_argument("--pretrained", type=_pretrained, default="openai",
                        help="open_clip tag, checkpoint file (e.g. ~/.cache/clip/ViT-B-16.pt), or 'none' for "
                             "random weights (default openai)")
    add_download(parser)


def _split_names(value: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in value.split(",") if s.strip())
    bad = [s for s in names if s not in ("train", "val", "test")]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--split takes a comma list of train,val,test; got {value!r}.")
    return names


def add_cache_commands(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast cache build|info``."""
    cache = subparsers.add_parser("cache", help="build or list the HDF5 image-feature cache")
    commands = cache.add_subparsers(dest="cache_command", required=True)

    build = commands.add_parser(
        "build", help="encode the images of a dataset (views 0..V for train, view 0 for val/test); only what is missing",
        description="Encode the images of a dataset once with a frozen CLIP image encoder. Train images get views "
                    "0..V (0 = test transform, 1..V = seeded augmentations), val/test images view 0. With --shots "
                    "and --seed, train/val are the few-shot subsets (test stays full).")
    _add_data_and_backbone_args(build)
    build.add_argument("--views", type=int, default=0, help="augmented views per train image (default 0)")
    build.add_argument("--aug-seed", type=int, default=0, help="seed of the augmented views (default 0)")
    build.add_argument("--shots", type=int, default=None, help="few-shot K: train/val become K-shot subsets")
    build.add_argument("--seeds", "--seed", dest="seeds", type=int, nargs="+", default=None, metavar="SEED",
                       help="few-shot seed(s), e.g. --seeds 1 2 3 (required with --shots)")
    build.add_argument("--split", type=_split_names, default=("train", "val", "test"),
                       help="comma list of the splits to encode (default train,val,test)")
    build.add_argument("--subsample", choices=("all", "base", "new"), default="all",
                       help="base-to-new class subset (default all)")
    build.add_argument("--cache-root", type=Path, default=Path("cache"), help="cache folder (default ./cache)")
    build.add_argument("--batch-size", type=int, default=64, help="images per encoder batch (default 64)")
    add_workers(build)
    build.add_argument("--device", default=None, help="torch device (default cuda if available, else cpu)")
    build.add_argument("--precision", choices=("auto", "fp32", "fp16", "bf16"), default="auto",
                       help="encoder precision (default auto: fp16 autocast on CUDA, fp32 on CPU)")
    build.add_argument("--storage-dtype", choices=("float16", "float32"), default="float16",
                       help="dtype of stored features for new cache files (default float16)")
    build.add_argument("--content-hash", action="store_true",
                       help="identify images by a hash of their bytes, not size+mtime (reads every image)")
    build.set_defaults(func=run_cache_build)

    info = commands.add_parser("info", help="list what is cached, with sizes (--verify: check every checksum)")
    info.add_argument("--cache-root", type=Path, default=Path("cache"), help="cache folder (default ./cache)")
    info.add_argument("--verify", action="store_true",
                      help="read every chunk and check its checksum; exit status 1 if a file is damaged")
    info.set_defaults(func=run_cache_info)


def run_cache_build(args: argparse.Namespace) -> int:
    from atlas_fast.clip.backbones import BackboneConfig, load_backbone
    from atlas_fast.engine.config import resolve_device
    from atlas_fast.cache import FeatureCache
    from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes

    if (args.shots is None) != (args.seeds is None):
        raise UsageError("--shots and --seeds go together (e.g. --shots 16 --seeds 1 2 3).")
    if args.views < 0:
        raise UsageError(f"--views must be >= 0, got {args.views}.")
    splits = load_dataset(args.dataset, args.data_root)
    if args.shots is None:
        variants = [splits]
    else:
        variants = [fewshot_subset(splits, args.shots, seed, store_dir=args.cache_root / splits.name / "split_fewshot")
                    for seed in args.seeds]
    variants = [subsample_classes(v, args.subsample) for v in variants]

    train = [d for v in variants for d in v.train] if "train" in args.split else []
    eval_items = [d for v in variants for name in ("val", "test") if name in args.split for d in getattr(v, name)]

    device = str(resolve_device(args.device or "auto"))
    backbone = load_backbone(BackboneConfig(args.model, args.pretrained), device)
    cache = FeatureCache(args.cache_root, storage_dtype=args.storage_dtype, content_hash=args.content_hash)
    common = dict(aug_seed=args.aug_seed, batch_size=args.batch_size, num_workers=args.workers, device=device,
                  precision=args.precision)
    total_encoded = total_reused = 0
    for label, items, views in (("train", train, args.views), ("val/test", eval_items, 0)):
        if not items:
            continue
        report = cache.build(backbone, splits.name, items, num_views=views, **common)
        total_encoded += report.encoded
        total_reused += report.reused
        print(f"{splits.name} {label}: {len(set(d.key for d in items))} images x views 0..{views}: "
              f"encoded {report.encoded}, reused {report.reused}, {report.seconds:.1f} s "
              f"({report.images_per_s:.1f} img/s) -> {report.path}")
    print(f"Done: encoded {total_encoded}, reused {total_reused} features.")
    return 0


def run_cache_info(args: argparse.Namespace) -> int:
    from atlas_fast.cache import FeatureCache

    cache = FeatureCache(args.cache_root)
    entries = cache.entries(verify=args.verify)
    print(cache.info(verify=args.verify, entries=entries))
    return 1 if args.verify and any(e.problem for e in entries) else 0


def add_train_commands(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast train`` and ``atlas-fast eval``."""
    train = subparsers.add_parser(
        "train", help="train a prompt method (optionally with ATLaS) and print base/new/H",
        description="Train a prompt method (text-prompt methods from cached image features; ivlp, maple and "
                    "promptsrc, which prompt the image encoder, on decoded pixels of the same seeded views), "
                    "evaluate it and write a result record; the cache is built for what is missing and an identical "
                    "finished run is skipped. One run per method and seed; a table with the mean over seeds closes "
                    "the output.")
    _add_data_and_backbone_args(train)
    train.add_argument("--methods", "--method", dest="methods", nargs="+", default=["coop"], metavar="METHOD",
                       help=f"prompt method(s): {', '.join(method_names())} (default coop); dept-* = DePT's head "
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
    atlas.add_argument("--atlas", choices=("none", "ls", "csl", "isl", "mix"), default="none",
                       help="soft labels: none (plain method), ls (uniform), csl (class-wise), isl (instance-wise), "
                            "mix (w*CSL + (1-w)*ISL)")
    atlas.add_argument("--schedule", choices=("auto", "atlas", "joint", "ols", "tfkd"), default="auto",
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
    optim.add_argument("--content-hash", action="store_true",
                       help="identify images by a hash of their bytes, not size+mtime (reads every image)")
    train.set_defaults(func=run_train)

    evaluate = subparsers.add_parser(
        "eval", help="evaluate saved runs' learned prompts on a dataset (cross-dataset, other class subsets)",
        description="Load the learned tensors saved beside result record(s) and test them on a dataset's test "
                    "split with that dataset's class names, e.g. an ImageNet-trained CoOp on OxfordPets.")
    evaluate.add_argument("--record", type=Path, nargs="+", required=True, help="result record JSON file(s)")
    evaluate.add_argument("--dataset", required=True, help="dataset to evaluate on")
    evaluate.add_argument("--data-root", required=True, type=Path, help="folder that holds the dataset folders")
    evaluate.add_argument("--subsample", choices=("all", "base", "new"), default="all",
                          help="class subset of the test split (default all)")
    evaluate.add_argument("--shots", type=int, default=None, help="few-shot K defining base/new (default: the run's)")
    evaluate.add_argument("--seed", type=int, default=None, help="few-shot seed defining base/new (default: the run's)")
    evaluate.add_argument("--cache-root", type=Path, default=Path("cache"), help="cache folder (default ./cache)")
    evaluate.add_argument("--device", default="auto", help="torch device (default: cuda if available, else cpu)")
    add_progress(evaluate)
    evaluate.set_defaults(func=run_eval)


def _label_schedule(args: argparse.Namespace):
    """The soft-label config and schedule that the ``train`` flags ask for."""
    from atlas_fast.atlas.schedules import Atlas, Joint, OneHot, OnlineLabelSmoothing, TeacherFreeKD
    from atlas_fast.atlas.softlabels import atlas_period, atlas_preset

    name = args.schedule if args.schedule != "auto" else ("onehot" if args.atlas == "none" else "atlas")
    if name in ("atlas", "joint") and args.atlas == "none":
        raise UsageError(f"--schedule {name} trains on soft labels: choose them with --atlas ls|csl|isl|mix.")
    if name in ("onehot", "ols", "tfkd") and args.atlas != "none":
        raise UsageError(f"--schedule {name} uses no offline soft labels; drop --atlas {args.atlas}.")
    if name == "onehot":
        return None, OneHot()
    if name == "ols":
        return None, OnlineLabelSmoothing(alpha=args.ols_alpha)
    if name == "tfkd":
        return None, TeacherFreeKD(a=args.tfkd_a, alpha=args.tfkd_alpha, tau=args.tfkd_tau)
    overrides = {key: getattr(args, key) for key in ("theta", "tau_c", "alpha", "delta", "w", "top_k")
                 if getattr(args, key) is not None}
    soft_labels = atlas_preset(args.setting, args.atlas, **overrides)
    if name == "joint":
        return soft_labels, Joint()
    return soft_labels, Atlas(args.K if args.K is not None else atlas_period(args.setting))


def _run_label(method: str, soft_labels, schedule) -> str:
    """E.g. ``coop``, ``coop+ATLaS-CSL (K=2)``, ``coop+ISL+y``, ``coop+OLS``."""
    kind = {"ls": "", "csl": "-CSL", "isl": "-ISL", "mix": "-mix"}
    if schedule.name == "onehot":
        return method
    if schedule.name == "atlas":
        if schedule.period == 1:
            return f"{method}+{soft_labels.kind.upper()}"
        return f"{method}+ATLaS{kind[soft_labels.kind]} (K={schedule.period})"
    if schedule.name == "joint":
        return f"{method}+{soft_labels.kind.upper()}+y"
    return f"{method}+{schedule.name.upper()}"


def run_train(args: argparse.Namespace) -> int:
    check_methods(args.methods)  # names and syntax first: nothing heavy is imported for a typo
    options = {method: method_options(args.method_option, method) for method in args.methods}
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine import TrainConfig
    from atlas_fast.engine.evaluate import harmonic_mean
    from atlas_fast.sweep import Execution, run_configs

    soft_labels, schedule = _label_schedule(args)
    configs = [TrainConfig(
        dataset=args.dataset, data_root=args.data_root, backbone=BackboneConfig(args.model, args.pretrained),
        method=method, method_options=options[method], recipe=args.recipe,
        setting=args.setting, shots=args.shots, seed=seed, subsample=args.subsample, soft_labels=soft_labels,
        schedule=schedule, views=args.views, aug_seed=args.aug_seed, epochs=args.epochs, batch_size=args.batch_size,
        lr=args.lr, eval_every_epoch=args.eval_every_epoch, device=args.device, precision=args.precision,
        graph_steps={"auto": None, "on": True, "off": False}[args.graph_steps],
        cache_root=args.cache_root, results_dir=args.results_dir, progress=not args.no_progress,
        content_hash=args.content_hash, workers=args.workers)
        for method in args.methods for seed in args.seeds]
    records = run_configs(configs, Execution("local", args.batch_runs), progress=not args.no_progress)
    table = []
    for method in args.methods:
        label = _run_label(method, soft_labels, schedule)
        rows, columns = [], ()
        for seed, record in zip(args.seeds, [r for r in records if r["config"]["method"] == method]):
            metrics = record["metrics"]
            # base/new/H in base-to-new; otherwise (and for class-specific context) the trained class set only
            columns = ("base", "new", "H") if "new" in metrics and "base" in metrics else (record["config"]["subsample"],)
            values = "  ".join(f"{c} {metrics[c]:.2f}" for c in columns)
            zero_shot = "  ".join(f"{c} {metrics['zero_shot'][c]:.2f}" for c in columns)
            note = " (existing record, skipped)" if record.get("skipped") else ""
            print(f"{args.dataset} {label} seed {seed}: {values}  | zero-shot CLIP: {zero_shot}{note}\n"
                  f"  record: {record['path']}")
            rows.append(metrics)
        means = {c: sum(m[c] for m in rows) / len(rows) for c in columns}
        if "base" in means:  # H of the mean accuracies, as the papers' tables do
            means["H"] = harmonic_mean(means["base"], means["new"])
        table.append((label, columns, means))
    seeds = ",".join(str(s) for s in args.seeds)
    for i, (label, columns, means) in enumerate(table):
        if i == 0 or columns != table[i - 1][1]:
            print(f"| dataset | method | seeds | {' | '.join(columns)} |")
        print(f"| {args.dataset} | {label} | {seeds} | {' | '.join(f'{means[c]:.2f}' for c in columns)} |")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from atlas_fast.engine import evaluate_saved

    accuracies = []
    for record in args.record:
        result = evaluate_saved(record, args.dataset, args.data_root, args.subsample, shots=args.shots,
                                 seed=args.seed, cache_root=args.cache_root, device=args.device,
                                 progress=not args.no_progress)
        accuracies.append(result["accuracy"])
        print(f"{result['dataset']} ({result['subsample']}, {result['num_classes']} classes, {result['num_test']} "
              f"test images): accuracy {result['accuracy']:.2f}  | zero-shot CLIP {result['zero_shot']:.2f}  "
              f"<- {record}")
    if len(accuracies) > 1:
        print(f"mean over {len(accuracies)} runs: {sum(accuracies) / len(accuracies):.2f}")
    return 0


def add_demo_commands(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast demo``: the README's first command (see :mod:`atlas_fast.app.demo`)."""
    from atlas_fast.app.demo import DemoConfig
    from atlas_fast.world.benchmark import BASE_TO_NEW

    defaults = DemoConfig()
    demo = subparsers.add_parser(
        "demo", help="base-to-new CoOp vs CoOp + ATLaS (-CSL, -ISL) on the embedded world, 3 seeds (CPU, minutes)",
        description="Generate the embedded world benchmark (or reuse it), build the feature cache with the shipped "
                    "atlas-world CLIP, train CoOp, + ATLaS, + ATLaS-CSL and + ATLaS-ISL on the base classes over "
                    "3 seeds, and print a table shaped like the paper's Table III (plus a plot and LaTeX).")
    demo.add_argument("--data-root", type=Path, default=defaults.data_root,
                      help=f"where the world benchmark is written (default {defaults.data_root})")
    demo.add_argument("--cache-root", type=Path, default=defaults.cache_root,
                      help=f"feature cache folder (default {defaults.cache_root})")
    demo.add_argument("--results-dir", type=Path, default=defaults.results_dir,
                      help=f"result records, table and plot (default {defaults.results_dir})")
    demo.add_argument("--datasets", nargs="+", default=list(defaults.datasets),
                      help=f"world datasets (default {' '.join(defaults.datasets)}; any of "
                           f"{' '.join(BASE_TO_NEW)})")
    add_seeds(demo, defaults.seeds)
    demo.add_argument("--views", type=int, default=defaults.views,
                      help="cached augmented views per training image (default: one per epoch, the faithful "
                           "setting; fewer is faster, see the README's views study)")
    demo.add_argument("--epochs", type=int, default=None, help="override the CoOp recipe's 200 epochs")
    demo.add_argument("--device", default="auto", help="torch device (default: cuda if available, else cpu)")
    add_progress(demo)
    demo.set_defaults(func=run_demo_command)


def run_demo_command(args: argparse.Namespace) -> int:
    from atlas_fast.app.demo import DemoConfig, run_demo

    config = DemoConfig(data_root=args.data_root, cache_root=args.cache_root, results_dir=args.results_dir,
                        datasets=tuple(args.datasets), seeds=tuple(args.seeds), views=args.views,
                        epochs=args.epochs, device=args.device, plot=args.results_dir / "table3_base2new.png")
    print(run_demo(config, progress=not args.no_progress))
    return 0


def add_experiment_commands(subparsers: argparse._SubParsersAction) -> None:
    """``atlas-fast experiment NAME [options]``: any table or figure of the paper (see :mod:`atlas_fast.experiments`)."""
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atlas-fast", description="Feature-cache-first prompt tuning of CLIP.")
    parser.add_argument("--debug", action="store_true",
                        help="print the full traceback of an error (may also be given after the command)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_cache_commands(subparsers)
    add_train_commands(subparsers)
    add_demo_commands(subparsers)
    add_experiment_commands(subparsers)
    add_report_command(subparsers)
    add_search_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``atlas-fast`` console script; returns the exit status (2 for a user error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args = build_parser().parse_args((["--debug"] if debug else []) + [a for a in argv if a != "--debug"])
    try:
        apply_download(args)
        return int(args.func(args) or 0)
    except user_errors() as exc:
        if debug:
            traceback.print_exc()
        else:
            print(f"error: {exc}", file=sys.stderr)
            print("(run again with --debug for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
