"""Train one prompt method and record the result: ``run(config)`` is the pipeline

    plan (:mod:`atlas_fast.plan`) -> inputs (:mod:`atlas_fast.inputs`) -> loop (:mod:`atlas_fast.loop`)
    -> evaluate (:mod:`atlas_fast.evaluate`) -> record (:mod:`atlas_fast.results`)

Planning resolves the recipe and names the record; an identical finished run on the same data (its listing and
fingerprint match) is returned before any feature is encoded or any step is trained.
Inputs are the few-shot subset per seed and its base/new split, the feature cache (train views 0..V, test view 0)
and the soft labels, computed once. A sweep is a plain loop over configs::

    from atlas_fast.train import TrainConfig, run
    for seed in (1, 2, 3):
        record = run(TrainConfig("OxfordPets", "data", seed=seed, soft_labels=atlas_preset("base2new"),
                                 schedule=Atlas(2)))
        print(record["metrics"])

Epoch ``e`` reads cached augmented view ``1 + (e mod V)``. Runs are deterministic per seed on the CPU; on a GPU the
forward runs under fp16 autocast with a gradient scaler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from atlas_fast.backbones import BackboneConfig
from atlas_fast.evaluate import evaluate_method, evaluate_run, summarize
from atlas_fast.inputs import PRELOAD_BYTES, CachedViews, RunInputs, TrainInputs, prepare_inputs  # noqa: F401
from atlas_fast.loop import lr_at_epoch, train_epochs  # noqa: F401
from atlas_fast.methods.base import RECIPE_FAMILIES, MethodConfig
from atlas_fast.plan import (RunPlan, describe_run, plan_run, recipe_functions, record_stem,  # noqa: F401
                             resolve_device, resolve_recipe)
from atlas_fast.results import build_record
from atlas_fast.schedules import LabelSchedule, OneHot

if TYPE_CHECKING:
    from atlas_fast.softlabels import SoftLabelConfig

Setting = Literal["base2new", "few_shot", "cross_dataset"]
SETTINGS = ("base2new", "few_shot", "cross_dataset")
PRECISIONS = ("auto", "fp32", "amp")


@dataclass
class TrainConfig:
    """Everything that defines one training run (and, hashed with the backbone fingerprint, names its record).

    ``method_config``/``None``, ``method_options`` (fields of the method config to replace, e.g. ``{"depth": 3}``)
    and the ``epochs``/``batch_size``/``lr`` overrides refine the recipe of ``(method, recipe, setting, shots,
    dataset)``; ``subsample`` defaults to ``base`` in base-to-new and ``all``
    otherwise; ``views`` (cached augmented views) defaults to the number of epochs (a fresh view every epoch, the
    faithful setting). ``soft_labels`` (a :class:`atlas_fast.softlabels.SoftLabelConfig`) is required exactly when
    the schedule uses soft labels. ``workers`` are the DataLoader decoding processes of the methods that train on
    pixels (None: up to 8 on a GPU, none on the CPU). ``data_root``, ``cache_root``, ``results_dir``, ``progress``
    and ``workers`` do not change the numbers and are not part of the record's name (the data are, by their
    fingerprint, see :mod:`atlas_fast.data.identity`). ``content_hash`` identifies images by a hash of their bytes
    rather than size and mtime (slower; see the README's "What atlas_fast guarantees").
    """

    dataset: str
    data_root: str | Path
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    method: str = "coop"
    method_config: MethodConfig | None = None
    method_options: dict[str, Any] | None = None
    recipe: Literal["paper", "original"] = "paper"
    setting: Setting = "base2new"
    shots: int = 16
    seed: int = 1
    subsample: Literal["all", "base", "new"] | None = None
    soft_labels: SoftLabelConfig | None = None
    schedule: LabelSchedule = field(default_factory=OneHot)
    views: int | None = None
    aug_seed: int = 0
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    eval_every_epoch: bool = False
    device: str = "auto"
    precision: Literal["auto", "fp32", "amp"] = "auto"
    cache_root: str | Path = "cache"
    results_dir: str | Path = "results"
    progress: bool = True
    content_hash: bool = False
    workers: int | None = None

    def __post_init__(self) -> None:
        if self.setting not in SETTINGS:
            raise ValueError(f"setting must be one of {SETTINGS}, got {self.setting!r}.")
        if self.recipe not in RECIPE_FAMILIES:
            raise ValueError(f"recipe must be one of {RECIPE_FAMILIES}, got {self.recipe!r}.")
        if self.subsample not in (None, "all", "base", "new"):
            raise ValueError(f"subsample must be 'all', 'base', 'new' or None, got {self.subsample!r}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}.")
        if self.shots < 1:
            raise ValueError(f"shots must be >= 1 (prompt tuning is few-shot), got {self.shots}.")
        for name in ("seed", "aug_seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)} (Python's random draws the same "
                                 f"few-shot subset for -s as for s).")
        if self.views is not None and self.views < 1:
            raise ValueError(f"views must be >= 1 augmented views per training image, got {self.views}.")
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} override must be >= 1, got {value}.")
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"workers must be >= 0 DataLoader processes (or None for automatic), got {self.workers}.")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr override must be > 0, got {self.lr}.")
        if not isinstance(self.schedule, LabelSchedule):
            raise TypeError(f"schedule must be a LabelSchedule (see atlas_fast.schedules), got {self.schedule!r}.")
        if self.schedule.needs_soft_labels and self.soft_labels is None:
            raise ValueError(f"The {self.schedule.name!r} schedule trains on soft labels: set soft_labels "
                             f"(e.g. atlas_fast.softlabels.atlas_preset({self.setting!r})).")
        if not self.schedule.needs_soft_labels and self.soft_labels is not None:
            raise ValueError(f"soft_labels is set but the {self.schedule.name!r} schedule never uses them; "
                             f"use schedule=Atlas(K) or Joint(), or drop soft_labels.")

    @property
    def train_subsample(self) -> str:
        return self.subsample or ("base" if self.setting == "base2new" else "all")


def run(config: TrainConfig) -> dict[str, Any]:
    """Train and evaluate one run, or return the finished record of an identical earlier run.

    Returns the record (see :mod:`atlas_fast.results`); ``record["metrics"]`` holds base/new/H (base-to-new) or
    all (few-shot, cross-dataset), each in percent, and ``zero_shot`` references with the dataset's CLIP template.
    """
    from atlas_fast.methods import build_method

    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 4)
        clock = now

    plan = plan_run(config)
    existing = plan.finished()  # lists and fingerprints the data first: changed data are never skipped
    if existing is not None:
        return {**existing, "skipped": True, "path": str(plan.record_path)}
    plan.store.check_writable(plan.dataset)  # fail now, not after training
    lap("plan")

    inputs = prepare_inputs(plan)
    lap("inputs")

    torch.manual_seed(config.seed)  # the method's random initialisation
    method = build_method(config.method, plan.backbone, inputs.train_split.classnames, plan.method_config)
    method = method.to(plan.device)

    def per_epoch_eval(epoch: int) -> dict[str, Any]:
        if not config.eval_every_epoch:
            return {}
        accuracies = {name: values[0] for name, values in evaluate_method(method, inputs.eval_sets, plan.amp).items()}
        return {"accuracy": summarize(accuracies)}

    epochs = train_epochs(method, inputs.train_inputs, inputs.labels, inputs.soft_rows, config.schedule, plan.recipe,
                          config.seed, plan.device, plan.amp, config.progress, per_epoch_eval)
    lap("train")

    metrics = evaluate_run(method, inputs.eval_sets, plan.backbone, inputs.full.name, plan.amp, config.progress)
    lap("evaluate")

    data = {"dataset": inputs.full.name, "fingerprint": plan.data.fingerprint, "content_hash": config.content_hash,
            "num_train": len(inputs.labels), "num_classes": len(inputs.train_split.classnames),
            "classnames": list(inputs.train_split.classnames), "shots_used": plan.data.shots_used,
            "num_test": {s.name: len(s.labels) for s in inputs.eval_sets}}
    record = build_record(plan.record_key, plan.described, plan.backbone,
                          {"data_root": str(config.data_root), "cache_root": str(config.cache_root)}, data, metrics,
                          epochs, {**timings, "seconds_per_epoch": timings["train"] / plan.recipe.epochs},
                          config_key=plan.key)
    path = plan.store.save(plan.dataset, plan.stem, record, method.state_for_checkpoint())
    return {**record, "status": "finished", "skipped": False, "path": str(path)}
