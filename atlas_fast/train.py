"""Train one prompt method on cached features and record the result.

``run(TrainConfig(...))`` does, in order: load the backbone and the data (few-shot subset per seed, base/new split),
skip the run if its finished record exists, build the feature cache for what it needs (train views 0..V, test view 0),
compute the soft labels once, train, evaluate and write the record (see :mod:`atlas_fast.results`). A sweep is a plain
loop over configs::

    from atlas_fast.train import TrainConfig, run
    for seed in (1, 2, 3):
        record = run(TrainConfig("OxfordPets", "data", seed=seed, soft_labels=atlas_preset("base2new"),
                                 schedule=Atlas(2)))
        print(record["metrics"])

Optimisation follows Dassl (``methods.md`` §1.4): SGD (momentum 0.9, weight decay 5e-4 on the prompts) and a cosine
learning rate stepped once per epoch after a constant warmup epoch at 1e-5. Epoch ``e`` reads cached augmented view
``1 + (e mod V)``; batches are shuffled by a ``torch.Generator`` seeded with the run's seed and the last partial batch
is **kept** (a protocol decision; Dassl drops it). Runs are deterministic per seed on the CPU; on a GPU the forward
runs under fp16 autocast with a gradient scaler.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol

import torch
from tqdm.auto import tqdm

from atlas_fast.backbones import Backbone, BackboneConfig, shared_backbone
from atlas_fast.evaluate import EvalSet, evaluate_method, summarize, zero_shot_accuracy
from atlas_fast.methods.base import MethodConfig, OptimRecipe, PromptMethod
from atlas_fast.results import ResultStore, package_versions, record_key, utc_now
from atlas_fast.schedules import LabelSchedule, OneHot

if TYPE_CHECKING:
    from atlas_fast.softlabels import SoftLabelConfig

Setting = Literal["base2new", "few_shot", "cross_dataset"]
SETTINGS = ("base2new", "few_shot", "cross_dataset")
RECIPE_FAMILIES = ("paper", "original")
PRECISIONS = ("auto", "fp32", "amp")
# Preload every cached view of the training set when it fits this budget; otherwise read one view per epoch.
PRELOAD_BYTES = 1 << 30


@dataclass
class TrainConfig:
    """Everything that defines one training run (and, hashed with the backbone fingerprint, names its record).

    ``method_config``/``None`` and the ``epochs``/``batch_size``/``lr`` overrides refine the recipe of
    ``(method, recipe, setting, shots, dataset)``; ``subsample`` defaults to ``base`` in base-to-new and ``all``
    otherwise; ``views`` (cached augmented views) defaults to the number of epochs (a fresh view every epoch, the
    faithful setting). ``soft_labels`` (a :class:`atlas_fast.softlabels.SoftLabelConfig`) is required exactly when
    the schedule uses soft labels. ``data_root``, ``cache_root``, ``results_dir`` and ``progress`` do not change the
    numbers and are not part of the record's name.
    """

    dataset: str
    data_root: str | Path
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    method: str = "coop"
    method_config: MethodConfig | None = None
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
        if self.views is not None and self.views < 1:
            raise ValueError(f"views must be >= 1 augmented views per training image, got {self.views}.")
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} override must be >= 1, got {value}.")
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


def resolve_device(device: str) -> torch.device:
    """``auto`` = the GPU when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def lr_at_epoch(recipe: OptimRecipe, epoch: int) -> float:
    """Dassl's per-epoch lr (``methods.md`` §1.4): ``warmup_lr`` during the warmup epochs, then a cosine over
    ``recipe.epochs`` whose counter restarts after warmup: ``0.5 * lr * (1 + cos(pi * (e - W) / E))``."""
    if not 0 <= epoch < recipe.epochs:
        raise ValueError(f"epoch must be in [0, {recipe.epochs}), got {epoch}.")
    if epoch < recipe.warmup_epochs:
        return recipe.warmup_lr
    return 0.5 * recipe.lr * (1.0 + math.cos(math.pi * (epoch - recipe.warmup_epochs) / recipe.epochs))


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
        "precision": _precision(config.precision, device),
    }


def _precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "amp" if device.type == "cuda" else "fp32"
    return precision


def record_stem(config: TrainConfig, key: str) -> str:
    soft = config.soft_labels.kind if config.soft_labels is not None else ""
    schedule = config.schedule.name + (f"{config.schedule.period}" if hasattr(config.schedule, "period") else "")
    return (f"{config.method}-{schedule}{('-' + soft) if soft else ''}-{config.setting}-{config.shots}shot-"
            f"seed{config.seed}-{key[:12]}")


class EpochInputs(Protocol):
    """What the training loop reads: the inputs of every training item for one epoch, indexable by item."""

    def for_epoch(self, epoch: int) -> torch.Tensor: ...


class CachedViews:
    """The cached augmented views of the training images: epoch ``e`` gets view ``1 + (e mod V)`` as (N, D)."""

    def __init__(self, cache, backbone: Backbone, dataset: str, items, views: int, aug_seed: int) -> None:
        self.cache, self.backbone, self.dataset, self.items = cache, backbone, dataset, items
        self.views, self.aug_seed = views, aug_seed
        size = len(items) * views * backbone.embed_dim * 4
        self.preloaded = (cache.load(backbone, dataset, items, views=list(range(1, views + 1)), aug_seed=aug_seed)
                          if size <= PRELOAD_BYTES else None)

    def for_epoch(self, epoch: int) -> torch.Tensor:
        view = epoch % self.views
        if self.preloaded is not None:
            return self.preloaded[:, view]
        return self.cache.load(self.backbone, self.dataset, self.items, views=[1 + view], aug_seed=self.aug_seed)[:, 0]


def require_cached_features(method_class: type[PromptMethod]) -> None:
    """Refuse methods whose image path is prompted: they cannot train from cached image features."""
    if method_class.consumes != "features":
        raise NotImplementedError(f"{method_class.__name__} consumes pixels (its image encoder is prompted), so it "
                                  f"cannot train from cached features; the full forward path is not implemented yet.")


def train_epochs(method: PromptMethod, features: EpochInputs, labels: torch.Tensor,
                 soft_rows: torch.Tensor | None, schedule: LabelSchedule, recipe: OptimRecipe, seed: int,
                 device: torch.device, amp: bool, progress: bool = True,
                 on_epoch_end: Callable[[int], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The training loop. Returns one log row per epoch (mean loss, lr, soft-label flag, seconds, + callback's)."""
    require_cached_features(type(method))
    if method.num_runs != 1:
        raise NotImplementedError(f"train.run trains one run at a time (num_runs = 1), got {method.num_runs}.")
    parameters = method.trainable_parameters()
    optimizer = torch.optim.SGD(parameters, lr=recipe.lr, momentum=recipe.momentum,
                                weight_decay=recipe.weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    generator = torch.Generator().manual_seed(seed)
    schedule.reset(len(method.classnames))
    labels = labels.to(device)
    soft_rows = soft_rows.to(device) if soft_rows is not None else None
    method.train()
    log = []
    bar = tqdm(range(recipe.epochs), desc=f"train {method.name}", disable=not progress, leave=False)
    for epoch in bar:
        start = time.perf_counter()
        lr = lr_at_epoch(recipe, epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x_epoch = features.for_epoch(epoch).to(device)
        order = torch.randperm(len(labels), generator=generator).to(device)
        total = torch.zeros((), device=device)
        for batch in order.split(recipe.batch_size):  # the last partial batch is kept
            with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp):
                logits = method(x_epoch[batch])[0]
            loss = schedule.loss(epoch, logits.float(), labels[batch],
                                 soft_rows[batch] if soft_rows is not None else None)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            total += loss.detach() * len(batch)  # summed on the device: no host sync per step
        schedule.end_epoch(epoch)
        epoch_loss = total.item() / len(labels)
        if not math.isfinite(epoch_loss):
            raise FloatingPointError(f"Non-finite training loss in epoch {epoch} (lr {lr:.2e}); lower the lr "
                                     f"({recipe.lr}) or use precision='fp32'.")
        row = {"epoch": epoch, "lr": lr, "loss": epoch_loss, "soft": schedule.uses_soft_labels(epoch),
               "seconds": time.perf_counter() - start}
        if on_epoch_end is not None:
            row.update(on_epoch_end(epoch))
        bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{lr:.2e}")
        log.append(row)
    method.eval()
    return log


def run(config: TrainConfig) -> dict[str, Any]:
    """Train and evaluate one run, or return the finished record of an identical earlier run.

    Returns the record (see :mod:`atlas_fast.results`); ``record["metrics"]`` holds base/new/H (base-to-new) or
    all (few-shot, cross-dataset), each in percent, and ``zero_shot`` references with the dataset's CLIP template.
    """
    from atlas_fast.cache import FeatureCache
    from atlas_fast.data import fewshot_subset, load_dataset, subsample_classes
    from atlas_fast.data.datasets import get_spec
    from atlas_fast.data.templates import zeroshot_template
    from atlas_fast.methods import METHODS, build_method

    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 4)
        clock = now

    if config.method in METHODS:
        require_cached_features(METHODS[config.method])
    device = resolve_device(config.device)
    amp = _precision(config.precision, device) == "amp"
    if amp and device.type != "cuda":
        raise ValueError("precision='amp' needs a CUDA device; use 'fp32' (or 'auto') on the CPU.")
    backbone = shared_backbone(config.backbone, device)
    dataset = get_spec(config.dataset).name
    method_config, recipe = resolve_recipe(config, dataset)
    described = describe_run(config, dataset, method_config, recipe, device)
    key = record_key(described, backbone.fingerprint)
    store = ResultStore(config.results_dir)
    stem = record_stem(config, key)
    existing = store.find(dataset, stem)
    if existing is not None:
        return {**existing, "skipped": True, "path": str(store.record_path(dataset, stem))}
    lap("backbone")

    full = load_dataset(config.dataset, config.data_root)
    fewshot = fewshot_subset(full, config.shots, config.seed,
                             store_dir=Path(config.cache_root) / full.name / "split_fewshot")
    train_split = subsample_classes(fewshot, config.train_subsample)
    eval_splits = {config.train_subsample: train_split}
    if config.train_subsample == "base" and not getattr(method_config, "csc", False):
        # class-specific context (CoOp CSC) is tied to the training classes: no new/all evaluation (methods.md §11)
        eval_splits["new"] = subsample_classes(fewshot, "new")
        eval_splits["all"] = subsample_classes(fewshot, "all")
    if not train_split.train:
        raise ValueError(f"{full.name}: the {config.train_subsample!r} training list is empty.")
    lap("data")

    views = config.views or recipe.epochs
    cache = FeatureCache(config.cache_root)
    cache.build(backbone, full.name, train_split.train, num_views=views, aug_seed=config.aug_seed,
                progress=config.progress)
    cache.build(backbone, full.name, fewshot.test, num_views=0, progress=config.progress)
    lap("cache")

    eval_sets = []
    for name, split in eval_splits.items():
        features = cache.load(backbone, full.name, split.test, views=[0])[:, 0]
        eval_sets.append(EvalSet(name, split.classnames, features, torch.tensor([d.label for d in split.test])))
    labels = torch.tensor([d.label for d in train_split.train])
    soft_rows = None
    if config.soft_labels is not None:
        from atlas_fast.softlabels import compute_soft_labels

        view0 = cache.load(backbone, full.name, train_split.train, views=[0], aug_seed=config.aug_seed)[:, 0]
        soft_rows = compute_soft_labels(config.soft_labels, backbone, train_split, view0,
                                        store_dir=Path(config.cache_root) / "softlabels")
    lap("soft_labels")

    torch.manual_seed(config.seed)  # the method's random initialisation
    method = build_method(config.method, backbone, train_split.classnames, method_config).to(device)
    train_features = CachedViews(cache, backbone, full.name, train_split.train, views, config.aug_seed)

    def per_epoch_eval(epoch: int) -> dict[str, Any]:
        if not config.eval_every_epoch:
            return {}
        accuracies = {name: values[0] for name, values in evaluate_method(method, eval_sets, amp).items()}
        return {"accuracy": summarize(accuracies)}

    epochs = train_epochs(method, train_features, labels, soft_rows, config.schedule, recipe, config.seed,
                          device, amp, config.progress, per_epoch_eval)
    lap("train")

    accuracies = {name: values[0] for name, values in evaluate_method(method, eval_sets, amp).items()}
    template = zeroshot_template(full.name)
    zero_shot = {s.name: zero_shot_accuracy(backbone, s, template) for s in eval_sets}
    metrics = {**summarize(accuracies), "zero_shot": summarize(zero_shot)}
    lap("evaluate")

    record = {
        "key": key, "created": utc_now(), "config": described,
        "backbone": {"fingerprint": backbone.fingerprint, "description": backbone.describe(),
                     "architecture": backbone.architecture},
        "paths": {"data_root": str(config.data_root), "cache_root": str(config.cache_root)},
        "data": {"dataset": full.name, "num_train": len(labels), "num_classes": len(train_split.classnames),
                 "num_test": {s.name: len(s.labels) for s in eval_sets}},
        "metrics": metrics, "epochs": epochs,
        "timings": {**timings, "seconds_per_epoch": timings["train"] / recipe.epochs}, "versions": package_versions(),
    }
    path = store.save(dataset, stem, record, method.state_for_checkpoint())
    return {**record, "status": "finished", "skipped": False, "path": str(path)}
