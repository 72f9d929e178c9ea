"""Train a batch of trials on the validation split, with pruning.

Each trial is one run per (dataset, seed). Dataset by dataset, the live trials' runs are grouped as a sweep groups
them (:func:`~atlas_fast.engine.group.group_key`) and trained as a :class:`~atlas_fast.engine.group.RunGroup`; at
the epochs where the pruner can act, the group's ``retire`` hook reports each trial's validation objective (mean
over seeds) at step ``epochs of earlier datasets + epoch`` and retires pruned trials' runs; the survivors go on
as they would have without them. No test image is read and no record is written: a trial is not a result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from atlas_fast.engine.config import TrainConfig
from atlas_fast.engine.evaluate import evaluate_method, summarize
from atlas_fast.engine.feed import RunInputs
from atlas_fast.engine.group import RunGroup, batches_runs, check_group, group_key, prepare_group_inputs
from atlas_fast.engine.spec import RunSpec, plan_run
from atlas_fast.errors import UsageError


@dataclass
class Reporter:
    """How trials report: ``objective`` (a validation class set, or H), ``report(work, step, value)`` (records a
    trial's value at ``step``, says whether to stop it) and ``at(step)`` (whether the pruner can act at a step: the
    validation split is only evaluated there and after a dataset's last epoch)."""

    objective: str
    report: Callable[["TrialWork", int, float], bool]
    at: Callable[[int], bool] = lambda step: True


@dataclass
class TrialWork:
    """One trial in flight: its optuna trial, its configuration per dataset, what it reported, what it cost."""

    trial: Any  # optuna.trial.Trial
    configs: dict[str, list[TrainConfig]]  # dataset -> one config per seed
    reported: dict[int, float] = field(default_factory=dict)  # step -> value (restored for an adopted trial)
    finals: list[float] = field(default_factory=list)  # per dataset: the objective after its last epoch
    epochs: int = 0  # epochs trained, summed over the trial's runs
    offset: int = 0  # steps of the datasets already trained
    pruned: bool = False
    error: str | None = None

    @property
    def live(self) -> bool:
        return not self.pruned and self.error is None


def objective_value(metrics: dict[str, float], objective: str) -> float:
    """The objective from one run's accuracies on the validation class sets (H added when base and new are there)."""
    return summarize(metrics)[objective]


def check_validation(spec: RunSpec) -> None:
    """A search needs a validation split distinct from the test split for every evaluated class set."""
    data = spec.data
    if data.fewshot.val_is_test:
        raise UsageError(f"{data.dataset}: its validation list is its test list (as CoOp's ImageNet), so a search on "
                         f"it would select on test accuracy; search on another dataset.")
    for name, split in data.splits.items():
        if not split.val:
            raise UsageError(f"{data.dataset} ({data.dataset_dir}): no validation images for the {name!r} classes; "
                             f"a search selects on the validation split, so the dataset needs one.")


def train_batch(works: Sequence[TrialWork], datasets: Sequence[str], reporter: Reporter,
                listings: dict | None = None) -> None:
    """Train the trials of ``works`` dataset by dataset, reporting through ``reporter``; a trial's ``finals`` get its
    objective after each dataset's last epoch (mean over seeds; for a method that does not batch, of each run)."""
    listings = {} if listings is None else listings
    for dataset in datasets:
        live = [work for work in works if work.live]
        if not live:
            return
        specs = {id(work): [plan_run(config, listings=listings) for config in work.configs[dataset]]
                 for work in live}
        for work in live:
            for spec in specs[id(work)]:
                check_validation(spec)
        if batches_runs(specs[id(live[0])][0].method, specs[id(live[0])][0].method_config):
            groups: dict[str, list[TrialWork]] = {}
            for work in live:
                groups.setdefault(group_key(specs[id(work)][0]), []).append(work)
            for members in groups.values():
                _train_group(members, [specs[id(work)] for work in members], reporter)
            for work in live:
                work.offset += specs[id(work)][0].optim_recipe.epochs
            continue
        # a method that does not batch trains each run alone: its seeds follow one another like datasets
        for s in range(len(specs[id(live[0])])):
            for work in live:
                if work.live:
                    _train_group([work], [[specs[id(work)][s]]], reporter)
                    work.offset += specs[id(work)][s].optim_recipe.epochs


def _train_group(works: list[TrialWork], specs: list[list[RunSpec]], reporter: Reporter) -> None:
    """Train the runs of ``works`` as one group. A run that diverges or whose inputs raise fails its trial (why in
    ``error``) and retires the trial's other runs; the other trials train on exactly as they would without it.
    Pruned runs leave the module: the survivors go on in a smaller one."""
    flat = [spec for trial_specs in specs for spec in trial_specs]
    owner = [w for w, trial_specs in enumerate(specs) for _ in trial_specs]
    check_group(flat)
    backbone = flat[0].backbone()

    def unprepared(r: int, exc: BaseException) -> None:
        works[owner[r]].error = works[owner[r]].error or f"{flat[r].name}: {type(exc).__name__}: {exc}"

    prepared, _ = prepare_group_inputs(flat, backbone, unprepared, evaluate_on="val",
                                       skip=lambda r: not works[owner[r]].live)
    kept = [r for r in range(len(flat)) if works[owner[r]].live]
    if not kept:
        return
    flat, owner = [flat[r] for r in kept], [owner[r] for r in kept]
    inputs: list[RunInputs] = [prepared[r] for r in kept]  # type: ignore[misc]
    group = RunGroup(flat, backbone, inputs)
    first = flat[0]
    retired: set[int] = set()
    last = first.optim_recipe.epochs - 1
    step_of = works[0].offset  # the runs of a group share their recipe and the trials their earlier datasets

    def on_failure(r: int, divergence) -> None:
        retired.add(r)
        if works[owner[r]].error is None:
            works[owner[r]].error = f"{flat[r].name}: {divergence.describe(first.optim_recipe)}"

    def retire_runs(epoch: int, logs) -> set[int]:
        failed = {r for r in range(len(flat)) if r not in retired and not works[owner[r]].live and
                  not works[owner[r]].pruned}  # the other runs of a trial whose run diverged
        retired.update(failed)
        live_runs = [r for r in range(len(flat)) if r not in retired]
        for r in live_runs:
            works[owner[r]].epochs += 1  # counted before the pruner is asked: a pruned trial's cost
        if epoch != last and not reporter.at(step_of + epoch) or not live_runs:
            return failed
        values = _validation_objectives(group, inputs, live_runs, first.amp, reporter.objective)
        stop = set()
        for w, work in enumerate(works):
            runs = [r for r in live_runs if owner[r] == w]
            if not runs:
                continue
            value = sum(values[r] for r in runs) / len(runs)
            if reporter.report(work, work.offset + epoch, value):
                work.pruned = True
                stop.update(runs)
            elif epoch == last:
                work.finals.append(value)
        retired.update(stop)
        return stop | failed

    group.train(any(s.config.progress for s in flat), on_failure=on_failure, retire=retire_runs, shrink=True)


def _validation_objectives(group: RunGroup, inputs: list[RunInputs], runs: list[int], amp: bool,
                           objective: str) -> dict[int, float]:
    """Each live run's objective on its validation sets, from the module the group trains now: one evaluation per
    distinct set list (runs of one seed share theirs)."""
    by_sets: dict[tuple[int, ...], list[int]] = {}
    for r in runs:
        by_sets.setdefault(tuple(id(s) for s in inputs[r].eval_sets), []).append(r)
    values = {}
    for members in by_sets.values():
        accuracies = evaluate_method(group.method, inputs[members[0]].eval_sets, amp)
        for r in members:
            values[r] = objective_value({name: per_run[group.position(r)] for name, per_run in accuracies.items()},
                                        objective)
    return values


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
