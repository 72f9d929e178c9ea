"""What a method is built and trained with: its config (:class:`MethodConfig`, one frozen dataclass per method, and
the checks its fields share) and the optimisation recipe a recipe family gives it (:class:`OptimRecipe`), with the
refusals every recipe function shares (:class:`MissingRecipe`, :func:`check_family`, :func:`check_setting_name`).
Nothing here imports torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Literal

from atlas_fast.vocabulary import OPTIMIZERS, RECIPE_FAMILIES as _RECIPE_FAMILIES, SETTINGS, Optimizer


@dataclass(frozen=True)
class MethodConfig:
    """What every method's config is: its hyper-parameters (how many runs a module holds is not one of them: a
    method is built for R runs, :meth:`~atlas_fast.methods.base.PromptMethod.build`)."""

    def __post_init__(self) -> None:
        check_finite_fields(self)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# The largest weight or scale a method option may take: loss weights and lr scales beyond it are no recipe (the
# references use at most 25) and overflow float32 losses, so a typo is refused here rather than as a divergence.
MAX_OPTION_SCALE = 1e4


def check_finite_fields(config: Any) -> None:
    """Refuse a config (a dataclass) holding a float field that is NaN or infinite, naming the field: such a value
    passes every ``>= 0`` check and only fails after the features are encoded."""
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{type(config).__name__}.{f.name} must be a finite number, got {value}")


def check_scale(config: Any, name: str, low: float = 0.0, high: float = MAX_OPTION_SCALE,
                low_open: bool = False) -> None:
    """Refuse ``config.<name>`` outside ``[low, high]`` (``(low, high]`` with ``low_open``), naming the field."""
    value = getattr(config, name)
    inside = (low < value if low_open else low <= value) and value <= high
    if not inside:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{type(config).__name__}.{name} must be in {interval}, got {value}")


@dataclass(frozen=True)
class OptimRecipe:
    """A method's optimisation recipe (``docs/protocol.md``, section Optimisation). Default: Dassl's SGD + per-epoch
    cosine after a constant warmup.

    The warmup epochs count inside ``epochs``; lr of 0-based epoch e is ``warmup_lr`` for e < warmup_epochs, then
    ``0.5 * lr * (1 + cos(pi * (e - warmup_epochs) / epochs))``.

    ``optimizer``: ``sgd``, ``adam`` (Dassl's: L2 ``weight_decay`` added to the gradient, TCP) or ``adamw``
    (decoupled, CLIP-LoRA). ``iterations`` (CLIP-LoRA): step t runs at ``min_lr + 0.5 * (lr - min_lr) * (1 +
    cos(pi * t / iterations))``, no warmup, training stops after ``iterations`` steps; ``epochs`` is then resolved at
    planning: ``ceil(iterations / steps per epoch)``.
    """

    epochs: int
    batch_size: int
    lr: float
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup_epochs: int = 1
    warmup_lr: float = 1e-5
    scheduler: Literal["cosine"] = "cosine"
    optimizer: Optimizer = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    iterations: int | None = None
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"OptimRecipe.epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"OptimRecipe.batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"OptimRecipe.lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_epochs < self.epochs + 1:
            raise ValueError(f"OptimRecipe.warmup_epochs must be in [0, epochs={self.epochs}], got {self.warmup_epochs}")
        if self.scheduler != "cosine":
            raise ValueError(f"OptimRecipe.scheduler must be 'cosine' (the only schedule the recipes use), "
                             f"got {self.scheduler!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"OptimRecipe.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"OptimRecipe.betas must be two numbers in [0, 1), got {self.betas}")
        if self.iterations is not None:
            if self.iterations < 1:
                raise ValueError(f"OptimRecipe.iterations must be >= 1 optimiser steps, got {self.iterations}")
            if self.warmup_epochs:
                raise ValueError("OptimRecipe: a schedule over iterations has no warmup epochs (warmup_epochs=0)")
        if not 0.0 <= self.min_lr <= self.lr:
            raise ValueError(f"OptimRecipe.min_lr must be in [0, lr={self.lr}], got {self.min_lr}")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a record stores them; those added after the first records (``ADDED_FIELDS``) only where they
        differ from their defaults, so every earlier run keeps its record name."""
        described = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, default in ADDED_FIELDS.items():
            if described[name] == default:
                del described[name]
        if "betas" in described:
            described["betas"] = list(described["betas"])
        return described

    def lr_at_step(self, step: int) -> float:
        """The lr of 0-based optimiser step ``step`` of a schedule over :attr:`iterations`."""
        if self.iterations is None:
            raise ValueError("lr_at_step needs a recipe with iterations (its schedule counts epochs otherwise)")
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * step / self.iterations))

    def for_training_images(self, images: int, epochs: int | None = None) -> "OptimRecipe":
        """A schedule over iterations with its epochs resolved for ``images`` training images (the last partial
        batch is a step); ``epochs`` (an override) instead trains that many whole epochs, the iterations with them.
        Recipes without iterations are returned unchanged."""
        if self.iterations is None:
            return self
        steps = -(-images // self.batch_size)
        if epochs is not None:
            return replace(self, epochs=epochs, iterations=epochs * steps)
        return replace(self, epochs=-(-self.iterations // steps))


# OptimRecipe's fields added after records were first written, with their defaults (OptimRecipe.to_dict).
ADDED_FIELDS: dict[str, Any] = {"optimizer": "sgd", "betas": (0.9, 0.999), "iterations": None, "min_lr": 0.0}


RecipeFunction = Callable[[str, str, int, str], "tuple[MethodConfig, OptimRecipe]"]


class MissingRecipe(ValueError):
    """No reference repository defines a recipe for this (method, setting). ``method_config`` is the method's
    configuration to train with when the caller gives epochs, batch size and lr explicitly."""

    def __init__(self, method: str, setting: str, method_config: MethodConfig) -> None:
        super().__init__(
            f"{method} has no {setting!r} recipe in its reference repositories (docs/method-zoo.md, section "
            f"Recipes). Give the schedule yourself, all three of epochs, batch size and lr: "
            f"TrainConfig(epochs=..., batch_size=..., lr=...) or "
            f"`atlas-fast train --epochs E --batch-size B --lr LR` (the method's base-to-new recipe is a starting "
            f"point).")
        self.method_config = method_config


def check_family(method: str, family: str) -> None:
    """Reject a recipe family that is not one of :data:`~atlas_fast.vocabulary.RECIPE_FAMILIES`."""
    if family not in _RECIPE_FAMILIES:
        raise ValueError(f"{method} recipe family must be {' or '.join(map(repr, _RECIPE_FAMILIES))}, got {family!r}")


def check_setting_name(method: str, setting: str) -> None:
    """Reject a setting that is not one of :data:`~atlas_fast.vocabulary.SETTINGS`."""
    if setting not in SETTINGS:
        raise ValueError(f"{method} recipe setting must be one of {', '.join(map(repr, SETTINGS))}, got {setting!r}")
