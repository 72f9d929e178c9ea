"""What defines a training run: :class:`TrainConfig`, checked when it is made, before any file is read.

A config names the data, the backbone, the method and its label schedule; everything it leaves open (epochs, batch
size, lr, views, the class subset) is resolved from the method's recipe when the run is planned
(:mod:`atlas_fast.engine.spec`). Paths, progress bars and decoding workers do not change the numbers and are not
part of the run's identity.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from atlas_fast.clip.backbones import BackboneConfig
from atlas_fast.data.fewshot import MAX_SEED
from atlas_fast.errors import short_repr
from atlas_fast.methods.config import MethodConfig
from atlas_fast.atlas.schedules import LabelSchedule, OneHot, check_soft_labels
from atlas_fast.vocabulary import (CLASS_SETS, PRECISIONS as _PRECISIONS, RECIPE_FAMILIES, SETTINGS as _SETTINGS,
                                   FEWSHOT_ORDERS, ClassSet, FewShotOrder, Precision, RecipeFamily, Setting,
                                   environment_graph_steps)

if TYPE_CHECKING:
    from atlas_fast.atlas.softlabels import SoftLabelConfig

# Upper bounds that keep a typo from allocating the machine away: more than this many epochs or cached views per
# image is no protocol of the papers (they train at most 200 epochs with one fresh view each).
MAX_EPOCHS = 10_000
MAX_VIEWS = 10_000
# Seeds are 32-bit (MAX_SEED), as numpy's and Dassl's are: a larger one would fail inside torch after the cache and
# subset are written. No recipe's lr exceeds 0.035, but a huge one is how a user (and the tests) sees a run diverge
# with a clear message; above MAX_LR, the lr times a method's lr scale (at most 1e4) no longer fits a float32 and
# torch's optimiser fails instead. Batch sizes and decoding workers are capped far above any machine's memory.
MAX_LR = 1e30
MAX_SHOTS = 1_000_000  # images per class: more than any dataset holds (a larger K takes them all anyway)
MAX_BATCH_SIZE = 1_000_000
MAX_WORKERS = 1024


def check_int(owner: str, name: str, value: Any, low: int, high: int | None = None) -> None:
    """Refuse ``value`` unless it is a whole number in ``[low, high]`` (``high`` None: no upper bound), naming
    ``owner.name``."""
    ok = (isinstance(value, numbers.Integral) and not isinstance(value, bool) and low <= value
          and (high is None or value <= high))
    if not ok:
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{owner}{name} must be a whole number {bound}, got {short_repr(value)}.")


@dataclass
class TrainConfig:
    """Everything that defines one training run (and, hashed with the backbone fingerprint, names its record).

    ``method_config``/``None``, ``method_options`` (fields of the method config to replace, e.g. ``{"depth": 3}``)
    and the ``epochs``/``batch_size``/``lr`` overrides refine the optimisation recipe that the method's
    ``recipe_family`` gives ``(setting, shots, dataset)``; ``subsample`` defaults to ``base`` in base-to-new and
    ``all`` otherwise; ``views`` (cached augmented views) defaults to the number of epochs (a fresh view every
    epoch, the faithful setting). ``soft_labels`` (a :class:`atlas_fast.atlas.softlabels.SoftLabelConfig`) is
    required exactly when the schedule uses soft labels.
    ``evaluate`` lists the class sets evaluated after training (and every epoch with ``eval_every_epoch``), within
    base/new/all and always including the training subset; None is every set the setting has. ``graph_steps``
    replays each full-size training step from a CUDA graph (:mod:`atlas_fast.engine.graphs`): None (auto) wherever a
    graph can replay the step, True to require it (refused elsewhere), False for eager steps; its default is the
    ``ATLAS_FAST_GRAPH_STEPS`` environment variable (auto/on/off), read when the config is made. ``workers`` are the
    decoding processes of the pixel methods (None: up to 8 on a GPU, none on the CPU). ``snapshot_epochs`` also saves
    the learned tensors after each of these numbers of finished epochs (0 = the initialisation)
    (:func:`atlas_fast.engine.record.split_snapshots`); it names the run only when set. ``save_predictions`` writes
    each run's per-image logits and labels beside its record. ``data_root``, ``cache_root``, ``results_dir``,
    ``progress``, ``save_predictions``, ``workers`` and ``graph_steps`` do not change the numbers and are not part of
    the record's name (the data are, by their fingerprint). ``content_hash`` identifies images by a hash of their
    bytes rather than size and mtime (slower; see docs/guarantees.md).
    """

    dataset: str
    data_root: str | Path
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    method: str = "coop"
    method_config: MethodConfig | None = None
    method_options: dict[str, Any] | None = None
    recipe_family: RecipeFamily = "paper"
    setting: Setting = "base2new"
    shots: int = 16
    seed: int = 1
    subsample: ClassSet | None = None
    soft_labels: SoftLabelConfig | None = None
    schedule: LabelSchedule = field(default_factory=OneHot)
    views: int | None = None
    aug_seed: int = 0
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    eval_every_epoch: bool = False
    evaluate: tuple[str, ...] | None = None
    graph_steps: bool | None = field(default_factory=environment_graph_steps)
    snapshot_epochs: tuple[int, ...] = ()
    device: str = "auto"
    precision: Precision = "auto"
    cache_root: str | Path = "cache"
    results_dir: str | Path = "results"
    progress: bool = True
    content_hash: bool = False
    workers: int | None = None
    fewshot_order: FewShotOrder = "coop"
    save_predictions: bool = False

    def __post_init__(self) -> None:
        if self.setting not in _SETTINGS:
            raise ValueError(f"setting must be one of {_SETTINGS}, got {self.setting!r}.")
        if self.recipe_family not in RECIPE_FAMILIES:
            raise ValueError(f"recipe_family must be one of {RECIPE_FAMILIES}, got {self.recipe_family!r}.")
        if self.subsample is not None and self.subsample not in CLASS_SETS:
            raise ValueError(f"subsample must be one of {CLASS_SETS} or None, got {self.subsample!r}.")
        if self.evaluate is not None:
            self.evaluate = self._checked_evaluate(self.evaluate)
        if any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in self.snapshot_epochs):
            raise ValueError(f"snapshot_epochs lists numbers of finished epochs (0 = the initialisation), each an "
                             f"integer >= 0; got {self.snapshot_epochs!r}.")
        self.snapshot_epochs = tuple(sorted(set(self.snapshot_epochs)))
        if self.fewshot_order not in FEWSHOT_ORDERS:
            raise ValueError(f"fewshot_order must be one of {FEWSHOT_ORDERS}, got {self.fewshot_order!r}.")
        if self.precision not in _PRECISIONS:
            raise ValueError(f"precision must be one of {_PRECISIONS}, got {self.precision!r}.")
        if isinstance(self.shots, numbers.Integral) and not isinstance(self.shots, bool) and self.shots < 1:
            raise ValueError(f"shots must be >= 1 (prompt tuning is few-shot), got {self.shots}.")
        check_int("", "shots", self.shots, 1, MAX_SHOTS)
        for name in ("seed", "aug_seed"):
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value} (Python's random draws the same few-shot subset "
                                 f"for -s as for s).")
            check_int("", name, value, 0, MAX_SEED)
        if self.views is not None and not 1 <= self.views <= MAX_VIEWS:
            raise ValueError(f"views must be in [1, {MAX_VIEWS}] augmented views per training image, got "
                             f"{short_repr(self.views)}.")
        if self.epochs is not None and not 1 <= self.epochs <= MAX_EPOCHS:
            raise ValueError(f"epochs override must be in [1, {MAX_EPOCHS}], got {short_repr(self.epochs)}.")
        if self.batch_size is not None:
            check_int("", "batch_size override", self.batch_size, 1, MAX_BATCH_SIZE)
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"workers must be >= 0 DataLoader processes (or None for automatic), got {self.workers}.")
        if self.workers is not None:
            check_int("", "workers", self.workers, 0, MAX_WORKERS)
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr)
                                        and 0 < self.lr <= MAX_LR):
            raise ValueError(f"lr override must be a finite number > 0 (at most {MAX_LR:g}), got "
                             f"{short_repr(self.lr)}.")
        if not isinstance(self.schedule, LabelSchedule):
            raise TypeError(f"schedule must be a LabelSchedule (see atlas_fast.atlas.schedules), got {self.schedule!r}.")
        check_soft_labels(self.schedule, self.soft_labels.kind if self.soft_labels is not None else None)

    @property
    def train_subsample(self) -> str:
        return self.subsample or ("base" if self.setting == "base2new" else "all")

    def _checked_evaluate(self, evaluate: Any) -> tuple[str, ...]:
        """``evaluate`` as a tuple in :data:`~atlas_fast.vocabulary.CLASS_SETS` order (so ("new", "base") names the
        same run as ("base", "new")); unknown sets, no set, or a list without the training subset are refused."""
        values = (evaluate,) if isinstance(evaluate, str) else tuple(evaluate)
        unknown = [v for v in values if v not in CLASS_SETS]
        if unknown or not values:
            raise ValueError(f"evaluate lists the class sets to evaluate, within {CLASS_SETS}; got "
                             f"{evaluate!r}.")
        if self.train_subsample not in values:
            raise ValueError(f"evaluate={evaluate!r} leaves out {self.train_subsample!r}, the class set this run "
                             f"trains on, which is always evaluated; add it (valid sets: {CLASS_SETS}).")
        return tuple(v for v in CLASS_SETS if v in values)


def resolve_device(device: str, elsewhere: bool = False) -> torch.device:
    """``auto`` = the GPU when there is one, else the CPU. A CUDA device this machine lacks is refused, unless the
    work runs ``elsewhere`` (a sweep's GPU workers planned on a login node)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a torch device (use auto, cpu, cuda or cuda:N).") from exc
    if resolved.type == "cuda" and not elsewhere:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if resolved.index is not None and resolved.index >= count or count == 0:
            raise ValueError(f"device {device!r}: torch sees {count} CUDA device(s) on this machine; use --device "
                             f"cpu (or auto).")
    elif resolved.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {device!r} is not supported here (use auto, cpu, cuda or cuda:N).")
    return resolved


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` = fp16 autocast (``amp``) on a GPU, fp32 on the CPU."""
    if precision == "auto":
        return "amp" if device.type == "cuda" else "fp32"
    return precision
