"""A sweep priced before it runs: the plan's facts, times the units measured on this machine, gives each phase's
wall time, the features to encode, the cache's new bytes and the peak memory.

Three steps, each testable alone:

1. :func:`~atlas_fast.pricing.facts.plan_facts`: the planned runs and the feature cache's state become
   :class:`~atlas_fast.pricing.facts.PlanFacts` (:mod:`atlas_fast.pricing.facts`).
2. :func:`~atlas_fast.pricing.calibrate.needed_units` / :func:`~atlas_fast.pricing.calibrate.measure_units`: the
   units those facts need, read from the calibration store or measured once (:mod:`atlas_fast.pricing.calibrate`).
3. :func:`price`: pure arithmetic from (facts, units) to an :class:`Estimate` (the formulas are in its docstring).

``estimate_configs(configs, execution)`` does all three.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from atlas_fast.progress import process_seconds
from atlas_fast.pricing.calibrate import encode_parts, measure_units, needed_units
from atlas_fast.pricing.facts import PlanFacts, plan_facts
from atlas_fast.pricing.timing import Unit
from atlas_fast.pricing.unit_keys import (EXIT_KEY, LOAD_KEY, LOADER_KEY, REPORT_KEY, ZERO_SHOT, encode_key, eval_key,
                                          overhead_key, soft_key, step_key)

#: bytes of one cached feature value (the cache stores float16)
STORAGE_ITEMSIZE = 2
#: the feed preloads the training views when they fit this (engine.feed.PRELOAD_BYTES)
PRELOAD_BYTES = 1 << 30
PHASES = ("setup", "cache build", "soft labels", "training", "evaluation", "per-run overhead", "report",
          "process end")


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
    * cache build = per part (dataset and encoder batch: an image's views are encoded together, so a 200-epoch
      recipe's 201 views are one batch and its test images 64 to a batch): features x (encode at that batch + cut
      per view) + images x cut per image (the workers' decoding into 8-bit views) on the CPU when the encoder's
      threads take every core; on CUDA, and on the CPU when the decoding processes have cores of their own
      (``spare_cores``: the demo's one thread on two cores), the decoding runs in ``cache_workers`` processes beside
      the encoder (and the writes in a thread beside it): features x max(encode, cut per view / workers) + images x
      cut per image / workers
    * soft labels = sum over runs with CSL/ISL/mix of soft(kind, C, N of the run) (LS is free)
    * training = sum over the groups that learn (zero-shot CLIP trains nothing) of epochs x steps per epoch x
      (step(method, C, B, R) + for pixel methods B x S x (decode per view + per image), the views decoded in the
      loop, each distinct (image, view) of a step once for the S distinct training sets of the group's runs); on
      CUDA the decoding runs in ``decode_workers`` processes beside the steps: max(step, B x S x decode / workers)
      ; a group whose runs share their first F epochs (a seed's plain run and its ATLaS variants, K >= 2:
      :func:`atlas_fast.engine.group.plan_fork`) trains them with its T trunk runs: F epochs at step(method, C,
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
    * process end = the exit unit (Python tearing down the modules and objects) when the runs are a command's
    * peak device = max over groups of max(step, evaluation peak)
    """
    lacking = [key for key in needed_units(facts) if key not in units]
    if lacking:
        raise ValueError(f"price: {len(lacking)} unit(s) the plan needs were not measured, e.g. {lacking[0]!r}.")
    phases = dict.fromkeys(PHASES, 0.0)
    phases["setup"] = facts.startup_seconds or units[LOAD_KEY].seconds + facts.plan_seconds
    phases["report"] = units[REPORT_KEY].seconds if facts.report else 0.0
    phases["process end"] = units[EXIT_KEY].seconds if facts.ends_process else 0.0
    cuda = facts.device == "cuda"
    for key, batch, features, images in encode_parts(facts):
        encode, decode = units[encode_key(batch)], units[key]
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
    the first config's) or measure them once, and do the arithmetic (:func:`price`). ``command_start``: setup is this
    process's time from its start to planned runs (a command that will run the sweep in a new process of its own).
    ``report``: a function that writes a sample of the command's report into a folder, timed once per machine."""
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
                                startup_seconds=startup, report=report is not None, ends_process=command_start)
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
