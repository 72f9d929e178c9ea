"""Command-line options shared by ``train``, ``search``, ``eval``, ``cache``, ``experiment`` and ``demo``, with one
spelling and one meaning each; nothing here imports torch, so ``--help`` and argument errors are instant.

The options that set a :class:`~atlas_fast.engine.config.TrainConfig` field are declared once, in :data:`RUN_OPTIONS`:
:func:`add_options` adds those a command offers to its parser and :func:`train_config` builds the config from
them. Their choices are the vocabulary's (:mod:`atlas_fast.vocabulary`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from atlas_fast.app.catalogue import method_names, pixel_method_names
from atlas_fast.errors import UsageError, did_you_mean, distinct, short_repr
from atlas_fast.vocabulary import (CLASS_SETS, DELTAS, FEWSHOT_ORDERS, GRAPH_STEPS, GRAPH_STEPS_VARIABLE, NO_SOFT_LABELS,
                                   PRECISIONS, RECIPE_FAMILIES, SCHEDULE_CHOICES, SETTINGS, SOFT_LABEL_CHOICES,
                                   environment_graph_steps)

if TYPE_CHECKING:
    from atlas_fast.atlas.variants import LabelVariant
    from atlas_fast.engine.config import TrainConfig

# An option table: destination -> (flags, add_argument keywords); a command adds the entries it offers by name
# (add_options), so each option is declared once.
OptionTable = dict[str, tuple[tuple[str, ...], dict[str, Any]]]


def pretrained_tag(value: str) -> str | None:
    """``--pretrained``: an open_clip tag or checkpoint file; 'none' (or 'random', '') means random weights. A file
    that is not there is refused here, as the line is parsed: before torch is imported or anything is planned."""
    from atlas_fast.clip.weights_files import missing_weights_message, random_weights  # no torch

    if random_weights(value):
        return None
    missing = missing_weights_message(value, "checkpoint file")
    if missing is not None:
        raise argparse.ArgumentTypeError(missing)
    return value


# The backbone --model/--pretrained stand for when neither is given: the paper's CLIP, or for the embedded world's
# datasets the world's own CLIP (model_configs/atlas-world.json with its shipped checkpoint), as demo and --world use.
DEFAULT_BACKBONE = ("ViT-B-16", "openai")
WORLD_BACKBONE = ("atlas-world", "atlas-world")
WORLD_TOWER_LAYERS = 4  # blocks per tower of the atlas-world CLIP (model_configs/atlas-world.json)


class UnknownName(LookupError):
    """A method or dataset name that does not exist, found while the command line is parsed. Not a ValueError, which
    argparse would turn into its usage: it reaches :func:`atlas_fast.cli.main`, which reports it as one ``error:``
    line like every other bad value (before the other arguments are checked, so a typo is named first)."""


def dataset_name(value: str) -> str:
    """argparse ``type`` of ``--dataset``: a registry name is checked as it is parsed, so a typo is named even when
    other required options are missing (``folder:`` / ``split:`` datasets are checked when they are read)."""
    if ":" not in value:
        from atlas_fast.data.datasets import dataset_spec  # no torch

        try:
            dataset_spec(value)
        except ValueError as exc:
            raise UnknownName(str(exc)) from None
    return value


def add_data_and_backbone(parser: argparse.ArgumentParser) -> None:
    """--dataset, --data-root, --model, --pretrained, --download: the options every data-reading command takes
    (left unset, --model/--pretrained are filled in by :func:`resolve_backbone`)."""
    parser.add_argument("--dataset", required=True, type=dataset_name, help="dataset registry name, e.g. OxfordPets")
    add_data_root(parser)
    add_options(parser, ("model", "pretrained"))
    add_download(parser)


def add_data_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-root", required=True, type=Path, help="folder that holds the dataset folders")


def is_world_dataset(name: str) -> bool:
    """Whether ``name`` (any spelling the registry takes) is one of the embedded world's datasets."""
    from atlas_fast.data.datasets import find_dataset_spec
    from atlas_fast.world.benchmark import WORLD_BY_NAME  # no torch

    spec = find_dataset_spec(name) if ":" not in name else None
    return spec is not None and spec.name in WORLD_BY_NAME


def resolve_backbone(args: argparse.Namespace) -> None:
    """Fill in ``--model``/``--pretrained`` the user left unset (the run options ``model`` and ``pretrained``; done
    again, it changes nothing): the embedded world's datasets (``--dataset`` or every one of ``--datasets``) imply
    the world's model, any others the paper's ViT-B-16; the world's model implies its shipped checkpoint, any other
    openai's weights."""
    if args.model is None:
        datasets = getattr(args, "datasets", None) or [args.dataset]
        world = all(is_world_dataset(name) for name in datasets)
        args.model = WORLD_BACKBONE[0] if world else DEFAULT_BACKBONE[0]
    if not hasattr(args, "pretrained"):
        args.pretrained = WORLD_BACKBONE[1] if args.model == WORLD_BACKBONE[0] else DEFAULT_BACKBONE[1]


def world_method_options() -> list[str]:
    """``METHOD:OPTION=4`` for every prompt-depth option of every registered method (their registry entries name
    them): the world's towers have :data:`WORLD_TOWER_LAYERS` blocks, fewer than the recipes' depths."""
    from atlas_fast.methods import METHODS

    return [f"{name}:{option}={WORLD_TOWER_LAYERS}" for name, entry in METHODS.items()
            for option in entry.depth_options]


# The options that set a TrainConfig field, each declared once: destination (the field, except the backbone's
# model/pretrained and --graph-steps' choice) -> (flags, add_argument keywords). A command offers those it names to
# add_options; train_config reads every one it finds.
RUN_OPTIONS: OptionTable = {
    "model": (("--model",), dict(
        default=None, help="open_clip model name (default ViT-B-16; for the World* datasets the world's own CLIP, "
                           "atlas-world)")),
    "pretrained": (("--pretrained",), dict(
        type=pretrained_tag, default=argparse.SUPPRESS,
        help="open_clip tag, checkpoint file (e.g. ~/.cache/clip/ViT-B-16.pt), or 'none' for random weights (default "
             "openai; for --model atlas-world its shipped checkpoint, atlas-world)")),
    "recipe_family": (("--recipe",), dict(
        choices=RECIPE_FAMILIES, default="paper",
        help="recipe family: the ATLaS paper's (default) or the method repository's own")),
    "setting": (("--setting",), dict(
        choices=SETTINGS, default="base2new",
        help="protocol: picks the recipe, the ATLaS presets and the class subset (default base2new)")),
    "shots": (("--shots",), dict(type=int, default=16, help="training images per class (default 16)")),
    "subsample": (("--subsample",), dict(
        choices=CLASS_SETS, default=None, help="training classes (default: base for base2new, all otherwise)")),
    "epochs": (("--epochs",), dict(type=int, default=None, help="override the recipe's epochs")),
    "batch_size": (("--batch-size",), dict(type=int, default=None, help="override the recipe's batch size")),
    "lr": (("--lr",), dict(type=float, default=None, help="override the recipe's learning rate")),
    "views": (("--views",), dict(type=int, default=None, help="cached augmented views (default: = epochs)")),
    "aug_seed": (("--aug-seed",), dict(type=int, default=0, help="seed of the augmented views (default 0)")),
    "eval_every_epoch": (("--eval-every-epoch",), dict(action="store_true",
                                                       help="record accuracy after every epoch")),
    "device": (("--device",), dict(default="auto", help="torch device (default: cuda if available, else cpu)")),
    "precision": (("--precision",), dict(choices=PRECISIONS, default="auto",
                                         help="auto = fp16 autocast on CUDA, fp32 on CPU")),
    "graph_steps": (("--graph-steps",), dict(
        choices=tuple(GRAPH_STEPS), default=argparse.SUPPRESS,
        help="replay each training step from a CUDA graph (same numbers, fewer launches): auto = for every method, "
             "cached or pixel, wherever the device is CUDA (a CPU trains eagerly); on = refuse runs a graph cannot "
             "replay; off = eager steps, e.g. to rule graphs out on a new GPU. Default: the "
             f"{GRAPH_STEPS_VARIABLE} environment variable (auto|on|off) if set, else auto")),
    "cache_root": (("--cache-root",), dict(type=Path, default=Path("cache"), help="cache folder (default ./cache)")),
    "results_dir": (("--results-dir",), dict(type=Path, default=Path("results"),
                                             help="records (default ./results)")),
    "fewshot_order": (("--fewshot-order",), dict(
        choices=FEWSHOT_ORDERS, default="coop",
        help="how a seed draws its K-shot subsets: coop = CoOp's and Dassl's order, training then validation "
             "(default); clip-lora = CLIP-LoRA's dataset readers' order, validation first (its published runs' "
             "training images)")),
    "save_predictions": (("--save-predictions",), dict(
        action="store_true",
        help="also save each run's per-image predictions beside its record (<record>.predictions.npz: the scaled "
             "logits, float32, and labels of every evaluated class set; 4 MB per 1,000 test images at 1,000 "
             "classes), covered by the record's seal")),
    "content_hash": (("--content-hash",), dict(
        action="store_true", help="identify images by a hash of their bytes, not size+mtime (reads every image)")),
}


# The label schedule's options (ATLaS and the baselines), each declared once: destination -> (flags, keywords).
# --atlas KIND is the paper's word for the soft-label kind (soft_kind); variant_from_args reads every one it finds.
LABEL_OPTIONS: OptionTable = {
    "soft_kind": (("--atlas",), dict(
        choices=SOFT_LABEL_CHOICES, default=NO_SOFT_LABELS,
        help="soft labels: none (plain method), ls (uniform), csl (class-wise), isl (instance-wise), mix "
             "(w*CSL + (1-w)*ISL), with the setting's ATLaS presets")),
    "schedule": (("--schedule",), dict(
        choices=SCHEDULE_CHOICES, default="auto",
        help="auto = atlas with --atlas, one-hot without; joint = CE(y) + CE(soft) every step; ols / tfkd = the "
             "online-LS and teacher-free-KD baselines (no --atlas)")),
    "K": (("--K",), dict(type=int, default=None,
                         help="ATLaS period: soft labels every K-th epoch (default: the setting's preset, 1 = always "
                              "soft)")),
    "theta": (("--theta",), dict(type=float, default=None, help="LS smoothing (default: preset)")),
    "tau_c": (("--tau-c",), dict(type=float, default=None, help="CSL temperature (default: preset)")),
    "alpha": (("--alpha",), dict(type=float, default=None, help="ISL rectification coefficient (default: preset)")),
    "delta": (("--delta",), dict(choices=DELTAS, default=None, help="when ISL rectifies (default: preset)")),
    "w": (("--w",), dict(type=float, default=None, help="CSL weight of --atlas mix (default 0.3)")),
    "top_k": (("--top-k",), dict(type=int, default=None, help="CSL: keep the k most similar classes per row")),
    "ols_alpha": (("--ols-alpha",), dict(type=float, default=0.5, help="OLS weight of the one-hot CE (default 0.5)")),
    "tfkd_a": (("--tfkd-a",), dict(type=float, default=0.9, help="TF-KD teacher's true-class probability (0.9)")),
    "tfkd_alpha": (("--tfkd-alpha",), dict(type=float, default=0.1, help="TF-KD weight of the KL term (default 0.1)")),
    "tfkd_tau": (("--tfkd-tau",), dict(type=float, default=20.0, help="TF-KD temperature (default 20)")),
}
# The soft labels' own hyper-parameters among them (each replaces the setting's preset where given), and each
# baseline schedule's options (its field -> the option's destination).
SOFT_LABEL_OVERRIDES = ("theta", "tau_c", "alpha", "delta", "w", "top_k")
SCHEDULE_OPTIONS = {"ols": {"alpha": "ols_alpha"}, "tfkd": {"a": "tfkd_a", "alpha": "tfkd_alpha", "tau": "tfkd_tau"}}

# How a command's runs are executed rather than what they are (not TrainConfig fields), each declared once.
EXECUTION_OPTIONS: OptionTable = {
    "batch_runs": (("--batch-runs",), dict(
        type=int, default=None, metavar="R",
        help="compatible runs (e.g. the seeds of a method and variant) trained together as one module (default: as "
             "many as there are, up to 12 on a GPU / 4 on the CPU); 1 trains them one by one. Same records either "
             "way")),
    "estimate": (("--estimate",), dict(
        action="store_true",
        help="price the runs on this machine (time per phase, features to encode, cache bytes, peak memory) from "
             "units measured once and kept under --cache-root; train nothing")),
}


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, names: Sequence[str]) -> None:
    """Add the options ``names`` (keys of :data:`RUN_OPTIONS`, :data:`LABEL_OPTIONS` or :data:`EXECUTION_OPTIONS`,
    in that order) to ``parser`` or an argument group of it."""
    for name in names:
        flags, keywords = {**RUN_OPTIONS, **LABEL_OPTIONS, **EXECUTION_OPTIONS}[name]
        parser.add_argument(*flags, dest=name, **keywords)


def variant_from_args(args: argparse.Namespace) -> LabelVariant:
    """The :class:`~atlas_fast.atlas.variants.LabelVariant` (schedule and soft labels) the label options on ``args``
    ask for, from the setting's presets; an option the command does not offer keeps its default. Whether the
    schedule and the soft labels go together is :func:`atlas_fast.atlas.schedules.check_soft_labels`' to say."""
    from atlas_fast.atlas.variants import label_variant

    values = {name: getattr(args, name, keywords.get("default")) for name, (_, keywords) in LABEL_OPTIONS.items()}
    schedule_options = {field: values[name] for field, name in SCHEDULE_OPTIONS.get(values["schedule"], {}).items()}
    return label_variant(args.setting, values["soft_kind"], values["schedule"], period=values["K"],
                         schedule_options=schedule_options or None,
                         **{name: values[name] for name in SOFT_LABEL_OVERRIDES if values[name] is not None})


def train_config(args: argparse.Namespace, **fields: Any) -> TrainConfig:
    """The :class:`~atlas_fast.engine.config.TrainConfig` the run options on ``args`` ask for (those the command
    offers; the others keep the config's defaults, as do ``--workers`` and ``--no-progress`` when absent), with
    ``fields`` (dataset, method, seed, label schedule...: what the command decides) set over them. An unset
    ``--model``/``--pretrained`` is resolved first (:func:`resolve_backbone`)."""
    graph_steps = command_graph_steps(args)  # a bad environment variable is named before torch is imported
    from atlas_fast.clip.backbones import BackboneConfig
    from atlas_fast.engine.config import TrainConfig

    resolve_backbone(args)
    values: dict[str, Any] = {name: getattr(args, name) for name in RUN_OPTIONS
                              if hasattr(args, name) and name not in ("model", "pretrained", "graph_steps")}
    values["backbone"] = BackboneConfig(args.model, args.pretrained)
    values["graph_steps"] = graph_steps
    if hasattr(args, "workers"):
        values["workers"] = args.workers
    if hasattr(args, "no_progress"):
        values["progress"] = not args.no_progress
    return TrainConfig(**{**values, **fields})


def command_graph_steps(args: argparse.Namespace) -> bool | None:
    """``TrainConfig.graph_steps`` for a command: its ``--graph-steps`` where given, else the environment variable
    (:data:`~atlas_fast.vocabulary.GRAPH_STEPS_VARIABLE`), else auto (None). A bad value of the variable is a
    :class:`UsageError` naming it and the valid values."""
    if hasattr(args, "graph_steps"):
        return GRAPH_STEPS[args.graph_steps]
    try:
        return environment_graph_steps()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class Distinct(argparse.Action):
    """A list option (``nargs="+"``) whose values must differ: one given twice is refused as it is parsed, before
    any import or work (:func:`atlas_fast.errors.distinct`'s :class:`UsageError`, which argparse lets through to
    the command's one ``error:`` line)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, distinct(values, self.option_strings[0]))


def add_seeds(parser: argparse.ArgumentParser, default: Sequence[int]) -> None:
    """``--seeds 1 2 3`` (``--seed`` is the same option; a seed given twice is refused as it is parsed)."""
    parser.add_argument("--seeds", "--seed", dest="seeds", type=int, nargs="+", default=list(default), action=Distinct,
                        metavar="SEED", help=f"seed(s), e.g. --seeds 1 2 3 (default {' '.join(map(str, default))})")


def check_range(option: str, value: float | int | None, low: float, high: float | None = None) -> None:
    """Refuse an option's number outside ``[low, high]`` (or NaN), naming the option and quoting at most a short
    prefix of the value: the checks the library makes later, made before anything is read or encoded."""
    if value is None:
        return
    if not (low <= value and (high is None or value <= high)):  # NaN fails both comparisons
        bound = f">= {low:g}" if high is None else f"in [{low:g}, {high:g}]"
        raise UsageError(f"{option} must be {bound}, got {short_repr(value)}.")


def method_name(learning_only: bool = False, among: Sequence[str] | None = None):
    """argparse ``type`` of ``--methods``: an unknown name is refused as it is parsed (so a typo is named even when
    other required options are missing), from the method files' declarations, importing no torch."""
    def check(value: str) -> str:
        try:
            check_methods([value], learning_only, among)
        except UsageError as exc:
            raise UnknownName(str(exc)) from None
        return value

    return check


def add_methods(parser: argparse.ArgumentParser, default: Sequence[str] | None, learning_only: bool = False, *,
                among: Sequence[str] | None = None, help: str | None = None) -> None:
    """``--methods M [M ...]`` (``--method`` is the same option; a name given twice is refused), checked against
    the registered methods as it is parsed (``learning_only``: without zero-shot CLIP, which an experiment adds
    with ``--zero-shot``; ``among``: only these). ``default`` None: the command decides (e.g. all it knows);
    ``help`` replaces the listing of the methods where the command takes few of them."""
    names = list(among) if among is not None else method_names(learning_only)
    notes = [note for note, shown in (("dept-* = DePT's head on coop/cocoop/kgcoop/maple", "dept-coop" in names),
                                      ("zsclip = zero-shot CLIP (nothing trained)", "zsclip" in names)) if shown]
    notes.append(f"{', '.join(n for n in pixel_method_names() if n in names)} prompt or adapt the image encoder and "
                 "train on pixels, the others on cached image features")
    parser.add_argument("--methods", "--method", dest="methods", nargs="+", metavar="METHOD",
                        default=list(default) if default is not None else None,
                        type=method_name(learning_only, among), action=Distinct,
                        help=help or f"prompt method(s): {', '.join(names)} (default {' '.join(default or ['all'])}); "
                                     + "; ".join(notes))


def check_methods(methods: Sequence[str], learning_only: bool = False, among: Sequence[str] | None = None) -> None:
    """Refuse a method name that is neither declared in the method files nor registered in this process (or not
    ``among`` the command's)."""
    known = list(among) if among is not None else method_names(learning_only)
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise UsageError(f"unknown method {unknown[0]!r}{did_you_mean(unknown[0], known)}; valid: {', '.join(known)}.")


def add_method_options(parser: argparse.ArgumentParser) -> None:
    """``--method-option [METHOD:]NAME=VALUE ...``: fields of a method's recipe config to replace."""
    parser.add_argument("--method-option", nargs="+", action="extend", default=[], metavar="[METHOD:]NAME=VALUE",
                        help="replace a field of a method's recipe config, e.g. depth=3 or maple:depth=3 (for that "
                             "method only); for backbones whose towers are shallower than the recipe's prompt depth")


def method_options(items: Sequence[str], method: str, methods: Sequence[str] | None = None) -> dict[str, str] | None:
    """The ``--method-option`` values that apply to ``method`` (``maple:depth=3`` or an unprefixed ``NAME=VALUE``),
    as strings (converted to the fields' types when the run is planned). A prefix that names no method of the
    command (``methods``: its ``--method`` list; None: any method atlas_fast knows) is refused, as an unknown option
    name is later: a misspelt ``clip-lora-txt:rank=4`` would otherwise train with the recipe's rank."""
    options = {}
    for item in items:
        target, _, assignment = item.rpartition(":")
        name, sep, value = assignment.partition("=")
        if not sep or not name:
            raise UsageError(f"--method-option takes [METHOD:]NAME=VALUE, got {item!r}")
        allowed = list(methods) if methods is not None else method_names()
        if target and target not in allowed:
            which = (f"--method {' '.join(methods)}" if methods is not None
                     else f"valid: {', '.join(allowed)}")
            raise UsageError(f"--method-option {short_repr(item)}: {short_repr(target)} names no method of this "
                             f"command ({which}); prefix one of them, or give {name}={value} without a prefix for "
                             f"every method.")
        if target in ("", method):
            options[name.replace("-", "_")] = value
    check_option_files(options)
    return options or None


def check_option_files(options: dict[str, str]) -> None:
    """Refuse a ``--method-option`` file that is not there (``teacher_pretrained=``, KDPL-CA's
    ``agnostic_classnames=``) as the line is read, before torch is imported, in the words the run's own checks use."""
    from atlas_fast.clip.weights_files import in_teacher_words, missing_weights_message, random_weights  # no torch
    from atlas_fast.data.dictionary import read_classnames  # no torch

    for name, value in options.items():
        if name.endswith("_pretrained") and not random_weights(value):
            missing = missing_weights_message(value, "checkpoint file")
            if missing is not None:
                words = in_teacher_words(missing, name.removesuffix("_pretrained"), name)
                raise UsageError(f"--method-option {name}: the teacher's {words}")
        elif name == "agnostic_classnames" and value:
            try:
                read_classnames(value)
            except ValueError as exc:
                raise UsageError(str(exc)) from None


def add_workers(parser: argparse.ArgumentParser) -> None:
    """``--workers N``: image decoding processes (pixel methods, cache builds), the same in every command."""
    parser.add_argument("--workers", type=int, default=None,
                        help="image decoding processes (default: up to 8 on a GPU, none on the CPU for training; a cache "
                             "build: every CPU this process may use but one on a GPU, one on the CPU)")


def add_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (bars are also off when the output is not a terminal, e.g. a log)")


def add_download(parser: argparse.ArgumentParser) -> None:
    """``--download``: allow fetching pretrained weights that are not cached yet (never done silently)."""
    parser.add_argument("--download", action="store_true",
                        help="download the pretrained weights of --pretrained TAG if they are not cached yet (without "
                             "it, a missing download is an error at once)")


def apply_download(args: argparse.Namespace) -> None:
    """Let this process (and the workers it starts) download weights when ``--download`` was given."""
    import os

    if getattr(args, "download", False):
        from atlas_fast.clip.weights_files import DOWNLOAD_VARIABLE

        os.environ[DOWNLOAD_VARIABLE] = "1"
