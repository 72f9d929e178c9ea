"""A sweep priced before it runs: the plan's facts, times the units measured on this machine, gives each phase's
wall time, the features to encode, the cache's new bytes and the peak memory.

Three steps, each testable alone:

1. :func:`plan_facts`: the planned runs (:func:`atlas_fast.sweep.plan_sweep`, finished runs dropped as the sweep drops
   them, grouped as :func:`atlas_fast.sweep.group_runs` groups them) and the feature cache's state become
   :class:`PlanFacts` (per group: method, classes, runs, batch, epochs, training images, evaluation sets, soft labels;
   the (image, view) features the cache lacks).
2. :func:`needed_units` / :func:`measure_units`: the units those facts need, read from the calibration store or
   measured once (:mod:`atlas_fast.pricing.calibration`).
3. :func:`price`: pure arithmetic from (facts, units) to an :class:`Estimate` (the formulas are in its docstring).

``estimate_configs(configs, execution)`` does all three.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from atlas_fast.progress import process_seconds
from atlas_fast.pricing.units import Unit

#: bytes of one cached feature value (the cache stores float16)
STORAGE_ITEMSIZE = 2
#: the feed preloads the training views when they fit this (engine.feed.PRELOAD_BYTES)
PRELOAD_BYTES = 1 << 30
DECODE_SAMPLE = 8  # image files of a dataset its decode unit is timed on
EVAL_IMAGES_FACTOR = 4  # an evaluation unit is timed on up to this many times the plan's largest test set
EVAL_IMAGES_FLOOR = 256  # ... and on at least this many images
PHASES = ("setup", "cache build", "soft labels", "training", "evaluation", "per-run overhead", "report")


# ----------------------------------------------------------------------------------------------------------- facts

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
    # runs that share their first epochs (engine.pipeline.plan_fork): those epochs train a trunk of this many runs
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
    # (decode unit, features, images) per dataset to encode; empty: all of them with the "decode" unit
    encode_parts: tuple[tuple[str, int, int], ...] = ()
    decode_workers: int = 1  # decoding processes beside the steps (CUDA: the pixel methods)
    report: bool = False  # the command writes a report (tables and plots) once its runs are done
    cache_workers: int = 1  # decoding processes of a cache build beside its encoder (atlas_fast.cache.build)
    # on the CPU: whether the build's decoding processes have cores of their own beside the encoder's threads (its
    # threads + workers <= the CPUs this process may use), so that decoding overlaps encoding as on CUDA
    spare_cores: bool = False


# ----------------------------------------------------------------------------------------------------------- units

def config_digest(method_config: Any) -> str:
    """A short digest of a method config with R left out (a unit is measured per config)."""
    if method_config is None:
        return ""
    text = repr(dataclasses.replace(method_config, num_runs=1))
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def step_key(method: str, classes: int, batch: int, runs: int, digest: str = "") -> str:
    return f"step/{method}/C={classes}/B={batch}/R={runs}/{digest}"


def eval_key(method: str, classes: int, digest: str = "", runs: int = 1) -> str:
    """The evaluation unit of ``method`` at C = ``classes`` for ``runs`` runs evaluated together in one pass."""
    return f"eval/{method}/C={classes}{f'/R={runs}' if runs > 1 else ''}/{digest}"


def soft_key(kind: str, classes: int, images: int) -> str:
    return f"soft/{kind}/C={classes}/N={images}"


def overhead_key(method: str, classes: int, digest: str = "") -> str:
    return f"overhead/{method}/C={classes}/{digest}"


ENCODE_KEY = "encode"
DECODE_KEY = "decode"


def decode_key(dataset: str) -> str:
    """The decode unit timed on a sample of ``dataset``'s own image files."""
    return f"{DECODE_KEY}/{dataset}"


def encode_parts(facts: "PlanFacts") -> tuple[tuple[str, int, int], ...]:
    """(decode unit, features, images) of what the cache build encodes: only the datasets with features to encode
    (one whose cache is already full, e.g. the demo's, needs no decode unit and is priced at nothing)."""
    parts = facts.encode_parts or ((DECODE_KEY, facts.features_to_encode, facts.images_to_decode),)
    return tuple(part for part in parts if part[1])


LOADER_KEY = "loader start"
LOAD_KEY = "backbone load"
REPORT_KEY = "report"
ZERO_SHOT = "zsclip"


def needed_units(facts: PlanFacts) -> list[str]:
    """Every unit key :func:`price` reads for ``facts``, each once, in a fixed order."""
    keys: list[str] = [LOAD_KEY] + ([REPORT_KEY] if facts.report else [])
    if facts.features_to_encode:
        keys += [ENCODE_KEY] + [decode for decode, _, _ in encode_parts(facts)]
    for g in facts.groups:
        if g.learns:
            keys.append(step_key(g.method, g.classes, g.batch, g.runs, g.config_digest))
            if g.trunk_epochs:
                keys.append(step_key(g.method, g.classes, g.batch, g.trunk_runs, g.config_digest))
        keys.append(overhead_key(g.method, g.classes, g.config_digest))
        for e in g.eval_sets:
            keys += [eval_key(g.method, e.classes, g.config_digest, g.runs), eval_key(ZERO_SHOT, e.classes)]
        if g.reads_pixels:
            keys += [g.decode, LOADER_KEY]
        for kind, images in zip(g.soft_labels, g.train_images):
            if kind not in (None, "ls"):
                keys.append(soft_key(kind, g.classes, images))
    return list(dict.fromkeys(keys))


# -------------------------------------------------------------------------------------------------------- estimate

@dataclass
class Estimate:
    """A priced sweep: seconds per phase (:data:`PHASES`), what the cache gains, the peak memory, and where the
    units came from."""

    phases: dict[str, float]
    runs: int
    finished: int
    groups: int
    features_to_encode: int
    images_to_decode: int
    cache_bytes: int
    peak_host_bytes: int
    peak_device_bytes: int
    device: str
    machine: str = ""
    units_measured: int = 0
    units_reused: int = 0
    calibration_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(self.phases.values())

    def markdown(self) -> str:
        """The estimate as a Markdown table and a few lines."""
        from atlas_fast.cache.space import human_bytes

        to_run = self.runs - self.finished
        lines = [f"Estimate on {self.machine or self.device} ({self.device}): {self.runs} run(s), {self.finished} "
                 f"finished, {to_run} to train in {self.groups} group(s); nothing was trained.", "",
                 "| phase | predicted wall time |", "|---|---:|"]
        lines += [f"| {phase} | {_duration(seconds)} |" for phase, seconds in self.phases.items()]
        lines.append(f"| **total** | **{_duration(self.total_seconds)}** |")
        lines += ["", f"- to encode: {self.features_to_encode} (image, view) feature(s) of {self.images_to_decode} "
                      f"image(s) (what the cache already holds is subtracted); cache grows by "
                      f"{human_bytes(self.cache_bytes)}",
                  (f"- peak host memory (process RSS): {human_bytes(self.peak_host_bytes)}"
                   + (f"; peak device memory: {human_bytes(self.peak_device_bytes)}" if self.device == "cuda" else "")
                   if to_run else "- every run is finished: nothing to train"),
                  f"- units: {self.units_reused} reused from the calibration store, {self.units_measured} measured "
                  f"now ({self.calibration_seconds:.1f} s)"]
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_seconds": self.total_seconds}


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def price(facts: PlanFacts, units: Mapping[str, Unit]) -> Estimate:
    """Pure arithmetic from the plan's facts and the units (``units[key]`` for every key of :func:`needed_units`).

    * setup = the process's start up to planned runs (``facts.startup_seconds``, when the command measured it),
      else backbone load + planning (``facts.plan_seconds``)
    * cache build = features x (encode + decode per view) + images x decode per image on the CPU when the encoder's
      threads take every core; on CUDA, and on the CPU when the decoding processes have cores of their own
      (``spare_cores``: the demo's one thread on two cores), the decoding runs in ``cache_workers`` processes beside
      the encoder (and the writes in a thread beside it): features x max(encode, decode per view / workers) + images
      x decode per image / workers
    * soft labels = sum over runs with CSL/ISL/mix of soft(kind, C, N of the run) (LS is free)
    * training = sum over the groups that learn (zero-shot CLIP trains nothing) of epochs x steps per epoch x
      (step(method, C, B, R) + for pixel methods B x S x (decode per view + per image), the views decoded in the
      loop, each distinct (image, view) of a step once for the S distinct training sets of the group's runs); on
      CUDA the decoding runs in ``decode_workers`` processes beside the steps: max(step, B x S x decode / workers)
      ; a group whose runs share their first F epochs (a seed's plain run and its ATLaS variants, K >= 2:
      :func:`atlas_fast.engine.pipeline.plan_fork`) trains them with its T trunk runs: F epochs at step(method, C,
      B, T), the rest at R
    * evaluation = sum over groups: per class set eval(method, C, R) fixed (the R runs' class prompts) + the
      zero-shot references (zsclip fixed + N x per image); cached features: + N x eval per image (the R runs' heads
      over one read of the features); pixels: + each distinct test image of the group's sets once x (eval per
      image at R + decode; on CUDA max(eval per image, decode / workers)), its prompted features scored by every
      set that holds it
    * the pixel methods' decoding pool starts once per command (+ loader start, in training when a pixel group
      trains, else in evaluation)
    * per-run overhead = sum over groups of R x overhead(method, C)
    * peak host = max over groups of max(step, evaluation peak RSS) + the group's features held in memory (each run's
      cached training views when preloaded, the evaluation sets' features), float32
    * report = the report unit (tables and a plot, matplotlib's start included) when the command writes one
    * peak device = max over groups of max(step, evaluation peak)
    """
    lacking = [key for key in needed_units(facts) if key not in units]
    if lacking:
        raise ValueError(f"price: {len(lacking)} unit(s) the plan needs were not measured, e.g. {lacking[0]!r}.")
    phases = dict.fromkeys(PHASES, 0.0)
    phases["setup"] = facts.startup_seconds or units[LOAD_KEY].seconds + facts.plan_seconds
    phases["report"] = units[REPORT_KEY].seconds if facts.report else 0.0
    cuda = facts.device == "cuda"
    for key, features, images in encode_parts(facts):
        encode, decode = units[ENCODE_KEY], units[key]
        if cuda or facts.spare_cores:
            workers = max(1, facts.cache_workers)
            phases["cache build"] += (features * max(encode.seconds, decode.seconds / workers)
                                      + images * decode.fixed_seconds / workers)
        else:
            phases["cache build"] += features * (encode.seconds + decode.seconds) + images * decode.fixed_seconds
    peak_host = peak_device = 0
    for g in facts.groups:
        step = units[step_key(g.method, g.classes, g.batch, g.runs, g.config_digest)] if g.learns else Unit(0.0)
        workers = max(1, facts.decode_workers)
        decoding = 0.0
        if g.reads_pixels:  # the loop decodes each step's views once; on CUDA in worker processes beside the steps
            decode = units[g.decode]
            decoding = g.batch * g.decoded_sets * (decode.seconds + decode.fixed_seconds)

        def with_decoding(seconds: float) -> float:
            return max(seconds, decoding / workers) if cuda else seconds + decoding

        if g.learns:
            forked = g.trunk_epochs  # the shared first epochs trained by the trunk runs, then forked
            if forked:
                trunk = units[step_key(g.method, g.classes, g.batch, g.trunk_runs, g.config_digest)]
                phases["training"] += forked * g.steps_per_epoch * with_decoding(trunk.seconds)
            phases["training"] += (g.epochs - forked) * g.steps_per_epoch * with_decoding(step.seconds)
        for kind, images in zip(g.soft_labels, g.train_images):
            if kind not in (None, "ls"):
                phases["soft labels"] += units[soft_key(kind, g.classes, images)].seconds
        held = 0
        group_peak_host, group_peak_device = step.peak_host_bytes, step.peak_device_bytes
        per_pixel_image = 0.0
        for e in g.eval_sets:
            evaluation = units[eval_key(g.method, e.classes, g.config_digest, g.runs)]
            zero_shot = units[eval_key(ZERO_SHOT, e.classes)]
            phases["evaluation"] += evaluation.fixed_seconds + zero_shot.fixed_seconds + e.images * zero_shot.seconds
            if g.reads_pixels:  # the images are decoded and go through the prompted towers once per group
                per_pixel_image = max(per_pixel_image, evaluation.seconds)
            else:
                phases["evaluation"] += e.images * evaluation.seconds
            held += e.images * facts.embed_dim * 4
            group_peak_host = max(group_peak_host, evaluation.peak_host_bytes)
            group_peak_device = max(group_peak_device, evaluation.peak_device_bytes)
        if g.reads_pixels:
            decoding = units[g.decode].seconds + units[g.decode].fixed_seconds
            per_image = max(per_pixel_image, decoding / workers) if cuda else per_pixel_image + decoding
            phases["evaluation"] += g.distinct_test_images * per_image
        phases["per-run overhead"] += g.runs * units[overhead_key(g.method, g.classes, g.config_digest)].seconds
        if not g.reads_pixels:
            train_bytes = sum(n * g.views * facts.embed_dim * 4 for n in g.train_images)
            held += train_bytes if train_bytes <= PRELOAD_BYTES * g.runs else 0
        peak_host = max(peak_host, group_peak_host + held)
        peak_device = max(peak_device, group_peak_device)
    pixels = [g for g in facts.groups if g.reads_pixels]
    if pixels:  # one decoding pool per command
        phases["training" if any(g.learns for g in pixels) else "evaluation"] += units[LOADER_KEY].seconds
    return Estimate(phases=phases, runs=facts.runs, finished=facts.finished, groups=len(facts.groups),
                    features_to_encode=facts.features_to_encode, images_to_decode=facts.images_to_decode,
                    cache_bytes=facts.features_to_encode * facts.embed_dim * STORAGE_ITEMSIZE,
                    peak_host_bytes=peak_host, peak_device_bytes=peak_device, device=facts.device)


# ------------------------------------------------------------------------------------------------ plan and cache

def missing_features(cache_root: str | Path, backbone, dataset: str, wanted: dict[Any, set[int]], aug_seed: int,
                     content_hash: bool = False) -> tuple[int, int]:
    """(features, images) of ``wanted`` (datum -> views) that the cache file of (backbone, dataset, aug_seed) lacks:
    read from its row index and done flags under a shared lock, nothing written."""
    from atlas_fast.cache import FeatureCache
    from atlas_fast.cache.format import open_h5, read_rows, row_index
    from atlas_fast.cache.locking import flock, lock_path
    from atlas_fast.data.identity import image_identities

    cache = FeatureCache(cache_root, content_hash=content_hash)
    path = cache.path_for(backbone, dataset, aug_seed)
    items = list(wanted)
    if not path.exists():
        return sum(len(v) for v in wanted.values()), len(items)
    ids = image_identities(items, content_hash)
    with flock(lock_path(path), exclusive=False):
        with open_h5(path, "r") as f:
            keys, file_ids, done = read_rows(f, path)
    rows = row_index(keys, file_ids)
    features = images = 0
    for datum, image_id in zip(items, ids):
        row = rows.get((datum.key, image_id), -1)
        lacking = [v for v in wanted[datum] if row < 0 or v >= done.shape[1] or not done[row, v]]
        features += len(lacking)
        images += bool(lacking)
    return features, images


def plan_facts(specs: Sequence[Any], runs_per_group: int, backbone=None) -> PlanFacts:
    """The facts of planned runs (:class:`~atlas_fast.engine.spec.RunSpec`): finished runs dropped, the rest grouped
    as the sweep groups them (one by one for a method that does not batch runs), and the features the cache lacks
    for the runs to train (train views 0..V, or view 0 for the pixel methods; the test split's view 0)."""
    import torch

    from atlas_fast.cache.build import default_workers
    from atlas_fast.engine.pipeline import plan_fork, split_finished
    from atlas_fast.sweep import group_runs

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
            trunk_runs=len(fork[0]) if fork else 0, trunk_epochs=fork[2] + 1 if fork else 0))
    features = images = 0
    parts: list[tuple[str, int, int]] = []
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
            for datum in spec.data.fewshot.test:
                per_item.setdefault(datum, set()).add(0)
        for (root, dataset, aug_seed, content_hash), per_item in wanted.items():
            f, i = missing_features(root, backbone, dataset, per_item, aug_seed, content_hash)
            features, images = features + f, images + i
            parts.append((decode_key(dataset), f, i))
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


# --------------------------------------------------------------------------------------------------- measuring

def measure_units(facts: PlanFacts, store, backbone, specs: Sequence[Any],
                  report: Callable[[Path], Any] | None = None) -> dict[str, Unit]:
    """Every unit :func:`price` needs for ``facts``, from ``store`` (a
    :class:`~atlas_fast.pricing.calibration.CalibrationStore`) or measured now on ``backbone`` with the planned runs'
    class names and method configs (``specs``); ``report`` writes a sample of the command's report into a folder
    (the report unit's work, when ``facts.report``)."""
    from atlas_fast.pricing import units as measure

    configs = {config_digest(s.method_config): s.method_config for s in specs}
    names: dict[int, list[str]] = {}
    for spec in specs:
        for split in spec.data.splits.values():
            names.setdefault(split.num_classes, list(split.classnames))
    amp = bool(specs[0].amp) if specs else False
    samples: dict[str, list[str]] = {}
    for spec in specs:
        files = [d.impath for d in (*spec.data.train_split.train[:DECODE_SAMPLE // 2],
                                    *spec.data.fewshot.test[:DECODE_SAMPLE // 2])]
        samples.setdefault(decode_key(spec.dataset), files[:DECODE_SAMPLE])

    def classnames(count: int) -> list[str]:
        return names.get(count) or measure.synthetic_classnames(count)

    def measurer(key: str):
        kind, *rest = key.split("/")
        if key == LOAD_KEY:
            return lambda: measure.measure_backbone_load(backbone.config, backbone.device)
        if key == REPORT_KEY:
            return lambda: measure.measure_report(report)
        if key == ENCODE_KEY:
            return lambda: measure.measure_encode(backbone)
        if key == DECODE_KEY:
            return lambda: measure.measure_decode(backbone)
        if key.startswith(DECODE_KEY + "/"):  # a sample of the dataset's own files, train and test
            return lambda: measure.measure_decode(backbone, images=samples[key])
        if key == LOADER_KEY:
            return lambda: measure.measure_loader_start(backbone)
        fields = {part.split("=")[0]: part.split("=")[1] for part in rest if "=" in part}
        digest = rest[-1] if kind in ("step", "eval", "overhead") else ""
        config = configs.get(digest)
        if config is not None:
            config = dataclasses.replace(config, num_runs=1)
        classes = int(fields["C"])
        if kind == "step":
            return lambda: measure.measure_step(backbone, rest[0], classnames(classes), int(fields["B"]),
                                                int(fields["R"]), config=config, amp=amp)
        if kind == "eval":
            return lambda: measure.measure_eval(backbone, rest[0], classnames(classes), config=config, amp=amp,
                                                runs=int(fields.get("R", 1)), max_images=eval_images(key))
        if kind == "overhead":
            return lambda: measure.measure_run_overhead(backbone, rest[0], classnames(classes), config=config)
        if kind == "soft":
            return lambda: measure.measure_soft_labels(backbone, rest[0], classnames(classes), int(fields["N"]))
        raise ValueError(f"unknown unit key {key!r}")

    # an evaluation unit is timed on up to EVAL_IMAGES_FACTOR x the largest test set the plan evaluates with it (a
    # stored one timed on fewer is measured again): the calibration of a small job stays small
    tested: dict[str, int] = {}
    for g in facts.groups:
        for e in g.eval_sets:
            for key in (eval_key(g.method, e.classes, g.config_digest, g.runs), eval_key(ZERO_SHOT, e.classes)):
                tested[key] = max(tested.get(key, 0), e.images)

    def eval_images(key: str) -> int:
        return min(measure.MAX_EVAL_IMAGES, max(EVAL_IMAGES_FLOOR, EVAL_IMAGES_FACTOR * tested.get(key, 0)))

    def enough(key: str):
        if key not in tested:
            return None
        return lambda unit: not unit.images or unit.images >= eval_images(key)  # 0: timed before the cap

    return {key: store.unit(key, measurer(key), enough(key)) for key in needed_units(facts)}


def check_cache_root(root: Path) -> None:
    """A cache root is a folder, or made as one: a ``NotADirectoryError`` naming it when it (or a folder above it) is
    a file. A read-only one is fine: an estimate only reads the cache and keeps what it measures where it can."""
    from atlas_fast.files import file_in_the_way

    file = file_in_the_way(root)
    if file == root:
        raise NotADirectoryError(f"cache root {root} is a file, not a folder: --cache-root takes a folder (made if "
                                 f"missing).")
    if file is not None:
        raise NotADirectoryError(f"cache root {root} cannot be made: {file} is a file, not a folder.")


def estimate_configs(configs: Sequence[Any], execution: Any = None, cache_root: str | Path | None = None,
                     command_start: bool = False, report: Callable[[Path], Any] | None = None) -> Estimate:
    """Price a sweep of :class:`~atlas_fast.engine.TrainConfig` values on this machine without training: plan it,
    read the cache's state, take the units from the calibration store under the cache root (``cache_root``, default
    the first config's) or measure them once, and do the arithmetic (:func:`price`). ``command_start`` (a command
    that will run the sweep in a new process of its own): setup is this process's time from its start to planned
    runs, which that process will take again. ``report``: the command writes a report once its runs are done (an
    experiment's tables and plots), priced too: a function that writes a sample of it into a folder, timed once per
    machine (the report unit)."""
    import time

    import torch

    from atlas_fast.pricing.calibration import CalibrationStore, context_key, machine_name
    from atlas_fast.sweep import Execution, plan_sweep

    if not configs:
        raise ValueError("estimate_configs: no runs to price (an empty list of configs).")
    for root in dict.fromkeys([*([cache_root] if cache_root is not None else []), *(c.cache_root for c in configs)]):
        check_cache_root(Path(root).expanduser())
    execution = execution or Execution()
    specs = plan_sweep(configs, execution)
    startup = process_seconds() if command_start else 0.0
    device = specs[0].device
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("The runs are planned for CUDA workers, but this machine has no GPU to measure them on; "
                         "estimate on a machine like the workers.")
    backbone = specs[0].backbone()
    facts = dataclasses.replace(plan_facts(specs, execution.runs_per_group(device.type), backbone),
                                startup_seconds=startup, report=report is not None)
    precision = "amp" if specs[0].amp else "fp32"
    machine = machine_name(device)
    store = CalibrationStore(cache_root or specs[0].config.cache_root,
                             context_key(machine, backbone.fingerprint, device.type, precision))
    clock = time.perf_counter()
    units = measure_units(facts, store, backbone, specs, report)
    estimate = price(facts, units)
    estimate.machine = machine
    estimate.units_measured = store.measured
    estimate.units_reused = len(units) - store.measured
    estimate.calibration_seconds = time.perf_counter() - clock
    return estimate
