"""The training loop, the only one: R >= 1 runs held by one method, Dassl's optimisation over any
:class:`~atlas_fast.engine.step.TrainInputs` (docs/protocol.md, "Optimisation").

Each run's batches follow a permutation from a ``torch.Generator`` seeded with its seed; the last partial batch is
**kept** (Dassl drops it). Each batch's loss gets a criterion with the epoch's label-schedule targets, so ATLaS
reaches every cross-entropy term. On a GPU the forward runs under fp16 autocast with a gradient scaler per run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from atlas_fast.clip.text_encoder import graph_length_groups
from atlas_fast.engine.graphs import StepGraphs, graphs_available
from atlas_fast.engine.optim import RunsAdam, RunsOptimizer, RunsSGD
from atlas_fast.engine.step import RunState, TrainStep, batches_for
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import OptimRecipe
from atlas_fast.progress import ProgressLines, progress_bar

#: where no bar can redraw (a log, a notebook's captured output, the README's Python loop), a line about the epochs at
#: most this often, so a long run is not silent
EPOCH_LINE_SECONDS = 10.0


def lr_at_epoch(recipe: OptimRecipe, epoch: int, lr_scale: float = 1.0) -> float:
    """Dassl's per-epoch lr (docs/protocol.md): ``warmup_lr`` during the warmup epochs, then a cosine over
    ``recipe.epochs`` whose counter restarts after warmup: ``0.5 * lr * (1 + cos(pi * (e - W) / E))``.

    ``lr_scale`` multiplies the base lr of a parameter group (DePT's head: 6.5) but not the warmup lr: Dassl's
    constant warmup sets every group to ``warmup_lr`` (docs/method-zoo.md, section DePT)."""
    if not 0 <= epoch < recipe.epochs:
        raise ValueError(f"epoch must be in [0, {recipe.epochs}), got {epoch}.")
    if epoch < recipe.warmup_epochs:
        return recipe.warmup_lr
    return 0.5 * recipe.lr * lr_scale * (1.0 + math.cos(math.pi * (epoch - recipe.warmup_epochs) / recipe.epochs))


def build_optimizer(method: PromptMethod, recipe: OptimRecipe, amp: bool = False) -> RunsOptimizer:
    """The recipe's optimiser over the method's parameter groups (a group may carry ``lr_scale``, e.g. DePT's head),
    one optimiser state and, under ``amp``, one gradient scaler per run, all on the device: Dassl's SGD
    (:class:`~atlas_fast.engine.optim.RunsSGD`), Dassl's Adam (L2 weight decay added to the gradient) or AdamW
    (decoupled decay) (:class:`~atlas_fast.engine.optim.RunsAdam`). Never torch's fused SGD: under a gradient scaler
    its kernel left the momentum buffer uninitialised on a step skipped for an fp16 overflow (seen with torch 2.11 on
    an H100 and 2.14 on the CPU), and the next step wrote that garbage into the prompts; a skipped run's tensors and
    buffers stay exactly as they were here."""
    if recipe.optimizer in ("adam", "adamw"):
        return RunsAdam(method.param_groups(), method.num_runs, recipe.betas, recipe.weight_decay, amp,
                        decoupled=recipe.optimizer == "adamw")
    return RunsSGD(method.param_groups(), method.num_runs, recipe.momentum, recipe.weight_decay, amp)


def set_epoch_lr(optimizer: RunsOptimizer, recipe: OptimRecipe, epoch: int) -> float:
    """Give every parameter group the lr of ``epoch`` (times its ``lr_scale``); returns the unscaled lr."""
    optimizer.set_lrs([lr_at_epoch(recipe, epoch, group["lr_scale"]) for group in optimizer.groups])
    return lr_at_epoch(recipe, epoch)


def set_step_lr(optimizer: RunsOptimizer, recipe: OptimRecipe, step: int) -> float:
    """A schedule over iterations: every group gets the lr of 0-based optimiser step ``step`` (times its
    ``lr_scale``), written into the optimiser's device scalars (a fill, no host read: a replayed step reads it);
    returns the unscaled lr."""
    lr = recipe.lr_at_step(step)
    optimizer.set_lrs([lr * group["lr_scale"] for group in optimizer.groups])
    return lr


@dataclass(frozen=True)
class Divergence:
    """Where a run stopped being finite: the epoch whose end found its loss or learned tensors not finite, the
    optimiser steps the group had taken by then, that epoch's lr and the run's last finite epoch loss (None when its
    first epoch diverged). The loop reads losses back once per epoch, so the epoch is known, not the step within it."""

    epoch: int
    step: int
    lr: float
    last_loss: float | None

    def describe(self, recipe: OptimRecipe, who: str = "") -> str:
        """``Training diverged in epoch 1 (step 8, lr 5.00e-02; last finite loss 1.2345)``, and what to change;
        ``who`` follows the epoch (e.g. `` of run [1]``)."""
        last = f"last finite loss {self.last_loss:.6g}" if self.last_loss is not None else "no finite epoch before"
        return (f"Training diverged in epoch {self.epoch}{who} (step {self.step}, lr {self.lr:.2e}; {last}): the loss "
                f"or the learned tensors are no longer finite; lower the lr ({recipe.lr}) or use precision='fp32'")


class TrainingRuns:
    """The runs one call of :func:`train_runs` trains: ``method`` holds R = ``len(runs)`` runs, position p being
    run ``slots[p]`` (an index into ``logs``, each run's epoch log); ``fields(epoch)`` (optional) adds fields to each
    run's log entry (e.g. a per-epoch evaluation). Here a run that stops being finite stops the call; a group
    (:class:`~atlas_fast.engine.group.RunGroup`) overrides :meth:`diverged` and :meth:`end_epoch` to retire, keep or
    fork runs between epochs."""

    def __init__(self, method: PromptMethod, runs: Sequence[RunState],
                 fields: Callable[[int], list[dict[str, Any]]] | None = None) -> None:
        self.method = method
        self.runs = list(runs)
        self.fields = fields
        self.logs: list[list[dict[str, Any]]] = [[] for _ in self.runs]
        self.slots = list(range(len(self.runs)))
        self.retired: set[int] = set()  # runs (indices into ``logs``) that sit out every later step

    def training(self, position: int) -> bool:
        """Whether the run at ``position`` of the module still trains."""
        return self.slots[position] not in self.retired

    @property
    def done(self) -> bool:
        """Every run retired: the loop ends."""
        return len(self.retired) == len(self.logs)

    def check_finite(self, where: Divergence, losses: list[float], recipe: OptimRecipe) -> None:
        """Hand each training run whose epoch loss or learned tensors are not finite to :meth:`diverged` (``where``:
        the epoch, step and lr); stop the call where that does not retire it."""
        for p in _not_finite(self.method, losses, [not self.training(p) for p in range(len(self.runs))]):
            log = self.logs[self.slots[p]]
            divergence = dataclasses.replace(where, last_loss=log[-1]["loss"] if log else None)
            if not self.diverged(self.slots[p], divergence):
                who = f" of run [{p}]" if self.method.num_runs > 1 else ""  # a caller without names: its position
                raise FloatingPointError(divergence.describe(recipe, who) + ". No record is written.")

    def log_epoch(self, epoch: int, lr: float, losses: list[float], seconds: float, graphed: dict[str, Any]) -> None:
        """Each training run's log entry of ``epoch`` (with :attr:`fields`' and the step graphs' fields)."""
        extra = self.fields(epoch) if self.fields is not None else [{} for _ in self.logs]
        for p, run in enumerate(self.runs):
            if self.training(p):
                self.logs[self.slots[p]].append({"epoch": epoch, "lr": lr, "loss": losses[p],
                                                 "soft": run.schedule.uses_soft_labels(epoch), "seconds": seconds,
                                                 **extra[self.slots[p]], **graphed})

    def diverged(self, run: int, divergence: Divergence) -> bool:
        """Run ``run`` stopped being finite: True where it is retired and the others go on, False (here) where the
        loop stops (:class:`FloatingPointError`: no record may describe such a run)."""
        return False

    def end_epoch(self, epoch: int, optimizer: RunsOptimizer, recipe: OptimRecipe, amp: bool
                  ) -> RunsOptimizer | None:
        """After epoch ``epoch``'s log: None where the module trains on, else the optimiser of the new module that
        replaced ``method``, ``runs`` and ``slots``."""
        return None

    def end_training(self) -> None:
        """After the last epoch, before the method finishes its training."""


def train_runs(runs: TrainingRuns, recipe: OptimRecipe, device: torch.device, amp: bool, progress: bool = True,
               graph_steps: bool = False) -> list[list[dict[str, Any]]]:
    """Train the R runs held by ``runs.method`` (``method.num_runs == R``) in place; returns each run's epoch log
    (mean loss, lr, soft-label flag, seconds, + ``runs.fields``' fields for that run).

    Each step stacks every run's next batch into (R, B_max, ...) inputs and differentiates the sum of the runs'
    losses, so run r's tensors get exactly run r's gradient; each run has its own optimiser state and scaler (an
    fp16 overflow skips only its own step). A run
    with fewer batches, or retired, sits steps out untouched. A run that stops being finite is found at its epoch's
    end and handed to ``runs.diverged`` (not retired there: :class:`FloatingPointError`); ``runs.end_epoch`` may
    retire runs or hand over a new module. Losses are read back once per epoch. ``graph_steps`` (CUDA): full-size
    steps replay a CUDA graph (:class:`~atlas_fast.engine.graphs.StepGraphs`; ``graphed_steps``, ``eager_steps``,
    ``graph_fallback`` in the log). A recipe with ``iterations`` stops after the last one, inside an epoch if it must
    (its loss: the mean over the items reached); its runs train together only on training sets of one size.
    """
    method = runs.method
    if method.num_runs != len(runs.runs):
        raise ValueError(f"The method holds {method.num_runs} runs but {len(runs.runs)} run states were given.")
    if not method.learns:  # zero-shot CLIP: nothing to train
        method.eval()
        return [[] for _ in runs.logs]
    if graph_steps and not graphs_available(device):
        raise ValueError(f"graph_steps replays CUDA graphs and needs a CUDA device, not {device.type}.")
    if recipe.iterations is not None and len({len(run.labels) for run in runs.runs}) > 1:
        raise ValueError(f"{method.name}: a schedule over iterations counts the group's steps, so its runs train "
                         f"together only on training sets of one size, not {sorted(len(r.labels) for r in runs.runs)}.")
    optimizer = build_optimizer(method, recipe, amp)
    step, batches, graphs = _stepper(method, runs.runs, optimizer, recipe, device, amp, graph_steps)
    for run in runs.runs:
        run.schedule.reset(len(method.classnames))
    method.train()
    name = method.name + (f" x{len(runs.runs)}" if len(runs.runs) > 1 else "")
    bar = progress_bar(range(recipe.epochs), desc=f"train {name}", enabled=progress, leave=False)
    lines = ProgressLines(recipe.epochs, f"train {name}", "epoch", enabled=progress, every=EPOCH_LINE_SECONDS)
    steps = 0  # optimiser steps so far (a schedule over iterations sets the lr of each and stops after the last)
    fallback: str | None = None  # why the step graphs fell back to eager steps (StepGraphs.fallback)
    for epoch in bar:
        start = time.perf_counter()
        lr = set_epoch_lr(optimizer, recipe, epoch) if recipe.iterations is None else recipe.lr_at_step(steps)
        if graphs is not None:
            graphs.start_epoch()
        orders = [torch.randperm(len(run.labels), generator=run.generator) if runs.training(p) else None
                  for p, run in enumerate(runs.runs)]
        step.totals.zero_()
        seen = [0] * len(runs.runs)  # items each run reached in the epoch
        epoch_steps = 0
        with _graphed_text(graphs is not None):
            for batch in batches.epoch(epoch, orders):
                if recipe.iterations is not None:
                    if steps == recipe.iterations:
                        break
                    set_step_lr(optimizer, recipe, steps)
                steps += 1
                epoch_steps += 1
                seen = [count + size for count, size in zip(seen, batch.sizes)]
                key = graphs.key(epoch, batch.sizes) if graphs is not None else None
                if key is None:
                    step(epoch, *batch.tensors(), batch.sizes)
                else:
                    graphs.step(key, epoch, batch)
        for run in runs.runs:
            run.schedule.end_epoch(epoch)
        method.end_epoch(epoch, recipe.epochs)
        epoch_losses = [total / (count or len(run.labels))
                        for total, count, run in zip(step.totals.tolist(), seen, runs.runs)]
        runs.check_finite(Divergence(epoch, steps, lr, None), epoch_losses, recipe)
        seconds = time.perf_counter() - start
        graphed = _graph_log(graphs, graph_steps, epoch_steps, fallback)  # before the fields
        fallback = fallback or (graphs.fallback if graphs is not None else None)
        runs.log_epoch(epoch, lr, epoch_losses, seconds, graphed)
        finite = [loss for p, loss in enumerate(epoch_losses) if runs.training(p)]
        bar.set_postfix(loss=f"{sum(finite) / max(len(finite), 1):.4f}", lr=f"{lr:.2e}")
        lines.update(1)
        if recipe.iterations is not None and steps >= recipe.iterations:
            break
        carried = runs.end_epoch(epoch, optimizer, recipe, amp)
        if runs.done:
            break
        if carried is not None:  # a new module: its runs' steps from here
            method, optimizer = runs.method, carried
            step, batches, graphs = _stepper(method, runs.runs, optimizer, recipe, device, amp,
                                             graph_steps and fallback is None)
    runs.end_training()
    runs.method.finish_training()
    runs.method.eval()
    return runs.logs


def _stepper(method: PromptMethod, runs: Sequence[RunState], optimizer: RunsOptimizer, recipe: OptimRecipe,
             device: torch.device, amp: bool, graph_steps: bool):
    """The step, the batches and (``graph_steps``) the step graphs of ``runs``."""
    step = TrainStep(method, runs, optimizer, device, amp)
    batches = batches_for(runs, recipe.batch_size, device)
    graphs = StepGraphs(step, batches, recipe.batch_size) if graph_steps else None
    return step, batches, graphs


def _graph_log(graphs: StepGraphs | None, graph_steps: bool, epoch_steps: int, fallback: str | None
               ) -> dict[str, Any]:
    """An epoch log's graph fields (none without ``graph_steps``): ``graphed_steps`` (replayed) and
    ``eager_steps`` (warm-ups, partial batches, steps after a fallback), and ``graph_fallback`` (why the graphs
    fell back to eager steps) in the epoch where that happened."""
    if not graph_steps:
        return {}
    replayed = graphs.end_epoch() if graphs is not None else 0
    log: dict[str, Any] = {"graphed_steps": replayed, "eager_steps": epoch_steps - replayed}
    if graphs is not None and graphs.fallback is not None and fallback is None:
        log["graph_fallback"] = graphs.fallback
    return log


def _graphed_text(graphed: bool):
    """While the steps of a run are graphed (replayed or warming up), class suffixes run in length groups sized
    for a captured graph, where extra kernels cost no launches (``text_encoder.GRAPHED_GROUP_COST``); every step of
    the run, eager ones included, uses them, so a replay computes what the eager step computes."""
    return graph_length_groups() if graphed else contextlib.nullcontext()


def _not_finite(method: PromptMethod, epoch_losses: list[float], retired: list[bool]) -> list[int]:
    """The positions of the module's runs (not already retired) whose epoch loss or any learned tensor is not finite
    (one host sync per epoch)."""
    bad = {r for r, value in enumerate(epoch_losses) if not math.isfinite(value)}
    with torch.no_grad():
        for param in method.trainable_parameters():
            if method.num_runs == 1:
                finite = torch.isfinite(param).all().reshape(1)
            else:
                finite = torch.isfinite(param).reshape(method.num_runs, -1).all(dim=1)
            bad.update(int(r) for r in (~finite).nonzero().flatten().tolist())
    return sorted(r for r in bad if not retired[r])
