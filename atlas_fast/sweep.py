"""Grids of training runs (datasets x method variants x seeds), grouped, skipped when finished and sent to an executor.

A sweep is a list of :class:`~atlas_fast.train.TrainConfig` values. :func:`run_configs` drops the runs whose finished
record already exists, packs the others into groups of up to ``batch_runs`` compatible runs (same dataset, backbone,
method and resolved recipe: see :func:`group_key`) and hands the groups to an executor (:mod:`atlas_fast.executors`:
this process, Ray tasks or a SLURM job array). Every run writes its own record as soon as its group finishes, so a
killed sweep is resumed by running it again and loses at most the groups in flight.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from atlas_fast.report import SOFT_LABEL_NAMES
from atlas_fast.schedules import Atlas, LabelSchedule, OneHot
from atlas_fast.softlabels import SoftLabelConfig, atlas_period, atlas_preset
from atlas_fast.train import TrainConfig

EXECUTORS = ("local", "ray", "slurm")
# Runs trained together by default: a GPU step of one cached CoOp run is far too small to fill the device; on the
# CPU, batching still saves the per-step Python overhead (benchmarks/sweep_speed.py measures both). Activation
# memory grows with R x C prompts: lower --batch-runs for ImageNet-sized class sets on a small GPU.
DEFAULT_BATCH_RUNS = {"cuda": 8, "cpu": 4}


@dataclass(frozen=True)
class Variant:
    """A method variant of a results table: its label schedule and soft labels (None for one-hot training)."""

    label: str
    schedule: LabelSchedule
    soft_labels: SoftLabelConfig | None = None


def atlas_variants(setting: str, kinds: Sequence[str] = ("ls", "csl", "isl")) -> list[Variant]:
    """The rows of the paper's Table III for ``setting``: the plain method, then + ATLaS with each soft-label kind,
    with the paper's K, θ, τ_c, α and δ for that setting."""
    period = atlas_period(setting)
    return [Variant("baseline", OneHot())] + [
        Variant(f"+ {SOFT_LABEL_NAMES[kind]}", Atlas(period), atlas_preset(setting, kind)) for kind in kinds]


def grid_configs(base: TrainConfig, datasets: Sequence[str], variants: Sequence[Variant],
                 seeds: Sequence[int]) -> list[TrainConfig]:
    """Every (dataset, variant, seed) of ``base``, in that nesting order."""
    return [dataclasses.replace(base, dataset=d, seed=s, schedule=v.schedule, soft_labels=v.soft_labels)
            for d in datasets for v in variants for s in seeds]


@dataclass
class Execution:
    """Where and how a sweep runs. ``batch_runs`` (R): compatible runs trained together in one module (None: the
    device's default, :data:`DEFAULT_BATCH_RUNS`). ``options`` go to the executor (see :mod:`atlas_fast.executors`:
    e.g. ``address``/``gpus_per_group``/``workers`` for Ray, ``folder``/``partition``/``timeout_min`` for SLURM)."""

    executor: str = "local"
    batch_runs: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}.")
        if self.batch_runs is not None and self.batch_runs < 1:
            raise ValueError(f"batch_runs must be >= 1 runs per group, got {self.batch_runs}.")

    def runs_per_group(self, device_type: str) -> int:
        return self.batch_runs or DEFAULT_BATCH_RUNS.get(device_type, 1)

    def worker_device(self, config: TrainConfig) -> str:
        """The device a run will train on: ``auto`` means the workers' GPU when the executor asks for GPUs (the
        driver, e.g. a login node, may have none), else this machine's choice."""
        gpus = self.options.get("gpus_per_group") or self.options.get("gpus_per_node") or 0
        if config.device == "auto" and self.executor != "local" and float(gpus) > 0:
            return "cuda"
        return config.device


@dataclass(frozen=True)
class PlannedRun:
    """A run of a sweep as the driver sees it: its config (paths made absolute, device resolved for the workers),
    record location and the finished record if there is one."""

    config: TrainConfig
    dataset: str
    stem: str
    described: dict[str, Any]
    finished: dict[str, Any] | None

    @property
    def label(self) -> str:
        soft = self.config.soft_labels.kind if self.config.soft_labels is not None else "-"
        return f"{self.dataset} {self.config.method} {self.config.schedule.name} {soft} seed {self.config.seed}"


def plan_sweep(configs: Sequence[TrainConfig], execution: Execution | None = None) -> list[PlannedRun]:
    """Name every run and look up its finished record: loads each backbone once and lists and fingerprints each run's
    data (a record of other data is never reused), on the CPU when the runs are meant for GPU workers and this
    machine has none."""
    import torch

    from atlas_fast.plan import describe_run, plan_run, record_stem, resolve_device
    from atlas_fast.results import data_record_key, record_key

    execution = execution or Execution()
    planned = []
    for config in configs:
        config = dataclasses.replace(config, device=execution.worker_device(config),
                                     **{k: Path(getattr(config, k)).expanduser().absolute()
                                        for k in ("data_root", "cache_root", "results_dir")})
        device = resolve_device(config.device)
        if device.type != "cuda" or torch.cuda.is_available():
            plan = plan_run(config)
            described, full_key = plan.described, plan.record_key
        else:  # named for the GPU workers, planned (backbone, data fingerprint) on this machine's CPU
            plan = plan_run(dataclasses.replace(config, device="cpu", precision="fp32"))
            described = describe_run(config, plan.dataset, plan.method_config, plan.recipe, device)
            full_key = data_record_key(record_key(described, plan.backbone.fingerprint), plan.data.fingerprint)
        dataset, store, stem = plan.dataset, plan.store, record_stem(config, full_key)
        existing = store.find(dataset, stem, key=full_key)
        if existing is not None:
            existing = {**existing, "skipped": True, "path": str(store.record_path(dataset, stem))}
        planned.append(PlannedRun(config, dataset, stem, described, existing))
    return planned


def group_key(run: PlannedRun) -> str:
    """Runs with equal keys can train as one module: everything but the per-run choices (seed, shots, soft labels,
    label schedule, cached views, per-epoch evaluation) must match, including the resolved recipe."""
    per_run = {"seed", "shots", "soft_labels", "schedule", "views", "aug_seed", "eval_every_epoch"}
    shared = {k: v for k, v in run.described.items() if k not in per_run}
    paths = [str(getattr(run.config, k)) for k in ("data_root", "cache_root", "results_dir")]
    return json.dumps({"shared": shared, "paths": paths}, sort_keys=True, default=str)


def group_runs(runs: Sequence[PlannedRun], batch_runs: int) -> list[list[PlannedRun]]:
    """Pack compatible runs into groups of at most ``batch_runs``, keeping the sweep's order within a group."""
    by_key: dict[str, list[PlannedRun]] = {}
    for run in runs:
        by_key.setdefault(group_key(run), []).append(run)
    return [members[i:i + batch_runs] for members in by_key.values() for i in range(0, len(members), batch_runs)]


def describe_plan(planned: Sequence[PlannedRun], batch_runs: int) -> str:
    """The dry-run listing: one line per run (finished or to run) and the groups the remaining runs form."""
    todo = [p for p in planned if p.finished is None]
    groups = group_runs(todo, batch_runs)
    lines = [f"{'finished' if p.finished is not None else 'to run  '}  {p.label}  ->  {p.dataset}/{p.stem}"
             for p in planned]
    lines.append(f"{len(planned)} runs: {len(planned) - len(todo)} finished, {len(todo)} to run in {len(groups)} "
                 f"group(s) of up to {batch_runs} run(s)")
    return "\n".join(lines)


def run_configs(configs: Sequence[TrainConfig], execution: Execution | None = None,
                on_result: Callable[[dict[str, Any]], None] | None = None,
                progress: bool = True) -> list[dict[str, Any]]:
    """Train every config that has no finished record and return all records in the order of ``configs``."""
    from atlas_fast.executors import make_executor
    from atlas_fast.plan import resolve_device

    execution = execution or Execution()
    planned = plan_sweep(configs, execution)
    records: list[dict[str, Any] | None] = [p.finished for p in planned]
    if on_result is not None:
        for record in records:
            if record is not None:
                on_result(record)
    todo = [i for i, p in enumerate(planned) if p.finished is None]
    if todo:
        first = planned[todo[0]].config
        device_type = resolve_device(first.device).type
        groups = group_runs([planned[i] for i in todo], execution.runs_per_group(device_type))
        position = {id(p): i for i, p in enumerate(planned)}
        executor = make_executor(execution.executor, **execution.options)
        with tqdm(total=len(todo), desc="runs", unit="run", disable=not progress, dynamic_ncols=True) as bar:
            # the executor yields (group index, records) as groups finish, in any order
            for g, group_records in executor.map([[p.config for p in group] for group in groups]):
                for run, record in zip(groups[g], group_records):
                    records[position[id(run)]] = record
                    bar.update(1)
                    if on_result is not None:
                        on_result(record)
    missing = [planned[i].label for i, r in enumerate(records) if r is None]
    if missing:
        raise RuntimeError(f"{len(missing)} run(s) returned no record: {missing[:5]}")
    return records  # type: ignore[return-value]


def run_grid(base: TrainConfig, datasets: Sequence[str], variants: Sequence[Variant], seeds: Sequence[int],
             on_result: Callable[[dict[str, Any]], None] | None = None, progress: bool = True,
             execution: Execution | None = None) -> list[dict[str, Any]]:
    """Train every (dataset, variant, seed) from ``base`` and return the records (finished runs are reused).

    ``on_result`` is called after each run (e.g. to print a line); inner progress bars follow ``base.progress``."""
    return run_configs(grid_configs(base, datasets, variants, seeds), execution, on_result, progress)
