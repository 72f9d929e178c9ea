"""The training loop: Dassl's optimisation (``methods.md`` §1.4) over any :class:`~atlas_fast.inputs.TrainInputs`.

SGD (momentum 0.9, weight decay 5e-4 on the learned tensors) with a cosine learning rate stepped once per epoch after
a constant warmup epoch at 1e-5. Batches follow a permutation drawn from a ``torch.Generator`` seeded with the run's
seed, and the last partial batch is **kept** (a protocol decision; Dassl drops it). The method computes each batch's
loss (:meth:`~atlas_fast.methods.base.PromptMethod.training_loss`) with a criterion that applies the label schedule's
targets of the epoch (one-hot or soft), so ATLaS reaches every cross-entropy term a method has. On a GPU the forward
runs under fp16 autocast with a gradient scaler.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from atlas_fast.inputs import TrainInputs
from atlas_fast.methods.base import OptimRecipe, PromptMethod
from atlas_fast.schedules import LabelSchedule


def lr_at_epoch(recipe: OptimRecipe, epoch: int, lr_scale: float = 1.0) -> float:
    """Dassl's per-epoch lr (``methods.md`` §1.4): ``warmup_lr`` during the warmup epochs, then a cosine over
    ``recipe.epochs`` whose counter restarts after warmup: ``0.5 * lr * (1 + cos(pi * (e - W) / E))``.

    ``lr_scale`` multiplies the base lr of a parameter group (DePT's head: 6.5) but not the warmup lr: Dassl's
    constant warmup sets every group to ``warmup_lr`` (``methods.md`` §9.5)."""
    if not 0 <= epoch < recipe.epochs:
        raise ValueError(f"epoch must be in [0, {recipe.epochs}), got {epoch}.")
    if epoch < recipe.warmup_epochs:
        return recipe.warmup_lr
    return 0.5 * recipe.lr * lr_scale * (1.0 + math.cos(math.pi * (epoch - recipe.warmup_epochs) / recipe.epochs))


def build_optimizer(method: PromptMethod, recipe: OptimRecipe) -> torch.optim.SGD:
    """SGD over the method's parameter groups (a group may carry ``lr_scale``, e.g. DePT's head)."""
    groups = method.param_groups()
    for group in groups:
        group.setdefault("lr_scale", 1.0)
    return torch.optim.SGD(groups, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)


def set_epoch_lr(optimizer: torch.optim.Optimizer, recipe: OptimRecipe, epoch: int) -> float:
    """Give every parameter group the lr of ``epoch`` (times its ``lr_scale``); returns the unscaled lr."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at_epoch(recipe, epoch, group["lr_scale"])
    return lr_at_epoch(recipe, epoch)


def train_epochs(method: PromptMethod, train_inputs: TrainInputs, labels: torch.Tensor,
                 soft_rows: torch.Tensor | None, schedule: LabelSchedule, recipe: OptimRecipe, seed: int,
                 device: torch.device, amp: bool, progress: bool = True,
                 on_epoch_end: Callable[[int], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Train ``method`` in place. Returns one log row per epoch (mean loss, lr, soft-label flag, seconds, + the
    callback's fields)."""
    if method.num_runs != 1:
        raise NotImplementedError(f"train_epochs trains one run at a time (num_runs = 1), got {method.num_runs}.")
    if not method.learns:  # zero-shot CLIP: nothing to train
        method.eval()
        return []
    optimizer = build_optimizer(method, recipe)
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    generator = torch.Generator().manual_seed(seed)
    schedule.reset(len(method.classnames))
    labels = labels.to(device)
    soft_rows = soft_rows.to(device) if soft_rows is not None else None
    method.train()
    log = []
    bar = tqdm(range(recipe.epochs), desc=f"train {method.name}", disable=not progress, leave=False)
    for epoch in bar:
        start = time.perf_counter()
        lr = set_epoch_lr(optimizer, recipe, epoch)
        order = torch.randperm(len(labels), generator=generator)
        total = torch.zeros((), device=device)
        for inputs, index in train_inputs.batches(epoch, order, recipe.batch_size):
            index = index.to(device)
            batch_labels = labels[index]
            batch_soft = soft_rows[index] if soft_rows is not None else None

            def criterion(logits: torch.Tensor, observe: bool = True) -> torch.Tensor:
                """The schedule's loss of logits (B, C) (or (1, B, C)) against this batch's targets; ``observe``:
                these are the method's class predictions (OLS learns from them), not an auxiliary head's."""
                logits = logits[0] if logits.dim() == 3 else logits
                if observe:
                    schedule.observe(logits, batch_labels)
                return schedule.loss(epoch, logits.float(), batch_labels, batch_soft)

            with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp):
                loss = method.training_loss(inputs.to(device), batch_labels, criterion)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            total += loss.detach().float() * len(index)  # summed on the device: no host sync per step
        schedule.end_epoch(epoch)
        method.end_epoch(epoch, recipe.epochs)
        epoch_loss = total.item() / len(labels)
        if not math.isfinite(epoch_loss):
            raise FloatingPointError(f"Non-finite training loss in epoch {epoch} (lr {lr:.2e}); lower the lr "
                                     f"({recipe.lr}) or use precision='fp32'.")
        row = {"epoch": epoch, "lr": lr, "loss": epoch_loss, "soft": schedule.uses_soft_labels(epoch),
               "seconds": time.perf_counter() - start}
        if on_epoch_end is not None:
            row.update(on_epoch_end(epoch))
        bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{lr:.2e}")
        log.append(row)
    method.finish_training()
    method.eval()
    return log


class RunState:
    """One run of a batched group: its training data, labels, soft labels, label schedule and data-order generator."""

    def __init__(self, train_inputs: TrainInputs, labels: torch.Tensor, soft_rows: torch.Tensor | None,
                 schedule: LabelSchedule, seed: int, device: torch.device) -> None:
        self.train_inputs, self.schedule = train_inputs, schedule
        self.labels = labels.to(device)
        self.soft_rows = soft_rows.to(device) if soft_rows is not None else None
        self.generator = torch.Generator().manual_seed(seed)


def train_batched_epochs(method: PromptMethod, runs: list[RunState], recipe: OptimRecipe, device: torch.device,
                         amp: bool, progress: bool = True,
                         on_epoch_end: Callable[[int], list[dict[str, Any]]] | None = None) -> list[list[dict[str, Any]]]:
    """Train R = ``len(runs)`` runs held by one ``method`` (``num_runs == R``); returns each run's epoch log.

    Each step stacks every run's next batch (its own order, size and targets) into (R, B_max, ...) inputs, so the
    text encoder sees R x C prompts once; the loss is the sum of the runs' losses (each the mean over its own batch),
    so run r's tensors get exactly run r's gradient. A run whose epoch has fewer batches (a smaller few-shot set) sits
    out the last steps: its slice of every learned tensor and of the optimiser state is restored after the step, as
    if it had not stepped. This equals R separate :func:`train_epochs` up to float reordering, except that under AMP
    the group shares one gradient scaler (an fp16 overflow skips the step of every run in the group).
    """
    num_runs = len(runs)
    if method.num_runs != num_runs:
        raise ValueError(f"The method holds {method.num_runs} runs but {num_runs} run states were given.")
    optimizer = build_optimizer(method, recipe)
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    for run in runs:
        run.schedule.reset(len(method.classnames))
    method.train()
    logs: list[list[dict[str, Any]]] = [[] for _ in runs]
    bar = tqdm(range(recipe.epochs), desc=f"train {method.name} x{num_runs}", disable=not progress, leave=False)
    for epoch in bar:
        start = time.perf_counter()
        lr = set_epoch_lr(optimizer, recipe, epoch)
        streams = [run.train_inputs.batches(epoch, torch.randperm(len(run.labels), generator=run.generator),
                                            recipe.batch_size) for run in runs]
        totals = torch.zeros(num_runs, device=device)
        while True:
            batches = [next(stream, None) for stream in streams]
            active = [r for r, batch in enumerate(batches) if batch is not None]
            if not active:
                break
            sizes = [len(batches[r][1]) if batches[r] is not None else 0 for r in range(num_runs)]
            first = batches[active[0]][0]
            inputs = first.new_zeros((num_runs, max(sizes), *first.shape[1:]), device=device)
            labels = torch.zeros((num_runs, max(sizes)), dtype=torch.long, device=device)
            targets = []
            for r in active:
                batch_inputs, index = batches[r]
                index = index.to(device)
                inputs[r, :sizes[r]] = batch_inputs.to(device)
                labels[r, :sizes[r]] = runs[r].labels[index]
                soft = runs[r].soft_rows[index] if runs[r].soft_rows is not None else None
                targets.append((r, runs[r].labels[index], soft))
            losses: dict[int, torch.Tensor] = {}

            def criterion(logits: torch.Tensor, observe: bool = True) -> torch.Tensor:
                """Sum over the active runs of run r's schedule loss of its logits (R, B_max, C)[r, :B_r]."""
                for r, batch_labels, soft in targets:
                    if observe:
                        runs[r].schedule.observe(logits[r, :sizes[r]], batch_labels)
                    losses[r] = runs[r].schedule.loss(epoch, logits[r, :sizes[r]].float(), batch_labels, soft)
                return torch.stack(list(losses.values())).sum()

            with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp):
                loss = method.training_loss(inputs, labels, criterion)
            idle = [r for r in range(num_runs) if sizes[r] == 0]
            saved = _save_run_slices(optimizer, idle)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            _restore_run_slices(optimizer, idle, saved)
            for r, value in losses.items():
                totals[r] += value.detach().float() * sizes[r]
        for run in runs:
            run.schedule.end_epoch(epoch)
        method.end_epoch(epoch, recipe.epochs)
        epoch_losses = (totals.cpu() / torch.tensor([len(run.labels) for run in runs])).tolist()
        seconds = time.perf_counter() - start
        extra = on_epoch_end(epoch) if on_epoch_end is not None else [{} for _ in runs]
        for r, run in enumerate(runs):
            if not math.isfinite(epoch_losses[r]):
                raise FloatingPointError(f"Non-finite training loss in epoch {epoch} of run {r} (lr {lr:.2e}); "
                                         f"lower the lr ({recipe.lr}) or use precision='fp32'.")
            logs[r].append({"epoch": epoch, "lr": lr, "loss": epoch_losses[r],
                            "soft": run.schedule.uses_soft_labels(epoch), "seconds": seconds, **extra[r]})
        bar.set_postfix(loss=f"{sum(epoch_losses) / num_runs:.4f}", lr=f"{lr:.2e}")
    method.finish_training()
    method.eval()
    return logs


def _save_run_slices(optimizer: torch.optim.Optimizer, runs: list[int]) -> list[tuple[torch.Tensor, ...]]:
    """Copies of runs ``runs``' slices (leading dim) of every parameter and its optimiser state."""
    if not runs:
        return []
    saved = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            buffers = {k: v[runs].clone() for k, v in state.items() if torch.is_tensor(v) and v.shape == param.shape}
            saved.append((param, param.detach()[runs].clone(), buffers))
    return saved


def _restore_run_slices(optimizer: torch.optim.Optimizer, runs: list[int], saved) -> None:
    with torch.no_grad():
        for param, values, buffers in saved:
            param[runs] = values
            state = optimizer.state.get(param, {})
            for name, value in buffers.items():
                if name in state:
                    state[name][runs] = value
