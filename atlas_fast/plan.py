"""Plan a run: resolve the device, backbone, recipe and the run's description, hash and record name.

Planning itself reads no dataset and touches no cache. The record's name also covers the data, so
``RunPlan.finished`` (and ``stem``, ``record_key``, ``record_path``) first list the dataset, draw the few-shot
subset and fingerprint the run's images (:func:`atlas_fast.inputs.load_run_data`, once per plan): a finished run is
skipped only when its data are unchanged, and data that are gone (a wrong ``--data-root``) are an error, never old
numbers. No image is decoded and no feature is read for that.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from atlas_fast.backbones import Backbone, shared_backbone
from atlas_fast.methods.base import MethodConfig, MissingRecipe, OptimRecipe
from atlas_fast.results import ResultStore, data_record_key, record_key

if TYPE_CHECKING:
    from atlas_fast.inputs import RunData
    from atlas_fast.train import TrainConfig


def resolve_device(device: str) -> torch.device:
    """``auto`` = the GPU when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` = fp16 autocast (``amp``) on a GPU, fp32 on the CPU."""
    if precision == "auto":
        return "amp" if device.type == "cuda" else "fp32"
    return precision


def recipe_functions() -> dict[str, Callable[..., tuple[MethodConfig, OptimRecipe]]]:
    """Per method: ``(family, setting, shots, dataset) -> (method config, OptimRecipe)`` (``methods.md`` §10)."""
    from atlas_fast.methods import RECIPES

    return dict(RECIPES)


def resolve_recipe(config: TrainConfig, dataset: str) -> tuple[MethodConfig, OptimRecipe]:
    """The method config and optimisation recipe of a run on ``dataset`` (registry name), with the overrides."""
    functions = recipe_functions()
    if config.method not in functions:
        raise ValueError(f"No training recipe for method {config.method!r}; known: {sorted(functions)}.")
    overrides = {k: getattr(config, k) for k in ("epochs", "batch_size", "lr") if getattr(config, k) is not None}
    try:
        method_config, recipe = functions[config.method](config.recipe, config.setting, config.shots, dataset)
    except MissingRecipe as missing:  # no reference recipe: the caller's epochs, batch size and lr, all three
        if len(overrides) < 3:
            raise
        method_config, recipe = missing.method_config, OptimRecipe(**overrides)
    if config.method_config is not None:
        method_config = config.method_config
    if config.method_options:
        method_config = with_options(method_config, config.method_options)
    return method_config, dataclasses.replace(recipe, **overrides)


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
                except ValueError as exc:
                    raise ValueError(f"option {name} takes a {type(current).__name__}, got {value!r}.") from exc
        changes[name] = value
    return dataclasses.replace(method_config, **changes)


def _as_dict(value: Any) -> Any:
    if value is None:
        return None
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return dataclasses.asdict(value)


def describe_run(config: TrainConfig, dataset: str, method_config: MethodConfig, recipe: OptimRecipe,
                 device: torch.device) -> dict[str, Any]:
    """The JSON form of a run's configuration, with every default resolved (this is what the record hash covers);
    ``dataset`` is the registry name, so ``oxford_pets`` and ``OxfordPets`` name the same run."""
    return {
        "dataset": dataset, "backbone": config.backbone.to_dict(), "method": config.method,
        "method_config": _as_dict(method_config), "recipe_family": config.recipe, "recipe": recipe.to_dict(),
        "setting": config.setting, "shots": config.shots, "seed": config.seed, "subsample": config.train_subsample,
        "soft_labels": _as_dict(config.soft_labels), "schedule": config.schedule.describe(),
        "views": config.views or recipe.epochs, "aug_seed": config.aug_seed,
        "eval_every_epoch": config.eval_every_epoch, "device": device.type,
        "precision": resolve_precision(config.precision, device),
    }


def record_stem(config: TrainConfig, key: str) -> str:
    """The record's file name stem: readable fields, then the first 12 hex digits of the key."""
    soft = config.soft_labels.kind if config.soft_labels is not None else ""
    schedule = config.schedule.name + (f"{config.schedule.period}" if hasattr(config.schedule, "period") else "")
    return (f"{config.method}-{schedule}{('-' + soft) if soft else ''}-{config.setting}-{config.shots}shot-"
            f"seed{config.seed}-{key[:12]}")


@dataclass
class RunPlan:
    """A run with every default resolved: what to build, where its record goes, and whether it already exists."""

    config: TrainConfig
    device: torch.device
    amp: bool
    backbone: Backbone
    dataset: str  # registry name
    method_config: MethodConfig
    recipe: OptimRecipe
    described: dict[str, Any]
    key: str  # configuration + backbone (data-free)
    store: ResultStore
    _data: RunData | None = field(default=None, repr=False)

    @property
    def views(self) -> int:
        return self.config.views or self.recipe.epochs

    @property
    def data(self) -> RunData:
        """The run's data (lists, few-shot subset, class subsets, fingerprint), loaded on first use."""
        if self._data is None:
            from atlas_fast.inputs import load_run_data

            self._data = load_run_data(self)
        return self._data

    @property
    def record_key(self) -> str:
        """The record's full key: configuration, backbone and the data fingerprint of the run's inputs."""
        return data_record_key(self.key, self.data.fingerprint)

    @property
    def stem(self) -> str:
        return record_stem(self.config, self.record_key)

    @property
    def record_path(self):
        return self.store.record_path(self.dataset, self.stem)

    def finished(self) -> dict[str, Any] | None:
        """The finished record of an identical earlier run on the same data, or None (reads the data's listing)."""
        return self.store.find(self.dataset, self.stem, key=self.record_key)


def plan_run(config: TrainConfig) -> RunPlan:
    """Resolve a :class:`~atlas_fast.train.TrainConfig` into a :class:`RunPlan` (loads the backbone once per process)."""
    from atlas_fast.data.datasets import get_spec
    from atlas_fast.methods import METHODS

    if config.method in METHODS and not METHODS[config.method].learns and config.schedule.name != "onehot":
        raise ValueError(f"{config.method} learns nothing, so the {config.schedule.name!r} label schedule has "
                         f"nothing to supervise; run it without soft labels (schedule OneHot, --atlas none).")
    device = resolve_device(config.device)
    amp = resolve_precision(config.precision, device) == "amp"
    if amp and device.type != "cuda":
        raise ValueError("precision='amp' needs a CUDA device; use 'fp32' (or 'auto') on the CPU.")
    backbone = shared_backbone(config.backbone, device)
    dataset = get_spec(config.dataset).name
    method_config, recipe = resolve_recipe(config, dataset)
    described = describe_run(config, dataset, method_config, recipe, device)
    key = record_key(described, backbone.fingerprint)
    return RunPlan(config, device, amp, backbone, dataset, method_config, recipe, described, key,
                   ResultStore(config.results_dir))
