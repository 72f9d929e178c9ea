"""Feed a run: the feature cache built for what it lacks, the evaluation sets, the soft labels, and the training
inputs the loop iterates over, all from the run's spec (its data were listed and fingerprinted when it was planned).

Here alone is decided whether a method reads cached features (:class:`CachedViews`) or pixels (:class:`PixelViews`):
the loop sees training inputs only through :class:`TrainInputs`. Soft labels and the zero-shot references' frozen
features come from the feature cache either way: the frozen CLIP is never run again for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, NamedTuple

import torch
from atlas_fast.progress import progress_bar

from atlas_fast.clip.backbones import Backbone
from atlas_fast.cache import FeatureCache
from atlas_fast.engine.evaluate import EvalSet
from atlas_fast.engine.pixels import ImageViews, ViewFeed, decoding_pool, default_workers
from atlas_fast.engine.spec import RunSpec
from atlas_fast.engine.step import TrainInputs
from atlas_fast.methods.base import PromptMethod

# Preload every cached view of the training set when it fits this budget; otherwise read one view per epoch.
PRELOAD_BYTES = 1 << 30
# On a GPU the preloaded views stay on the device when they fit this budget (and half the free GPU memory): an
# epoch then indexes them there, with no copy from the host (16 shots x 1,000 ImageNet classes x 512 floats x 50
# views is 1.6 GB; the base-to-new sets of the 11 datasets with one view per epoch stay far below it).
DEVICE_RESIDENT_BYTES = 2 << 30
# The split an evaluation set is read from: the test split for a run's record, the validation split for a search.
EvaluationSplit = Literal["test", "val"]
# The name of the held-out set a run's temperature is fitted on (its training classes' few-shot validation split).
VALIDATION = "val"


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
    """The cached augmented views of the training images: epoch ``e`` gets view ``first_view + (e mod V)`` as (N, D)
    (``first_view`` 1; V + 1 for the second views a method's consistency term reads, CoPrompt's).

    Every view is read once when they fit :data:`PRELOAD_BYTES`, and kept on a CUDA device when they fit
    :data:`DEVICE_RESIDENT_BYTES` (``resident``), so an epoch's batches are gathered there."""

    def __init__(self, cache, backbone: Backbone, dataset: str, items, views: int, aug_seed: int,
                 device: torch.device | str = "cpu", first_view: int = 1) -> None:
        self.cache, self.backbone, self.dataset, self.items = cache, backbone, dataset, items
        self.views, self.aug_seed, self.device = views, aug_seed, torch.device(device)
        self.first_view = first_view
        size = len(items) * views * backbone.embed_dim * 4
        self.preloaded = (cache.load(backbone, dataset, items, views=list(range(first_view, first_view + views)),
                                     aug_seed=aug_seed)
                          if size <= PRELOAD_BYTES else None)
        self.resident = self.preloaded is not None and fits_on_device(size, self.device)
        self._last_read: tuple[int, torch.Tensor] | None = None  # (view, features) last read when not preloaded
        if self.resident:
            self.preloaded = self.preloaded.to(self.device)

    def device_rows(self) -> tuple[torch.Tensor, int] | None:
        """The preloaded views as (N x V, D) rows where they are held (the GPU when ``resident``, else the host),
        item n's view of epoch e being row ``n * V + e % V``: the training loop gathers each step's batch from them
        on the device (:class:`~atlas_fast.engine.step.GatheredBatches`). None when they were not preloaded."""
        if self.preloaded is None:
            return None
        return self.preloaded.reshape(-1, self.preloaded.shape[-1]), self.views

    def for_epoch(self, epoch: int) -> torch.Tensor:
        """The (N, D) features of epoch ``epoch``'s view. Not preloaded, the view is read from the cache once for
        the runs that share these views (a seed's label variants ask for it one after another at the epoch's
        start: PromptSRC's frozen features at ImageNet's few-shot size, 1.6 GB of views, were read once per run)."""
        view = epoch % self.views
        if self.preloaded is not None:
            return self.preloaded[:, view]
        if self._last_read is None or self._last_read[0] != view:
            self._last_read = (view, self.cache.load(self.backbone, self.dataset, self.items,
                                                     views=[self.first_view + view], aug_seed=self.aug_seed)[:, 0])
        return self._last_read[1]


class JoinedViews(EpochTensorInputs):
    """Features of the same views from several cached encoders, side by side: epoch ``e`` gives the parts' epoch
    tensors concatenated along the feature axis, (N, D_1 + D_2 + ...) (a run's own features, then its method's
    teacher's: :meth:`~atlas_fast.methods.base.PromptMethod.view_teacher`)."""

    def __init__(self, parts: list[CachedViews]) -> None:
        self.parts = parts
        self.device = parts[0].device
        rows = [part.device_rows() for part in parts]
        # every part preloaded where the run trains: their rows joined once, for batches gathered on the device
        self.rows = None if any(r is None or r[0].device != rows[0][0].device for r in rows) else (
            torch.cat([r[0] for r in rows], dim=-1), parts[0].views)

    def device_rows(self) -> tuple[torch.Tensor, int] | None:
        """The parts' :meth:`CachedViews.device_rows` side by side (None unless every part has them there)."""
        return self.rows

    def for_epoch(self, epoch: int) -> torch.Tensor:
        return torch.cat([part.for_epoch(epoch).to(self.device) for part in self.parts], dim=-1)


def fits_on_device(size: int, device: torch.device) -> bool:
    """Whether ``size`` bytes of training features should live on ``device``: a CUDA device with that much room
    within :data:`DEVICE_RESIDENT_BYTES` and half its free memory (the CPU keeps today's host copy)."""
    if device.type != "cuda" or size > DEVICE_RESIDENT_BYTES:
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return size <= free // 2


class PixelBatch(NamedTuple):
    """A batch for a method that also reads cached features of the same views: the frozen CLIP's (PromptSRC), a
    teacher's (KDPL), or both side by side."""

    pixels: torch.Tensor  # (B, 3, S, S)
    frozen_features: torch.Tensor  # (B, D): the cached features of exactly these views

    def to(self, device: torch.device | str) -> "PixelBatch":
        return PixelBatch(self.pixels.to(device), self.frozen_features.to(device))


class PixelViews:
    """The training images as pixels: epoch ``e`` decodes view ``1 + (e mod V)`` of each image, the view whose
    features :class:`CachedViews` would serve. With ``frozen`` (cached views) each batch also carries those features
    (:class:`PixelBatch`)."""

    def __init__(self, images: ImageViews, views: int, frozen: EpochTensorInputs | None = None,
                 progress: bool = False) -> None:
        self.images, self.views, self.frozen, self.progress = images, views, frozen, progress

    def batches(self, epoch: int, order: torch.Tensor, batch_size: int) -> Iterator[tuple[object, torch.Tensor]]:
        """The epoch's batches; registered with the group's feed now, so the runs that ask for their batches before
        the first step are decoded together (:class:`~atlas_fast.engine.pixels.ViewFeed`)."""
        pixel_batches = self.images.batches(1 + epoch % self.views, order, batch_size)
        frozen = self.frozen.for_epoch(epoch) if self.frozen is not None else None
        return self._served(pixel_batches, frozen, len(order), epoch)

    def _served(self, pixel_batches, frozen: torch.Tensor | None, items: int, epoch: int):
        with progress_bar(total=items, desc=f"epoch {epoch}", unit="img", enabled=self.progress,
                          leave=False) as bar:
            for pixels, index in pixel_batches:
                if frozen is None:
                    yield pixels, index
                else:
                    rows = frozen[index.to(frozen.device)]
                    yield PixelBatch(pixels, rows.to(pixels.device, non_blocking=True)), index
                bar.update(len(index))


@dataclass
class RunInputs:
    """Everything a run trains and evaluates on, prepared once."""

    eval_sets: list[EvalSet]
    labels: torch.Tensor  # (N,) training labels
    soft_rows: torch.Tensor | None  # (N, C) soft labels, or None
    train_inputs: TrainInputs
    # the few-shot validation split of the training classes, which the run's temperature is fitted on (None where
    # the dataset's validation split is its test split, or when the evaluation itself reads the validation split)
    held_out: EvalSet | None = None


def evaluation_set(name: str, split, backbone: Backbone, cache: FeatureCache, method: type[PromptMethod],
                   workers: int | None = None, device: torch.device | str = "cpu",
                   items: EvaluationSplit = "test") -> EvalSet:
    """The test split (or, with ``items="val"``, the validation split) of ``split`` as an evaluation problem: its
    cached features (view 0, already built) and, for a method that reads pixels, the same images as pixels."""
    data = getattr(split, items)
    features = cache.load(backbone, split.name, data, views=[0])[:, 0]
    images = ImageViews(data, backbone, workers=workers, device=device) if method.reads_pixels else None
    return EvalSet(name, split.classnames, features, torch.tensor([d.label for d in data]), images)


def prepare_inputs(spec: RunSpec, backbone: Backbone, read_once: dict | None = None,
                   evaluate_on: EvaluationSplit = "test") -> RunInputs:
    """Build what the feature cache lacks for the run's data (train views 0..V, test view 0; pixel methods: train
    view 0 and, for PromptSRC, 1..V), read the evaluation features and compute the soft labels once.

    ``read_once``: one dict for the runs of a group (same dataset, backbone and method), so the test images are
    checked against the cache and each evaluation set is read once per group rather than once per run, and runs on
    the same training images share their preloaded views. ``evaluate_on="val"`` (a hyper-parameter search) builds
    and reads the few-shot validation split in place of the test split, which is then never touched."""
    config, data, method = spec.config, spec.data, spec.method
    read_once = {} if read_once is None else read_once
    train_split = data.train_split
    cache = FeatureCache(config.cache_root, content_hash=config.content_hash)
    # pixel methods need cached train features only for soft labels (view 0) and their frozen views (PromptSRC:
    # the views they train on; CoPrompt: a second view of each image, views V + 1..2V)
    train_views = method.cached_train_views(spec.views)
    # checked once per group for the runs on the same training images (a seed's label variants): the check opens
    # the cache and looks up every (image, view), V + 1 views each for PromptSRC's frozen features
    train_key = ("train build", data.dataset, tuple(d.impath for d in train_split.train), train_views,
                 config.aug_seed)
    if train_key not in read_once:
        cache.build(backbone, data.dataset, train_split.train, num_views=train_views, aug_seed=config.aug_seed,
                    progress=config.progress)
        read_once[train_key] = True
    evaluated = getattr(data.fewshot, evaluate_on)
    test_key = (evaluate_on, data.dataset, tuple(d.impath for d in evaluated))
    if test_key not in read_once:
        cache.build(backbone, data.dataset, evaluated, num_views=0, progress=config.progress)
        read_once[test_key] = True
    eval_sets = []
    for name, split in data.splits.items():
        key = ("eval", evaluate_on, data.dataset, name, tuple(split.classnames),
               tuple(d.impath for d in getattr(split, evaluate_on)))
        if key not in read_once:
            read_once[key] = evaluation_set(name, split, backbone, cache, method, config.workers, spec.device,
                                         evaluate_on)
        eval_sets.append(read_once[key])
    held_out = None
    if evaluate_on == "test" and not data.fewshot.val_is_test and train_split.val:
        key = ("held out", data.dataset, tuple(train_split.classnames), tuple(d.impath for d in train_split.val))
        if key not in read_once:
            cache.build(backbone, data.dataset, train_split.val, num_views=0, progress=config.progress)
            read_once[key] = evaluation_set(VALIDATION, train_split, backbone, cache, method, config.workers,
                                         spec.device, "val")
        held_out = read_once[key]
    labels = torch.tensor([d.label for d in train_split.train])
    soft_rows = None
    if config.soft_labels is not None:
        from atlas_fast.atlas.softlabels import compute_soft_labels

        view0 = cache.load(backbone, data.dataset, train_split.train, views=[0], aug_seed=config.aug_seed)[:, 0]
        soft_rows = compute_soft_labels(config.soft_labels, backbone, train_split, view0,
                                        store_dir=Path(config.cache_root) / "softlabels")
    device = spec.device

    def train_views_of(encoder: Backbone, first_view: int = 1) -> CachedViews:
        # Runs of a group that train on the same images (the label variants of one seed) share one copy of the
        # preloaded views: up to 1 GB each (ImageNet base-to-new: 8,000 images x 50 views x 512 floats).
        key = ("train views", encoder.fingerprint, data.dataset, tuple(d.impath for d in train_split.train),
               spec.views, first_view, config.aug_seed, str(device))
        if key not in read_once:
            read_once[key] = CachedViews(cache, encoder, data.dataset, train_split.train, spec.views, config.aug_seed,
                                      device, first_view)
        return read_once[key]

    parts = []
    if not method.reads_pixels or method.reads_frozen_features:
        parts.append(train_views_of(backbone, 1 + spec.views if method.frozen_second_view else 1))
    teacher = method.view_teacher(spec.method_config, backbone)
    if teacher is not None:  # its features of the same views, from its own cache file (keyed by its fingerprint)
        cache.build(teacher, data.dataset, train_split.train, num_views=spec.views, aug_seed=config.aug_seed,
                    progress=config.progress)
        parts.append(train_views_of(teacher))
    cached = parts[0] if len(parts) == 1 else None
    if len(parts) > 1:  # shared as its parts are: the joined rows are a copy of theirs
        key = ("joined views", *(id(part) for part in parts))
        if key not in read_once:
            read_once[key] = JoinedViews(parts)
        cached = read_once[key]
    if not method.reads_pixels:
        train_inputs: TrainInputs = cached
    else:
        # the runs of a group read their views through one feed: each (image, view) of a step decoded once
        feed_key = ("pixel feed", str(spec.device), config.workers)
        if feed_key not in read_once:
            workers = default_workers(spec.device) if config.workers is None else config.workers
            read_once[feed_key] = ViewFeed(decoding_pool(workers, spec.device.type == "cuda"), spec.device)
        images = ImageViews(train_split.train, backbone, config.aug_seed, config.workers, spec.device,
                            read_once[feed_key])
        train_inputs = PixelViews(images, spec.views, cached, config.progress)
    return RunInputs(eval_sets, labels, soft_rows, train_inputs, held_out)
