"""Prepare a run's inputs: the data (few-shot subset, base/new split) and its fingerprint, the feature cache, the
evaluation sets, the soft labels and the training inputs the loop iterates over.

:func:`load_run_data` lists and checks the data without decoding an image (the skip check needs its fingerprint);
:func:`prepare_inputs` then builds and reads features. Every check that can fail runs before the first epoch.

The loop sees training inputs only through :class:`TrainInputs`: :class:`CachedViews` serves cached image features,
:class:`PixelViews` the pixels of the same seeded views for methods that prompt the image encoder (IVLP, MaPLe,
PromptSRC). Everything else (soft labels, schedules, evaluation sets' frozen features for the zero-shot references)
comes from the feature cache either way: the frozen CLIP is never run again for it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple, Protocol

import torch
from tqdm.auto import tqdm

from atlas_fast.backbones import Backbone
from atlas_fast.evaluate import EvalSet
from atlas_fast.pixels import ImageViews
from atlas_fast.plan import RunPlan

# Preload every cached view of the training set when it fits this budget; otherwise read one view per epoch.
PRELOAD_BYTES = 1 << 30


class TrainInputs(Protocol):
    """What the training loop reads: the inputs of each batch of one epoch, in a given item order."""

    def batches(self, epoch: int, order: torch.Tensor, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(inputs, index)`` per batch of ``order`` (a permutation of the training items; the last partial batch
        is kept); ``index`` (B,) selects the batch's labels and soft rows."""
        ...


class EpochTensorInputs:
    """Training inputs held as one tensor per epoch (N, ...): :meth:`batches` indexes it in the given order."""

    device = torch.device("cpu")

    def for_epoch(self, epoch: int) -> torch.Tensor:
        raise NotImplementedError

    def batches(self, epoch: int, order: torch.Tensor, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        inputs = self.for_epoch(epoch).to(self.device)
        for index in order.to(self.device).split(batch_size):
            yield inputs[index], index


class CachedViews(EpochTensorInputs):
    """The cached augmented views of the training images: epoch ``e`` gets view ``1 + (e mod V)`` as (N, D)."""

    def __init__(self, cache, backbone: Backbone, dataset: str, items, views: int, aug_seed: int,
                 device: torch.device | str = "cpu") -> None:
        self.cache, self.backbone, self.dataset, self.items = cache, backbone, dataset, items
        self.views, self.aug_seed, self.device = views, aug_seed, torch.device(device)
        size = len(items) * views * backbone.embed_dim * 4
        self.preloaded = (cache.load(backbone, dataset, items, views=list(range(1, views + 1)), aug_seed=aug_seed)
                          if size <= PRELOAD_BYTES else None)

    def for_epoch(self, epoch: int) -> torch.Tensor:
        view = epoch % self.views
        if self.preloaded is not None:
            return self.preloaded[:, view]
        return self.cache.load(self.backbone, self.dataset, self.items, views=[1 + view], aug_seed=self.aug_seed)[:, 0]


class PixelBatch(NamedTuple):
    """A batch for a method that also reads the frozen CLIP's features of the same views (PromptSRC)."""

    pixels: torch.Tensor  # (B, 3, S, S)
    frozen_features: torch.Tensor  # (B, D): the cached features of exactly these views

    def to(self, device: torch.device | str) -> "PixelBatch":
        return PixelBatch(self.pixels.to(device), self.frozen_features.to(device))


class PixelViews:
    """The training images as pixels: epoch ``e`` decodes view ``1 + (e mod V)`` of each image, the view whose
    features :class:`CachedViews` would serve. With ``frozen`` (cached views) each batch also carries those features
    (:class:`PixelBatch`)."""

    def __init__(self, images: ImageViews, views: int, frozen: CachedViews | None = None,
                 progress: bool = False) -> None:
        self.images, self.views, self.frozen, self.progress = images, views, frozen, progress

    def batches(self, epoch: int, order: torch.Tensor, batch_size: int) -> Iterator[tuple[object, torch.Tensor]]:
        frozen = self.frozen.for_epoch(epoch) if self.frozen is not None else None
        with tqdm(total=len(order), desc=f"epoch {epoch}", unit="img", disable=not self.progress,
                  leave=False) as bar:
            for pixels, index in self.images.batches(1 + epoch % self.views, order, batch_size):
                if frozen is None:
                    yield pixels, index
                else:
                    yield PixelBatch(pixels, frozen[index].to(pixels.device, non_blocking=True)), index
                bar.update(len(index))


@dataclass
class RunInputs:
    """Everything a run trains and evaluates on, prepared once."""

    full: object  # DatasetSplits of the whole dataset
    fewshot: object  # its few-shot subset for the run's seed
    train_split: object  # the training class subset (base in base-to-new)
    eval_sets: list[EvalSet]
    labels: torch.Tensor  # (N,) training labels
    soft_rows: torch.Tensor | None  # (N, C) soft labels, or None
    train_inputs: TrainInputs


def evaluation_splits(plan: RunPlan, fewshot) -> dict[str, object]:
    """The class subsets a run is evaluated on: its training subset and, in base-to-new, new and all (``methods.md``
    §11). Class-specific context (CoOp CSC) is tied to the training classes, so it gets no new/all evaluation."""
    from atlas_fast.data import subsample_classes

    subsample = plan.config.train_subsample
    splits = {subsample: subsample_classes(fewshot, subsample)}
    if subsample == "base" and not getattr(plan.method_config, "csc", False):
        splits["new"] = subsample_classes(fewshot, "new")
        splits["all"] = subsample_classes(fewshot, "all")
    return splits


@dataclass
class RunData:
    """The lists a run trains and evaluates on, and the fingerprint of its inputs (no image decoded yet)."""

    full: object  # DatasetSplits of the whole dataset
    fewshot: object  # its few-shot subset for the run's seed
    splits: dict[str, object]  # evaluation class subsets (base/new/all); the training one included
    train_split: object  # the training class subset (base in base-to-new)
    fingerprint: str  # listing of the full dataset + identity of every image the run reads
    shots_used: dict[str, int]  # fewest and most training images of any class


def load_run_data(plan: RunPlan) -> RunData:
    """List the dataset, draw the few-shot subset, split the classes and fingerprint the run's images; refuse data
    the run cannot use (no training images, an evaluation class set without test images)."""
    from atlas_fast.data import fewshot_subset, load_dataset
    from atlas_fast.data.fewshot import shots_used
    from atlas_fast.data.identity import subset_fingerprint

    config = plan.config
    full = load_dataset(config.dataset, config.data_root)
    fewshot = fewshot_subset(full, config.shots, config.seed,
                             store_dir=Path(config.cache_root) / full.name / "split_fewshot")
    splits = evaluation_splits(plan, fewshot)
    train_split = splits[config.train_subsample]
    if not train_split.train:
        raise ValueError(f"{full.name}: the {config.train_subsample!r} training list is empty.")
    for name, split in splits.items():
        if not split.test:
            raise ValueError(f"{full.name} ({full.dataset_dir}): no test images for the {name!r} classes "
                             f"({split.num_classes} classes); the run could not be evaluated. Add test images or "
                             f"use --setting few_shot.")
    fingerprint = subset_fingerprint(full, fewshot, config.content_hash)
    return RunData(full, fewshot, splits, train_split, fingerprint, shots_used(train_split))


def prepare_inputs(plan: RunPlan) -> RunInputs:
    """Build what the feature cache lacks for the run's data (train views 0..V, test view 0; pixel methods: train
    view 0 and, for PromptSRC, 1..V), read the evaluation features and compute the soft labels once."""
    from atlas_fast.cache import FeatureCache
    from atlas_fast.methods import METHODS

    config, backbone, data = plan.config, plan.backbone, plan.data
    full, fewshot, train_split = data.full, data.fewshot, data.train_split
    if data.shots_used["min"] < config.shots:
        used = data.shots_used
        print(f"note: {full.name}: some classes have fewer than {config.shots} training images; the run uses "
              f"{used['min']}..{used['max']} per class (recorded in the record's data.shots_used).", file=sys.stderr)

    method_class = METHODS[config.method]
    pixels = method_class.consumes == "pixels"
    frozen_views = getattr(method_class, "frozen_view_features", False)
    cache = FeatureCache(config.cache_root, content_hash=config.content_hash)
    # pixel methods need cached train features only for soft labels (view 0) and PromptSRC's frozen views
    cache.build(backbone, full.name, train_split.train, num_views=0 if pixels and not frozen_views else plan.views,
                aug_seed=config.aug_seed, progress=config.progress)
    cache.build(backbone, full.name, fewshot.test, num_views=0, progress=config.progress)

    eval_sets = []
    for name, split in data.splits.items():
        features = cache.load(backbone, full.name, split.test, views=[0])[:, 0]
        images = ImageViews(split.test, backbone, workers=config.workers, device=plan.device) if pixels else None
        eval_sets.append(EvalSet(name, split.classnames, features, torch.tensor([d.label for d in split.test]),
                                 images))
    labels = torch.tensor([d.label for d in train_split.train])
    soft_rows = None
    if config.soft_labels is not None:
        from atlas_fast.softlabels import compute_soft_labels

        view0 = cache.load(backbone, full.name, train_split.train, views=[0], aug_seed=config.aug_seed)[:, 0]
        soft_rows = compute_soft_labels(config.soft_labels, backbone, train_split, view0,
                                        store_dir=Path(config.cache_root) / "softlabels")
    if not pixels:
        train_inputs = CachedViews(cache, backbone, full.name, train_split.train, plan.views, config.aug_seed,
                                   plan.device)
    else:
        frozen = (CachedViews(cache, backbone, full.name, train_split.train, plan.views, config.aug_seed)
                  if frozen_views else None)
        images = ImageViews(train_split.train, backbone, config.aug_seed, config.workers, plan.device)
        train_inputs = PixelViews(images, plan.views, frozen, config.progress)
    return RunInputs(full, fewshot, train_split, eval_sets, labels, soft_rows, train_inputs)
