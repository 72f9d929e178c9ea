"""Grids of training runs (datasets x method variants x seeds), planned once, grouped, skipped when finished and sent
to an executor.

The driver plans each :class:`~atlas_fast.engine.config.TrainConfig` once (:func:`plan_sweep`); :func:`run_configs`
drops finished runs, groups the others (:func:`atlas_fast.engine.group.group_runs`) and hands the groups to an
executor (:mod:`atlas_fast.sweep.executors`). A killed sweep resumes by running again (docs/sweeps.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from atlas_fast.progress import TimeLeft, progress_bar, say

from atlas_fast.engine.config import TrainConfig
from atlas_fast.engine.group import group_runs
from atlas_fast.engine.pipeline import failure_message, split_finished
from atlas_fast.engine.record import FailedRun
from atlas_fast.engine.spec import RunSpec, plan_run
from atlas_fast.atlas.variants import LabelVariant
from atlas_fast.errors import Interrupted, RunFailed, RunsFailed, UsageError, distinct
from atlas_fast.sweep.executors import WorkerFailure, make_executor
from atlas_fast.vocabulary import CLASS_SETS, EXECUTORS, HARMONIC_MEAN

# Runs trained together by default: a GPU step of one cached CoOp run is far too small to fill the device (it is
# kernel-launch bound), so on a GPU R = 12: benchmarks/gpu_check.sh's "R-batched training" on one H200 (fp32, cached
# CoOp + ATLaS/-CSL/-ISL x 3 seeds, ViT-B/16-shaped, 50 classes) measured 12 runs in 25.1 s one by one and 5.7 s
# batched, 4.39x the runs/hour of R = 1 (docs/benchmarks.md, the H100 tables); its "runs/hour by R" row measures R = 1/4/12 again.
# On the CPU, batching still saves the per-step Python overhead (benchmarks/sweep_speed.py). Activation memory
# grows with R x C prompts: lower --batch-runs for ImageNet-sized class sets on a small GPU.
DEFAULT_BATCH_RUNS = {"cuda": 12, "cpu": 4}
MAX_GPUS_PER_GROUP = 64  # GPUs one group (a Ray task, a SLURM array task) can ask for: more than any node holds


def grid_configs(base: TrainConfig, datasets: Sequence[str], variants: Sequence[LabelVariant],
                 seeds: Sequence[int]) -> list[TrainConfig]:
    """Every (dataset, variant, seed) of ``base``, in that nesting order; a dataset, variant (label schedule and
    soft labels) or seed given twice is refused (:func:`distinct`)."""
    distinct(datasets, "datasets")
    distinct(seeds, "seeds")
    distinct([(v.schedule, v.soft_labels) for v in variants], "variants (label schedule, soft labels)")
    return [dataclasses.replace(base, dataset=d, seed=s, schedule=v.schedule, soft_labels=v.soft_labels)
            for d in datasets for v in variants for s in seeds]


def check_gpus(value: Any, name: str = "--gpus-per-group") -> None:
    """Refuse a GPU count per group that is not a finite number in [0, :data:`MAX_GPUS_PER_GROUP`] (None: the
    executor's default), naming the option."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or not 0 <= value <= MAX_GPUS_PER_GROUP):
        raise UsageError(f"{name} must be a number of GPUs in [0, {MAX_GPUS_PER_GROUP}], got {value!r}.")


@dataclass
class Execution:
    """Where and how a sweep runs. ``batch_runs`` (R): compatible runs trained together in one module (None: the
    device's default, :data:`DEFAULT_BATCH_RUNS`). ``options`` go to the executor (see :mod:`atlas_fast.sweep.executors`:
    e.g. ``address``/``gpus_per_group``/``workers`` for Ray, ``folder``/``partition``/``timeout_min`` for SLURM)."""

    executor: str = "local"
    batch_runs: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}.")
        if self.batch_runs is not None and self.batch_runs < 1:
            raise ValueError(f"batch_runs must be >= 1 runs per group, got {self.batch_runs}.")
        for name in ("gpus_per_group", "gpus_per_node"):
            check_gpus(self.options.get(name), f"{name} (--gpus-per-group)")

    def runs_per_group(self, device_type: str) -> int:
        """The most runs a group trains on a ``device_type`` device (``batch_runs`` or that device's default); the
        group lowers it where they would not fit its memory (:func:`atlas_fast.engine.group.group_size`)."""
        return self.batch_runs or DEFAULT_BATCH_RUNS.get(device_type, 1)

    def worker_device(self, config: TrainConfig) -> str:
        """The device a run will train on: ``auto`` means the workers' GPU when the executor asks for GPUs (the
        driver, e.g. a login node, may have none), else this machine's choice."""
        gpus = self.options.get("gpus_per_group") or self.options.get("gpus_per_node") or 0
        if config.device == "auto" and self.executor != "local" and float(gpus) > 0:
            return "cuda"
        return config.device


def plan_sweep(configs: Sequence[TrainConfig], execution: Execution | None = None) -> list[RunSpec]:
    """Plan every run once (paths absolute, device resolved for the workers): loads each backbone once per process,
    lists each dataset once and fingerprints each run's data, so a record of other data is never reused and workers plan
    nothing."""
    execution = execution or Execution()
    remote = execution.executor != "local"
    listings: dict = {}  # each dataset is listed once per sweep
    specs = [plan_run(dataclasses.replace(config, device=execution.worker_device(config)), for_workers=remote,
                      listings=listings) for config in configs]
    first: dict[str, RunSpec] = {}
    for spec in specs:
        if spec.record_key in first:
            raise UsageError(f"The sweep lists the run {spec.name} ({spec.stem}) twice: a duplicate seed or grid "
                             f"point would count it twice in every mean; give each once.")
        first[spec.record_key] = spec
    return specs


def describe_groups(groups: Sequence[Sequence[RunSpec]]) -> str:
    """``2 group(s) (R = 12, 8)``: how many groups and the runs each trains together."""
    sizes = [len(group) for group in groups]
    shown = ", ".join(map(str, sizes[:12])) + (", ..." if len(sizes) > 12 else "")
    return f"{len(groups)} group(s)" + (f" (R = {shown})" if groups else "")


def describe_plan(specs: Sequence[RunSpec], batch_runs: int) -> str:
    """The dry-run listing: one line per run (finished or to run) and the groups the remaining runs form."""
    finished, todo = split_finished(specs, complete=False)
    groups = group_runs([specs[i] for i in todo], batch_runs)
    lines = [f"{'finished' if record is not None else 'to run  '}  {spec.name}  ->  {spec.dataset}/{spec.stem}"
             for spec, record in zip(specs, finished)]
    lines.append(f"{len(specs)} runs: {len(specs) - len(todo)} finished, {len(todo)} to run in "
                 f"{describe_groups(groups)}, of up to {batch_runs} run(s) each (fewer where the device's memory "
                 f"or a method that does not batch runs asks)")
    return "\n".join(lines)


def run_configs(configs: Sequence[TrainConfig], execution: Execution | None = None,
                on_result: Callable[[dict[str, Any]], None] | None = None,
                progress: bool = True) -> list[dict[str, Any]]:
    """Train every config that has no finished record and return all records in the order of ``configs``.

    With ``progress``, a line per run as it finishes (its metrics and seconds, the time so far and about how much is
    left; printed into logs too), a bar over the runs on a terminal, and, for groups trained in this process, the
    cache-build and epoch bars of the group. The time left is the runs' own rate: locally, the time the finished
    groups spent preparing their inputs (the first one builds the feature cache, which the others reuse) is not
    counted as the runs' time."""
    execution = execution or Execution()
    if progress and execution.executor == "local":
        configs = [dataclasses.replace(config, progress=True) for config in configs]
    specs = plan_sweep(configs, execution)
    records, todo = split_finished(specs)
    if on_result is not None:
        for record in records:
            if record is not None:
                on_result(record)
    if todo:
        groups = group_runs([specs[i] for i in todo], execution.runs_per_group(specs[todo[0]].device.type))
        position = {id(spec): i for i, spec in enumerate(specs)}
        executor = make_executor(execution.executor, **execution.options)
        if progress:
            say(f"{len(specs)} run(s): {len(specs) - len(todo)} finished, {len(todo)} to train in "
                f"{describe_groups(groups)} ({execution.executor})")
        done, inputs_seconds, clock = 0, 0.0, TimeLeft(len(todo))
        failed: list[FailedRun] = []
        try:
            with progress_bar(total=len(todo), desc="runs", unit="run", enabled=progress,
                              dynamic_ncols=True) as bar:
                # the executor yields (group index, records) as groups finish, in any order
                for g, group_records in executor.map(groups):
                    if isinstance(group_records, WorkerFailure):
                        raise RunFailed(f"a worker failed on {groups[g][0].name} (and {len(groups[g]) - 1} more "
                                        f"run(s) of its group): {group_records.message}")
                    if execution.executor == "local":
                        inputs_seconds += sum(float(r.get("timings", {}).get("inputs", 0.0)) for r in group_records
                                              if not isinstance(r, FailedRun))
                    for i, (spec, record) in enumerate(zip(groups[g], group_records), start=1):
                        bar.update(1)
                        done += 1
                        if isinstance(record, FailedRun):  # its group went on without it; named at the end
                            failed.append(record)
                            say(f"[{done}/{len(todo)}] {spec.name}: FAILED: {record.reason}")
                            continue
                        records[position[id(spec)]] = record
                        if progress:  # the group's last line says the time (its runs end together)
                            times = (f"; {clock.text(done, max(clock.elapsed() - inputs_seconds, 0.0))}"
                                     if i == len(group_records) else "")
                            say(f"[{done}/{len(todo)}] {spec.name}: {run_summary(record)}{times}")
                        if on_result is not None:
                            on_result(record)
        except KeyboardInterrupt:  # Ctrl-C: say what is done (a finished run's record is on disk) in one line
            raise Interrupted(f"{len(specs) - len(todo) + done - len(failed)} of {len(specs)} run(s) finished "
                              f"(their records are kept)") from None
        if failed:
            raise RunsFailed(failure_message(failed, len(specs)), failed,
                             [r if r is not None else None for r in records])
    missing = [specs[i].name for i, r in enumerate(records) if r is None]
    if missing:
        raise RuntimeError(f"{len(missing)} run(s) returned no record: {missing[:5]}")
    return records  # type: ignore[return-value]


def run_summary(record: dict[str, Any]) -> str:
    """``base 81.20  new 74.10  H 77.49  (12.3 s)``: a finished run's metrics in one line."""
    metrics = record["metrics"]
    names = [name for name in (*CLASS_SETS[:2], HARMONIC_MEAN) if name in metrics] or [
        n for n in metrics if not isinstance(metrics[n], dict)]  # not the zero-shot references nor calibration
    seconds = record.get("timings", {}).get("group_total")
    timing = f"  ({seconds:.1f} s for its group)" if isinstance(seconds, (int, float)) else ""
    return "  ".join(f"{name} {metrics[name]:.2f}" for name in names) + timing


def run_grid(base: TrainConfig, datasets: Sequence[str], variants: Sequence[LabelVariant], seeds: Sequence[int],
             on_result: Callable[[dict[str, Any]], None] | None = None, progress: bool = True,
             execution: Execution | None = None) -> list[dict[str, Any]]:
    """Train every (dataset, variant, seed) from ``base`` and return the records (finished runs are reused).

    ``on_result`` is called after each run (e.g. to print a line); inner progress bars follow ``base.progress``."""
    return run_configs(grid_configs(base, datasets, variants, seeds), execution, on_result, progress)
