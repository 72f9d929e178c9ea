"""What a sweep will do, before it runs: the planned runs (:func:`atlas_fast.sweep.plan_sweep`, finished runs
dropped as the sweep drops them, grouped as :func:`atlas_fast.engine.group.group_runs` groups them) and the feature
cache's state become :class:`PlanFacts` (per group: method, classes, runs, batch, epochs, training images,
evaluation sets, soft labels; the (image, view) features the cache lacks, by encoder batch).
:func:`atlas_fast.pricing.estimate.price` multiplies them by the units."""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from atlas_fast.pricing.unit_keys import config_digest, cut_key, decode_key


@dataclass(frozen=True)
class EvalFacts:
    """One class set a run is evaluated on: its name, classes and test images."""

    name: str
    classes: int
    images: int


@dataclass(frozen=True)
class GroupFacts:
    """R runs trained as one module (R = 1 for a method that does not batch runs)."""

    method: str
    dataset: str
    classes: int  # classes trained on
    runs: int
    batch: int
    epochs: int
    train_images: tuple[int, ...]  # per run (few-shot sets may differ)
    eval_sets: tuple[EvalFacts, ...]
    soft_labels: tuple[str | None, ...]  # per run: None, "ls", "csl", "isl" or "mix"
    reads_pixels: bool = False
    views: int = 1  # cached views per training image (the feed preloads them)
    config_digest: str = ""  # the method config (R aside), so a unit is measured for this exact config
    learns: bool = True  # False: zero-shot CLIP, nothing to train
    decode: str = "decode"  # the decode unit of its images (decode_key(dataset) when the plan's files were timed)
    # pixel methods: distinct training image lists among the runs (a seed's label variants share theirs, and a step
    # decodes each of its views once for all of them); 0: one per run
    training_sets: int = 0
    # distinct test images over the evaluation sets (a group decodes and encodes each once); 0: the sets' sum
    test_images: int = 0
    # runs that share their first epochs (engine.group.plan_fork): those epochs train a trunk of this many runs
    trunk_runs: int = 0
    trunk_epochs: int = 0

    @property
    def decoded_sets(self) -> int:
        return self.training_sets or self.runs

    @property
    def distinct_test_images(self) -> int:
        return self.test_images or sum(e.images for e in self.eval_sets)

    @property
    def steps_per_epoch(self) -> int:
        """The group steps until its largest run's epoch is over (the last partial batch is kept)."""
        return math.ceil(max(self.train_images) / self.batch) if self.train_images else 0


@dataclass(frozen=True)
class PlanFacts:
    """What a sweep will do, before it runs."""

    groups: tuple[GroupFacts, ...]
    runs: int  # planned runs
    finished: int  # of which already have a finished record
    features_to_encode: int  # (image, view) pairs the cache lacks
    images_to_decode: int  # images with at least one missing view (each decoded once per build)
    embed_dim: int
    device: str = "cpu"
    plan_seconds: float = 0.0  # what planning took here (the real run plans again)
    # the new process's start up to its runs' planning (imports, backbone, data listing), as this process took
    # it; 0 when unknown (then setup = backbone load + planning)
    startup_seconds: float = 0.0
    # (cut unit, views per encoder batch, features, images) per dataset and batch size the cache build encodes
    # (an image's views are encoded together: 201 views of a 200-epoch recipe are a batch); empty: all of them with
    # the "cut" unit in batches of BATCH_VIEWS
    encode_parts: tuple[tuple[str, int, int, int], ...] = ()
    decode_workers: int = 1  # decoding processes beside the steps (CUDA: the pixel methods)
    report: bool = False  # the command writes a report (tables and plots) once its runs are done
    ends_process: bool = False  # the runs are a command's, whose process ends after them (its end is priced)
    cache_workers: int = 1  # decoding processes of a cache build beside its encoder (atlas_fast.cache.build)
    # on the CPU: whether the build's decoding processes have cores of their own beside the encoder's threads (its
    # threads + workers <= the CPUs this process may use), so that decoding overlaps encoding as on CUDA
    spare_cores: bool = False


def missing_features(cache_root: str | Path, backbone, dataset: str, wanted: dict[Any, set[int]], aug_seed: int,
                     content_hash: bool = False) -> Counter[int]:
    """How many images of ``wanted`` (datum -> views) lack how many views in the cache file of (backbone, dataset,
    aug_seed) (``{views lacking: images}``; the build encodes an image's lacking views together): read from its row
    index and done flags under a shared lock, nothing written."""
    from atlas_fast.cache import FeatureCache
    from atlas_fast.cache.format import open_h5, read_rows, row_index
    from atlas_fast.cache.locking import flock, lock_path
    from atlas_fast.data.identity import image_identities

    cache = FeatureCache(cache_root, content_hash=content_hash)
    path = cache.path_for(backbone, dataset, aug_seed)
    items = list(wanted)
    if not path.exists():
        return Counter(len(views) for views in wanted.values())
    ids = image_identities(items, content_hash)
    with flock(lock_path(path), exclusive=False):
        with open_h5(path, "r") as f:
            keys, file_ids, done = read_rows(f, path)
    rows = row_index(keys, file_ids)
    lacking: Counter[int] = Counter()
    for datum, image_id in zip(items, ids):
        row = rows.get((datum.key, image_id), -1)
        count = sum(1 for v in wanted[datum] if row < 0 or v >= done.shape[1] or not done[row, v])
        if count:
            lacking[count] += 1
    return lacking


def plan_facts(specs: Sequence[Any], runs_per_group: int, backbone=None) -> PlanFacts:
    """The facts of planned runs: finished runs dropped, the rest grouped as the sweep groups them, and the features
    the cache lacks for them (train views 0..V, view 0 for the pixel methods; the test and few-shot validation
    splits' view 0), by the encoder batches the build will put them in."""
    import torch

    from atlas_fast.cache.build import batch_views, default_workers
    from atlas_fast.engine.group import group_runs, plan_fork
    from atlas_fast.engine.pipeline import split_finished

    finished, todo = split_finished(specs, complete=False)
    todo_specs = [specs[i] for i in todo]
    groups: list[GroupFacts] = []
    for part in group_runs(todo_specs, runs_per_group):  # the groups that train (one run each where R = 1)
        entry = part[0].method
        first = part[0]
        sets = tuple(EvalFacts(name, split.num_classes, len(split.test))
                     for name, split in first.data.splits.items())
        training_sets = {(tuple(d.impath for d in s.data.train_split.train), s.views, s.config.aug_seed)
                         for s in part}
        test_images = {d.impath for split in first.data.splits.values() for d in split.test}
        fork = plan_fork(part, [s.config.schedule for s in part])
        groups.append(GroupFacts(
            method=first.config.method, dataset=first.dataset, classes=first.data.train_split.num_classes,
            runs=len(part), batch=first.optim_recipe.batch_size, epochs=first.optim_recipe.epochs,
            train_images=tuple(len(s.data.train_split.train) for s in part), eval_sets=sets,
            soft_labels=tuple(s.config.soft_labels.kind if s.config.soft_labels is not None else None
                              for s in part),
            reads_pixels=entry.reads_pixels, views=max(s.views for s in part),
            config_digest=config_digest(first.method_config), learns=entry.learns,
            decode=decode_key(first.dataset), training_sets=len(training_sets), test_images=len(test_images),
            trunk_runs=len(fork.trunk) if fork else 0, trunk_epochs=fork.after + 1 if fork else 0))
    features = images = 0
    parts: list[tuple[str, int, int, int]] = []
    if todo_specs:
        backbone = backbone if backbone is not None else todo_specs[0].backbone()
        wanted: dict[tuple, dict[Any, set[int]]] = {}
        for spec in todo_specs:
            entry = spec.method
            where = (str(spec.config.cache_root), spec.dataset, spec.config.aug_seed, spec.config.content_hash)
            per_item = wanted.setdefault(where, {})
            train_views = entry.cached_train_views(spec.views)
            for datum in spec.data.train_split.train:
                per_item.setdefault(datum, set()).update(range(train_views + 1))
            held_out = () if spec.data.fewshot.val_is_test else spec.data.train_split.val  # calibration's split
            for datum in (*spec.data.fewshot.test, *held_out):
                per_item.setdefault(datum, set()).add(0)
        for (root, dataset, aug_seed, content_hash), per_item in wanted.items():
            encoded: dict[int, list[int]] = {}  # views per encoder batch -> [features, images] in such batches
            for views, count in missing_features(root, backbone, dataset, per_item, aug_seed, content_hash).items():
                part = encoded.setdefault(batch_views(views), [0, 0])
                part[0], part[1] = part[0] + views * count, part[1] + count
            for batch, (f, i) in sorted(encoded.items()):
                features, images = features + f, images + i
                parts.append((cut_key(dataset), batch, f, i))
    device = specs[0].device.type if specs else "cpu"
    workers = min(8, os.cpu_count() or 1) if device == "cuda" else 1
    embed_dim = int(backbone.embed_dim) if backbone is not None else 0
    return PlanFacts(groups=tuple(groups), runs=len(specs), finished=len(specs) - len(todo),
                     features_to_encode=features, images_to_decode=images, embed_dim=embed_dim, device=device,
                     plan_seconds=sum(spec.plan_seconds for spec in specs), decode_workers=workers,
                     encode_parts=tuple(parts), cache_workers=default_workers(torch.device(device)),
                     spare_cores=device == "cpu" and spare_cores(default_workers(torch.device("cpu"))))


def spare_cores(workers: int) -> bool:
    """Whether ``workers`` decoding processes have cores of their own beside this process's torch threads."""
    import torch

    from atlas_fast.threads import available_cpus

    return torch.get_num_threads() + workers <= available_cpus().count
