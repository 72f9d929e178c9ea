"""Plan a run once: a :class:`~atlas_fast.engine.config.TrainConfig` becomes a :class:`RunSpec` with every default
resolved (device, precision, backbone fingerprint, method config, recipe), its data listed and fingerprinted, and its
record named.

Planning is the only step that lists the dataset (once per sweep), draws the few-shot subset and fingerprints the
run's images (:func:`load_run_data`); everything after it reads the spec. The record's name covers the data, so
changed data never return old numbers, and data that are gone (a wrong ``--data-root``) are an error. No image is
decoded and no feature is read here.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from atlas_fast.clip.backbones import Backbone, shared_backbone
from atlas_fast.engine.config import TrainConfig, resolve_device, resolve_precision
from atlas_fast.engine.deviations import UNSTORED_DEFAULTS, run_name
from atlas_fast.engine.graphs import device_refusal, graph_steps_refusal
from atlas_fast.engine.run_identity import config_key, data_record_key
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe
from atlas_fast.methods.registry import method_class
from atlas_fast.vocabulary import CLASS_SETS, GRAPH_STEPS_VARIABLE


_SAID: set[tuple] = set()  # notes this process has printed (a command's runs share one: said once per command)


def _first_time(note: tuple) -> bool:
    """Whether ``note`` is said for the first time in this process (then it is remembered)."""
    if note in _SAID:
        return False
    _SAID.add(note)
    return True


def resolve_recipe(config: TrainConfig, dataset: str) -> tuple[MethodConfig, OptimRecipe]:
    """The method config and optimisation recipe of a run on ``dataset`` (registry name): what the method's recipe
    function gives for the config's recipe family, setting and shots, with the overrides."""
    entry = method_class(config.method)
    overrides = {k: getattr(config, k) for k in ("epochs", "batch_size", "lr") if getattr(config, k) is not None}
    try:
        method_config, optim_recipe = entry.recipe_function(config.recipe_family, config.setting, config.shots,
                                                            dataset)
    except MissingRecipe as missing:  # no reference recipe: the caller's epochs, batch size and lr, all three
        if len(overrides) < 3:
            raise
        method_config, optim_recipe = missing.method_config, OptimRecipe(**overrides)
    if config.method_config is not None:
        method_config = config.method_config
    if config.method_options:
        method_config = with_options(method_config, config.method_options)
    return method_config, dataclasses.replace(optim_recipe, **overrides)


def with_options(method_config: MethodConfig, options: dict[str, Any]) -> MethodConfig:
    """``method_config`` with some fields replaced, e.g. ``{"depth": 3}`` for MaPLe on a 4-block backbone. String
    values (from the command line) are converted to the field's type; unknown fields are an error naming the valid
    ones."""
    valid = {f.name: getattr(method_config, f.name) for f in dataclasses.fields(method_config)}
    changes = {}
    for name, value in options.items():
        if name not in valid:
            raise ValueError(f"{type(method_config).__name__} has no option {name!r}; valid: {sorted(valid)}.")
        current = valid[name]
        if isinstance(value, str) and not isinstance(current, str):
            if isinstance(current, bool):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(f"option {name} takes true or false, got {value!r}.")
                value = value.lower() in ("true", "1")
            else:
                try:
                    value = type(current)(value)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"option {name} takes a {type(current).__name__}, got {value!r}.") from exc
        changes[name] = value
    return dataclasses.replace(method_config, **changes)


def _as_dict(value: Any) -> Any:
    if value is None:
        return None
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return dataclasses.asdict(value)


def stored_method_config(method_config: MethodConfig) -> dict[str, Any]:
    """A method config as a record stores it: ``"num_runs": 1`` first, then its fields. Records were first written
    when R was a field of the config (every record describes one run), so every record holds it; it stays in this
    stored spelling so that every run keeps its key and name (:data:`STORED_ONLY` lists it for the readers)."""
    return {"num_runs": 1, **method_config.to_dict()}


#: The method config fields a record holds that no config has (:func:`stored_method_config`).
STORED_ONLY = ("num_runs",)


def describe_run(config: TrainConfig, dataset: str, method_config: MethodConfig, optim_recipe: OptimRecipe,
                 device: torch.device) -> dict[str, Any]:
    """The JSON form of a run's configuration, with every default resolved (what the record hash covers); ``dataset``
    is the registry name, so ``oxford_pets`` and ``OxfordPets`` name the same run. Neither ``graph_steps`` (a speed
    knob) nor the evaluated class sets are part of it (:mod:`atlas_fast.engine.run_identity`)."""
    described = {
        "dataset": dataset, "backbone": config.backbone.to_dict(), "method": config.method,
        "method_config": stored_method_config(method_config), "recipe_family": config.recipe_family,
        "recipe": optim_recipe.to_dict(),
        "setting": config.setting, "shots": config.shots, "seed": config.seed, "subsample": config.train_subsample,
        "soft_labels": _as_dict(config.soft_labels), "schedule": config.schedule.describe(),
        "views": config.views or optim_recipe.epochs, "aug_seed": config.aug_seed,
        "eval_every_epoch": config.eval_every_epoch, "device": device.type,
        "precision": resolve_precision(config.precision, device),
    }
    if config.snapshot_epochs:  # the learned file holds more: such a run is another record (and only then)
        described["snapshot_epochs"] = list(config.snapshot_epochs)
    if config.fewshot_order != UNSTORED_DEFAULTS["fewshot_order"]:  # another K-shot draw: another run (named then)
        described["fewshot_order"] = config.fewshot_order
    return described


def record_stem(config: TrainConfig, record_key: str) -> str:
    """The record's file name stem: readable fields, then the first 12 hex digits of the record's key."""
    soft = config.soft_labels.kind if config.soft_labels is not None else ""
    schedule = config.schedule.name + (f"{config.schedule.period}" if hasattr(config.schedule, "period") else "")
    return (f"{config.method}-{schedule}{('-' + soft) if soft else ''}-{config.setting}-{config.shots}shot-"
            f"seed{config.seed}-{record_key[:12]}")


@dataclass
class RunData:
    """The lists a run trains and evaluates on, and the fingerprint of its inputs (no image decoded)."""

    dataset: str  # the dataset's registry name
    dataset_dir: str
    fewshot: Any  # DatasetSplits: the few-shot subset for the run's seed (test split complete)
    splits: dict[str, Any]  # evaluation class subsets (base/new/all), the training one included
    train_subsample: str
    fingerprint: str  # listing of the full dataset + identity of every image the run reads
    shots_used: dict[str, int]  # fewest and most training images of any class
    domain: Any = None  # DatasetSplits: every class's every training image, for a method that trains on the domain

    @property
    def train_split(self):
        """The classes and images the run trains on: the few-shot subset's training class set, or the whole
        domain (every training image of every class, unlabeled: PromptKD)."""
        return self.domain if self.domain is not None else self.splits[self.train_subsample]

    def describe(self, content_hash: bool) -> dict[str, Any]:
        """The record's ``data`` field."""
        train = self.train_split
        return {"dataset": self.dataset, "fingerprint": self.fingerprint, "content_hash": content_hash,
                "num_train": len(train.train), "num_classes": len(train.classnames),
                "classnames": list(train.classnames), "shots_used": self.shots_used,
                "num_test": {name: len(split.test) for name, split in self.splits.items()}}


def evaluation_subsamples(train_subsample: str, method_config: MethodConfig,
                          evaluate: Sequence[str] | None = None) -> list[str]:
    """The class subsets a run is evaluated on: ``evaluate`` (the config's choice, already checked to hold the
    training subset), or by default its training subset and, in base-to-new, new and all. Class-specific context
    (CoOp CSC) is tied to the training classes, so it gets only the training subset whatever was asked."""
    if getattr(method_config, "csc", False):
        return [train_subsample]
    if evaluate is not None:
        return list(evaluate)
    if train_subsample == "base":
        return list(CLASS_SETS)
    return [train_subsample]


def load_run_data(config: TrainConfig, subsamples: list[str], evaluation_only: bool = False,
                  listings: dict | None = None, domain: bool = False) -> RunData:
    """List the dataset, draw the few-shot subset, split the classes and fingerprint the run's images; refuse data
    the run cannot use (no training images, an evaluation class set without test images). ``evaluation_only``: the
    data of a saved run's evaluation (no training list needed; the few-shot draw only defines base/new, so the
    ``all`` class set is the full dataset). ``listings``: by (dataset, data root), the listings and what the runs
    of one sweep share on them, computed once per sweep; each run still draws and fingerprints its own few-shot
    subset. ``domain``: the run trains on every training image of every class (a method's ``trains_on_domain``)."""
    from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes
    from atlas_fast.data.fewshot import shots_used
    from atlas_fast.data.identity import subset_fingerprint

    key = (config.dataset, str(config.data_root))
    listed = listings.get(key) if listings is not None else None
    if listed is None:
        listed = (load_dataset(config.dataset, config.data_root), {})
        if listings is not None:
            listings[key] = listed
    full, memo = listed
    fewshot = full
    if not (evaluation_only and subsamples == ["all"]):
        fewshot = fewshot_subset(full, config.shots, config.seed,
                                 store_dir=Path(config.cache_root) / full.name / "split_fewshot", memo=memo,
                                 order=config.fewshot_order)
    splits = {name: subsample_classes(fewshot, name, memo) for name in subsamples}
    whole = subsample_classes(full, "all", memo) if domain and not evaluation_only else None
    train_split = whole if whole is not None else splits[config.train_subsample]
    if not train_split.train and not evaluation_only:
        raise ValueError(f"{full.name}: the {config.train_subsample!r} training list is empty.")
    for name, split in splits.items():
        if not split.test:
            raise ValueError(f"{full.name} ({full.dataset_dir}): no test images for the {name!r} classes "
                             f"({split.num_classes} classes); the run could not be evaluated. Add test images or "
                             f"use --setting few_shot.")
    fingerprint = subset_fingerprint(full, fewshot, config.content_hash, memo)
    if whole is not None:  # the images it trains on are every training image: the whole listing's identity
        fingerprint = subset_fingerprint(full, full, config.content_hash, memo)
    return RunData(full.name, str(full.dataset_dir), fewshot, splits, config.train_subsample, fingerprint,
                   shots_used(train_split), whole)


@dataclass
class RunSpec:
    """A planned run: its config (paths absolute), everything resolved, its data listed, its record named. Small and
    picklable (no model inside), so a sweep's workers (Ray, SLURM) train from the spec."""

    config: TrainConfig
    device: torch.device
    amp: bool
    backbone_fingerprint: str
    method_config: MethodConfig
    optim_recipe: OptimRecipe
    described: dict[str, Any]
    config_key: str  # configuration + backbone (data-free): the record's "config_key"
    data: RunData
    record_key: str  # configuration + backbone + data: the record's "key"
    plan_seconds: float = 0.0

    @property
    def dataset(self) -> str:
        return self.data.dataset

    @property
    def method(self) -> type[PromptMethod]:
        return method_class(self.config.method)

    @property
    def views(self) -> int:
        return self.config.views or self.optim_recipe.epochs

    @property
    def stem(self) -> str:
        return record_stem(self.config, self.record_key)

    def legacy_stems(self) -> list[tuple[str, str]]:
        """(stem, record key) of the names this run's record had before evaluation stopped naming runs: one per
        non-default choice of evaluated class sets (a finished record under one of them is this run's)."""
        from itertools import combinations

        default = evaluation_subsamples(self.config.train_subsample, self.method_config)
        names = []
        for size in range(1, len(CLASS_SETS) + 1):
            for sets in combinations(CLASS_SETS, size):
                if self.config.train_subsample in sets and list(sets) != default:
                    key = config_key({**self.described, "evaluate": list(sets)}, self.backbone_fingerprint)
                    record_key = data_record_key(key, self.data.fingerprint)
                    names.append((record_stem(self.config, record_key), record_key))
        return names

    @property
    def name(self) -> str:
        """``OxfordPets coop+ATLaS-ISL (K=2) [θ=0.3, epochs=2] seed 1``: the run as its progress and dry-run lines
        name it, with what it changes from the recipe and the paper's presets."""
        return f"{self.dataset} {run_name(self.described)} seed {self.config.seed}"

    def backbone(self) -> Backbone:
        """The frozen CLIP on the run's device (loaded once per process); weights other than the ones the run was
        planned with (another file on a worker) are refused."""
        resolve_device(str(self.device))  # refuses a GPU this worker lacks
        backbone = shared_backbone(self.config.backbone, self.device)
        if backbone.fingerprint != self.backbone_fingerprint:
            raise ValueError(f"The backbone {backbone.describe()} here differs from the one run {self.stem} was "
                             f"planned with ({self.backbone_fingerprint[:12]}); point every worker at the same "
                             f"weights.")
        return backbone


def check_prompt_depths(entry: type[PromptMethod], method_config: MethodConfig, backbone: Backbone) -> None:
    """Refuse prompt depths deeper than the backbone's towers, naming every option that needs lowering (the
    registry entry says which config fields are depths: ``depth_text``/``depth_vision`` count the text/vision
    tower's blocks, any other the shallower tower's)."""
    model = backbone.model
    text = len(model.transformer.resblocks) if hasattr(model, "transformer") else 0
    vision = len(getattr(getattr(model.visual, "transformer", None), "resblocks", ())) or text
    too_deep = {}
    for option in entry.depth_options:
        layers = text if "text" in option else vision if "vision" in option else min(text, vision)
        if getattr(method_config, option) > layers:
            too_deep[option] = layers
    if too_deep:
        fix = " ".join(f"{option}={layers}" for option, layers in too_deep.items())
        raise ValueError(f"{entry.name}: prompt depth(s) {', '.join(f'{o}={getattr(method_config, o)}' for o in too_deep)} "
                         f"exceed the towers of {backbone.config.model} ({text} text / {vision} vision blocks); "
                         f"lower them with --method-option {fix} (Python: method_options={{...}}).")


def absolute_paths(config: TrainConfig) -> TrainConfig:
    """``config`` with its data, cache and results paths absolute (workers may start in another folder)."""
    return dataclasses.replace(config, **{k: Path(getattr(config, k)).expanduser().absolute()
                                          for k in ("data_root", "cache_root", "results_dir")})


def graph_steps_asked() -> str:
    """How graph steps came to be asked for, in the command line's words and the API's: ``--graph-steps on``, the
    environment variable where it says on, ``graph_steps=True`` (a refusal names what the user set)."""
    asked = "--graph-steps on"
    if os.environ.get(GRAPH_STEPS_VARIABLE, "").strip().lower() == "on":
        asked += f", or {GRAPH_STEPS_VARIABLE}=on in the environment"
    return asked + "; Python: graph_steps=True"


def graph_steps_error(refusal: str) -> str:
    """The error of graph steps asked for where they cannot run: why, what asked for them, the way out."""
    return (f"{refusal} (asked for by {graph_steps_asked()}); use --graph-steps auto (graphs wherever they apply) or "
            f"off (Python: graph_steps=None or False): it only changes the speed.")


def refuse_graph_steps_off_cuda(graph_steps: bool | None, device: str) -> None:
    """Graph steps asked for (``True``) on a device without CUDA graphs are refused before a command's own work
    (the world generated, data listed, weights loaded), with the error :func:`plan_run` would give each run."""
    if graph_steps:
        refusal = device_refusal(resolve_device(device))
        if refusal:
            raise ValueError(graph_steps_error(refusal))


def plan_run(config: TrainConfig, for_workers: bool = False, listings: dict | None = None) -> RunSpec:
    """Resolve ``config`` into a :class:`RunSpec` (loads the backbone once per process to fingerprint it, lists and
    fingerprints the data). ``for_workers``: the run trains elsewhere (Ray, SLURM), so its device may be one this
    machine lacks; the backbone is then fingerprinted on the CPU. ``listings``: shared by the plans of one sweep, so
    a dataset is listed once per sweep (:func:`load_run_data`)."""
    clock = time.perf_counter()
    config = absolute_paths(config)
    entry = method_class(config.method)
    if not entry.learns and not config.schedule.plain:
        raise ValueError(f"{config.method} learns nothing, so the {config.schedule.name!r} label schedule has "
                         f"nothing to supervise; run it without soft labels (schedule OneHot, --atlas none).")
    if not entry.uses_labels and not config.schedule.plain:
        raise ValueError(f"{config.method} trains without labels (it distils its teacher's predictions on every "
                         f"view), so the {config.schedule.name!r} label schedule has no cross-entropy to act on; run "
                         f"it with the plain schedule (OneHot, --atlas none) and compare it with the base method "
                         f"+ ATLaS (docs/method-zoo.md, sections KDPL and PromptKD).")
    device = resolve_device(config.device, elsewhere=for_workers)
    here = device.type != "cuda" or torch.cuda.is_available()
    amp = resolve_precision(config.precision, device) == "amp"
    if amp and device.type != "cuda":
        raise ValueError("precision='amp' needs a CUDA device; use 'fp32' (or 'auto') on the CPU.")
    if config.graph_steps:
        refusal = graph_steps_refusal(entry, [config.schedule], device)
        if refusal:
            raise ValueError(graph_steps_error(refusal))
    from atlas_fast.clip.open_clip_names import model_name
    from atlas_fast.data.datasets import dataset_spec

    model_name(config.backbone.model)  # names and data are checked before any weights are loaded or downloaded
    dataset = dataset_spec(config.dataset).name
    method_config, optim_recipe = resolve_recipe(config, dataset)
    epochs, warmup = optim_recipe.epochs, optim_recipe.warmup_epochs
    if epochs <= warmup:
        warnings.warn(f"{config.method} on {dataset}: {epochs} epoch(s) with {warmup} warmup epoch(s) at lr "
                      f"{optim_recipe.warmup_lr:g} leave no epoch at the recipe's lr {optim_recipe.lr:g}: the "
                      f"prompts barely move. Train at least {warmup + 1} epochs.", stacklevel=2)
    data = load_run_data(config, evaluation_subsamples(config.train_subsample, method_config, config.evaluate),
                         listings=listings, domain=entry.trains_on_domain)
    method_config = entry.planned_config(method_config, dataset, data.train_split.classnames)  # files the options name
    if optim_recipe.iterations is not None:  # a schedule over optimiser steps: its epochs follow from the images
        optim_recipe = optim_recipe.for_training_images(len(data.train_split.train), config.epochs)
    if config.snapshot_epochs and config.snapshot_epochs[-1] > optim_recipe.epochs:
        raise ValueError(f"snapshot_epochs {list(config.snapshot_epochs)} go past the run's {optim_recipe.epochs} "
                         f"epochs.")
    if data.shots_used["min"] < config.shots and _first_time((dataset, config.shots, *data.shots_used.values())):
        used = data.shots_used
        which, uses = (("every class has", f"{used['min']}") if used["max"] < config.shots and used["min"] == used["max"]
                       else ("some classes have", f"{used['min']}..{used['max']}"))
        print(f"note: {dataset}: {which} fewer than {config.shots} training images; the run uses {uses} per class "
              f"(recorded in the record's data.shots_used).", file=sys.stderr)
    backbone = shared_backbone(config.backbone, device if here else torch.device("cpu"))
    check_prompt_depths(entry, method_config, backbone)
    entry.check_before_work(method_config, backbone)
    described = describe_run(config, dataset, method_config, optim_recipe, device)
    key = config_key(described, backbone.fingerprint)
    return RunSpec(config, device, amp, backbone.fingerprint, method_config, optim_recipe, described, key, data,
                   data_record_key(key, data.fingerprint), round(time.perf_counter() - clock, 4))
