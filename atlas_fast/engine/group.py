"""A group: R >= 1 planned runs trained as one module. Which runs may share a module (:func:`group_key`, the one
rule), how many fit the device (:func:`group_size`), and the group itself (:class:`RunGroup`); docs/architecture.md.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from atlas_fast.atlas.schedules import LabelSchedule
from atlas_fast.engine.evaluate import SetScores, score_method
from atlas_fast.engine.feed import RunInputs, prepare_inputs
from atlas_fast.engine.graphs import use_graph_steps
from atlas_fast.engine.loop import Divergence, TrainingRuns, build_optimizer, train_runs
from atlas_fast.engine.optim import RunsOptimizer
from atlas_fast.engine.step import RunState
from atlas_fast.errors import user_errors
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import MethodConfig, OptimRecipe

#: The fields of a run's described configuration (:func:`~atlas_fast.engine.spec.describe_run`) in which the runs
#: of one group may differ: each run keeps its own data, data order, initialisation, targets, views and record.
PER_RUN_FIELDS = ("seed", "shots", "soft_labels", "schedule", "views", "aug_seed", "eval_every_epoch",
                  "snapshot_epochs", "fewshot_order")


def batches_runs(entry: type[PromptMethod], method_config: MethodConfig | None = None) -> bool:
    """Whether runs of method ``entry`` can train as one module (every learned tensor leads with R), with
    ``method_config`` where known (an option may rule it out, e.g. class-agnostic KDPL)."""
    return bool(entry.supports_batched_runs if method_config is None else entry.batches_runs(method_config))


def shared_settings(spec) -> dict[str, str]:
    """What every run of a group shares (as JSON): its described configuration but for :data:`PER_RUN_FIELDS`, its
    folders, its device."""
    shared = {k: v for k, v in spec.described.items() if k not in PER_RUN_FIELDS}
    shared.update({k: getattr(spec.config, k) for k in ("data_root", "cache_root", "results_dir")}, device=spec.device)
    return {k: json.dumps(v, sort_keys=True, default=str) for k, v in shared.items()}


def group_key(spec) -> str:
    """Runs with equal keys may train as one module."""
    return json.dumps(shared_settings(spec), sort_keys=True)


def check_group(specs: Sequence) -> None:
    """Refuse runs that cannot train as one module, naming the two runs and what differs."""
    first = specs[0]
    for spec in specs[1:]:
        mine, theirs = shared_settings(first), shared_settings(spec)
        if mine != theirs:
            differ = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
            raise ValueError(f"Runs {first.stem} and {spec.stem} cannot train as one group: they differ in "
                             f"{', '.join(differ)} (only {', '.join(PER_RUN_FIELDS)} may differ).")
        if spec.data.train_split.classnames != first.data.train_split.classnames:
            raise ValueError(f"The runs of a group must train on the same classes ({first.dataset}).")


def group_size(spec, batch_runs: int) -> int:
    """R for a group of runs like ``spec``: 1 where runs do not batch, else ``batch_runs`` lowered to what fits the
    device's memory (:mod:`atlas_fast.engine.memory`; unchanged where that device is not visible)."""
    from atlas_fast.engine import memory

    if not batches_runs(spec.method, spec.method_config):
        return 1
    total = memory.device_bytes(spec.device)
    if batch_runs == 1 or total is None:
        return batch_runs
    backbone = spec.backbone()
    per_run = memory.step_bytes_per_run(spec.method, backbone, spec.data.train_split.num_classes,
                                        spec.optim_recipe.batch_size, spec.amp)
    graphs = use_graph_steps([spec.config.graph_steps], spec.method, [spec.config.schedule], spec.device)
    fixed = memory.frozen_bytes(backbone, spec.amp)
    method_config = getattr(spec, "method_config", None)
    teacher = spec.method.view_teacher(method_config, backbone) if method_config is not None else None
    if teacher is not None:  # resident beside the student (PromptKD's text features of each class set)
        fixed += memory.frozen_bytes(teacher, spec.amp)
    return memory.runs_that_fit(batch_runs, per_run, fixed, total, graphs)


def group_runs(specs: Sequence, batch_runs: int) -> list[list]:
    """Split planned runs into the groups that train: runs that may share a module, at most :func:`group_size` a
    group, in the sweep's order."""
    by_key: dict[str, list] = {}
    for spec in specs:
        by_key.setdefault(group_key(spec), []).append(spec)
    groups = []
    for members in by_key.values():
        size = group_size(members[0], batch_runs)
        groups += [members[i:i + size] for i in range(0, len(members), size)]
    return groups


def prepare_group_inputs(specs: Sequence, backbone, failed: Callable[[int, BaseException], None],
                         evaluate_on: str = "test", skip: Callable[[int], bool] = lambda r: False
                         ) -> tuple[list[RunInputs | None], list[float]]:
    """Each run's inputs (:func:`~atlas_fast.engine.feed.prepare_inputs`; None where ``skip(r)`` says or its own
    inputs raised a user's error, handed to ``failed(r, exc)``) and its seconds; what runs share is read once."""
    read_once: dict = {}
    inputs: list[RunInputs | None] = []
    seconds: list[float] = []
    for r, spec in enumerate(specs):
        clock = time.perf_counter()
        prepared = None
        try:
            prepared = None if skip(r) else prepare_inputs(spec, backbone, read_once, evaluate_on=evaluate_on)
        except user_errors() as exc:
            failed(r, exc)
        inputs.append(prepared)
        seconds.append(round(time.perf_counter() - clock, 4))
    return inputs, seconds


def stack_runs(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Learned tensors of R single runs (leading dim 1) -> one state with leading dim R."""
    for name, tensor in states[0].items():
        if tensor.dim() == 0 or tensor.shape[0] != 1:
            raise ValueError(f"Learned tensor {name!r} of shape {tuple(tensor.shape)} has no leading runs dimension; "
                             f"this method cannot be batched.")
    return {name: torch.cat([state[name] for state in states]) for name in states[0]}


def stacked_method(entry: type[PromptMethod], backbone, classnames: Sequence[str], config: MethodConfig,
                   states: Sequence[dict[str, torch.Tensor]], device: torch.device | str | None = None
                   ) -> PromptMethod:
    """A module of method ``entry`` holding R = ``len(states)`` runs, run r's learned tensors ``states[r]`` (a
    one-run method's ``state_for_checkpoint()``), on ``device`` (None: where it is built)."""
    module = entry.build(backbone, classnames, config, runs=len(states))
    if device is not None:
        module = module.to(device)
    module.load_checkpoint_state(stack_runs(states))
    return module


@dataclass(frozen=True)
class ForkPlan:
    """Runs of a group that share their first epochs, trained once: ``trunk`` (one run per shared start), each
    run's trunk (``parents[r]``, a position in ``trunk``) and the last shared epoch (``after``)."""

    trunk: list[int]
    parents: list[int]
    after: int


def plan_fork(specs: Sequence, schedules: Sequence[LabelSchedule]) -> ForkPlan | None:
    """Where a group's runs share their first epochs (same seed, data and views, every schedule one-hot CE), or
    None. Only for pixel methods (a cached GPU step is launch-bound: no gain), not with per-epoch evaluations or
    snapshots."""
    first = specs[0]
    if (len(specs) < 2 or not first.method.reads_pixels
            or any(s.config.eval_every_epoch or s.config.snapshot_epochs for s in specs)):
        return None
    epochs = 0
    while epochs < first.optim_recipe.epochs and all(schedule.cross_entropy_kind(epochs) == "hard"
                                                     and not schedule.observes_predictions for schedule in schedules):
        epochs += 1
    keys = [(s.config.seed, tuple(d.impath for d in s.data.train_split.train), s.views, s.config.aug_seed)
            for s in specs]
    positions: dict[tuple, int] = {}
    parents = [positions.setdefault(key, len(positions)) for key in keys]
    if epochs == 0 or len(positions) == len(specs):
        return None
    return ForkPlan([keys.index(key) for key in positions], parents, epochs - 1)


class RunGroup(TrainingRuns):
    """R >= 1 planned runs (:func:`check_group`) and their inputs, trained as one module; each starts exactly as it
    would alone (``alone[r]``, built after seeding with its seed). ``method`` holds every run (a group of one trains
    ``alone[0]``); ``graph_steps``: whether its steps replay CUDA graphs."""

    def __init__(self, specs: Sequence, backbone, inputs: Sequence[RunInputs]) -> None:
        self.specs, self.backbone, self.inputs = list(specs), backbone, list(inputs)
        first = self.specs[0]
        self.recipe: OptimRecipe = first.optim_recipe
        self.classnames = first.data.train_split.classnames
        self.alone: list[PromptMethod] = []
        for spec in self.specs:
            torch.manual_seed(spec.config.seed)  # the method's random initialisation
            self.alone.append(spec.method.build(backbone, self.classnames, spec.method_config).to(spec.device))
        method = self.alone[0] if len(self.specs) == 1 else self.stacked(
            [single.state_for_checkpoint() for single in self.alone])
        states = [RunState(i.train_inputs, i.labels, i.soft_rows, dataclasses.replace(s.config.schedule),
                           s.config.seed, first.device) for s, i in zip(self.specs, self.inputs)]
        super().__init__(method, states)
        self.graph_steps = use_graph_steps([s.config.graph_steps for s in self.specs], first.method,
                                           [state.schedule for state in states], first.device)

    def stacked(self, states: Sequence[dict[str, torch.Tensor]]) -> PromptMethod:
        first = self.specs[0]
        return stacked_method(first.method, self.backbone, self.classnames, first.method_config, states, first.device)

    def position(self, run: int) -> int:
        """Where run ``run`` sits in the module training now."""
        return self.slots.index(run)

    def run_method(self, run: int) -> PromptMethod:
        """A one-run method holding run ``run``'s current learned tensors (the module itself for a group of one)."""
        single = self.alone[run]
        if self.method is single:
            return single
        at = self.position(run)
        single.load_checkpoint_state({name: tensor[at:at + 1]
                                      for name, tensor in self.method.state_for_checkpoint().items()})
        return single

    def fork_plan(self) -> ForkPlan | None:
        """Where this group's runs share their first epochs (:func:`plan_fork`)."""
        return plan_fork(self.specs, [run.schedule for run in self.runs])

    def train(self, progress: bool, fields: Callable[[int], list[dict[str, Any]]] | None = None,
              on_failure: Callable[[int, Divergence], None] | None = None,
              retire: Callable[[int, list[list[dict[str, Any]]]], Iterable[int]] | None = None,
              shrink: bool = False, fork: ForkPlan | None = None) -> list[list[dict[str, Any]]]:
        """Train the runs through the one loop (:func:`~atlas_fast.engine.loop.train_runs`); each run's epoch log.

        ``fields(epoch)``: each run's extra log fields. ``on_failure(run, divergence)``: a run that stops being
        finite is retired and reported (without it, the call stops). ``retire(epoch, logs)`` names runs to stop;
        with ``shrink`` the others go on in a smaller module. ``fork`` (not with ``retire``): the trunk runs train
        the shared epochs, then each is copied into its runs (tensors, optimiser, data order, schedule, logs)."""
        if fork is not None and retire is not None:
            raise ValueError("A group's fork and retired runs cannot be combined.")
        self.fields, self.on_failure, self.retire, self.shrink, self.fork = fields, on_failure, retire, shrink, fork
        self.forked_runs: list[RunState] = []
        self.failed_trunk: dict[int, Divergence] = {}  # trunk run -> where it diverged, before the fork
        if fork is not None:  # the trunk trains first: the group's runs join at the fork
            self.forked_runs = self.runs
            self.method = self.stacked([self.alone[i].state_for_checkpoint() for i in fork.trunk])
            self.runs = [self.forked_runs[i] for i in fork.trunk]
            self.logs = [[] for _ in fork.trunk]
            self.slots = list(range(len(fork.trunk)))
        return train_runs(self, self.recipe, self.specs[0].device, self.specs[0].amp, progress, self.graph_steps)

    def diverged(self, run: int, divergence: Divergence) -> bool:
        if self.on_failure is None:
            return False
        self.retired.add(run)
        if self.fork is not None:  # its runs are named at the fork
            self.failed_trunk[run] = divergence
        else:
            self.on_failure(run, divergence)
        return True

    def end_epoch(self, epoch: int, optimizer: RunsOptimizer, recipe: OptimRecipe, amp: bool
                  ) -> RunsOptimizer | None:
        carried = None
        if self.fork is not None and epoch == self.fork.after:  # the shared epochs are over
            fork = self.fork
            carried = self._keep_positions(fork.parents, optimizer, recipe, amp)
            for run, parent in zip(self.forked_runs, fork.parents):  # each starts where its trunk run is
                run.generator.set_state(self.runs[parent].generator.get_state())
                run.schedule.reset(len(self.method.classnames))
                for done in range(epoch + 1):
                    run.schedule.end_epoch(done)
            self.logs = [[dict(entry) for entry in self.logs[self.slots[parent]]] for parent in fork.parents]
            self.retired = self._fail_forked()
            self.runs, self.fork = self.forked_runs, None
            self.slots = list(range(len(self.runs)))
        if self.retire is not None:
            self.retired.update(self.retire(epoch, self.logs))
        if self.done:
            return carried
        keep = [p for p in range(len(self.runs)) if self.training(p)]
        if self.shrink and len(keep) < len(self.runs):
            carried = self._keep_positions(keep, carried or optimizer, recipe, amp)
            self.runs, self.slots = [self.runs[p] for p in keep], [self.slots[p] for p in keep]
        return carried

    def end_training(self) -> None:
        if self.fork is not None and self.failed_trunk:  # every trunk run diverged before the fork: so did its runs
            self._fail_forked()

    def _keep_positions(self, keep: list[int], optimizer: RunsOptimizer, recipe: OptimRecipe, amp: bool
                        ) -> RunsOptimizer:
        """Go on with a module of the runs at positions ``keep`` (a fork repeats them), their learned tensors,
        training state (``carry_runs``) and optimiser state carried over; returns the new optimiser."""
        module = self.method
        smaller = self.stacked([{name: tensor[k:k + 1] for name, tensor in module.state_for_checkpoint().items()}
                                for k in keep])
        smaller.carry_runs(module, keep)
        carried = build_optimizer(smaller, recipe, amp)
        carried.load_state_of_runs(optimizer.state_of_runs(keep))
        smaller.train()
        self.method = smaller
        return carried

    def _fail_forked(self) -> set[int]:
        """The forked runs whose trunk run diverged, each reported to ``on_failure``: retired from the fork on."""
        failed = {i for i, parent in enumerate(self.fork.parents) if parent in self.failed_trunk}
        for i in sorted(failed):  # (a trunk run is only ever failed with an on_failure)
            self.on_failure(i, self.failed_trunk[self.fork.parents[i]])
        self.failed_trunk.clear()
        return failed

    def scores(self, progress: bool, keep_logits: bool = False) -> tuple[dict[str, SetScores] | None, float]:
        """Every run's scores from one pass of the module over the sets the runs share, and each run's share of its
        seconds; (None, 0) for a group of one or runs on different sets (each is then evaluated alone)."""
        inputs = self.inputs
        first = [id(eval_set) for eval_set in inputs[0].eval_sets]
        if len(inputs) == 1 or any([id(eval_set) for eval_set in i.eval_sets] != first for i in inputs):
            return None, 0.0
        clock = time.perf_counter()
        scores = score_method(self.method, inputs[0].eval_sets, self.specs[0].amp, progress, calibrate=True,
                              keep_logits=keep_logits, held_out=[run_inputs.held_out for run_inputs in inputs])
        return scores, (time.perf_counter() - clock) / len(inputs)
