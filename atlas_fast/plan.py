"""Plan a run: resolve the device, backbone, recipe and the run's description, hash and record name.

Planning reads no dataset and touches no cache: it is cheap, so a sweep can plan every run first and skip the
finished ones (``RunPlan.finished``) before any data is loaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from atlas_fast.backbones import Backbone, shared_backbone
from atlas_fast.methods.base import MethodConfig, OptimRecipe, PromptMethod
from atlas_fast.results import ResultStore, record_key

if TYPE_CHECKING:
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
    from atlas_fast.methods.coop import coop_recipe

    return {"coop": coop_recipe}


def resolve_recipe(config: TrainConfig, dataset: str) -> tuple[MethodConfig, OptimRecipe]:
    """The method config and optimisation recipe of a run on ``dataset`` (registry name), with the overrides."""
    functions = recipe_functions()
    if config.method not in functions:
        raise ValueError(f"No training recipe for method {config.method!r}; known: {sorted(functions)}.")
    method_config, recipe = functions[config.method](config.recipe, config.setting, config.shots, dataset)
    if config.method_config is not None:
        method_config = config.method_config
    overrides = {k: getattr(config, k) for k in ("epochs", "batch_size", "lr") if getattr(config, k) is not None}
    return method_config, dataclasses.replace(recipe, **overrides)


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


def require_cached_features(method_class: type[PromptMethod]) -> None:
    """Refuse methods whose image path is prompted: they cannot train from cached image features."""
    if method_class.consumes != "features":
        raise NotImplementedError(f"{method_class.__name__} consumes pixels (its image encoder is prompted), so it "
                                  f"cannot train from cached features; the full forward path is not implemented yet.")


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
    key: str
    stem: str
    store: ResultStore

    @property
    def views(self) -> int:
        return self.config.views or self.recipe.epochs

    @property
    def record_path(self):
        return self.store.record_path(self.dataset, self.stem)

    def finished(self) -> dict[str, Any] | None:
        """The finished record of an identical earlier run, or None."""
        return self.store.find(self.dataset, self.stem)


def plan_run(config: TrainConfig) -> RunPlan:
    """Resolve a :class:`~atlas_fast.train.TrainConfig` into a :class:`RunPlan` (loads the backbone once per process)."""
    from atlas_fast.data.datasets import get_spec
    from atlas_fast.methods import METHODS

    if config.method in METHODS:
        require_cached_features(METHODS[config.method])
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
                   record_stem(config, key), ResultStore(config.results_dir))
