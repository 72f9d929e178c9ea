"""One optimiser step's forward and backward, shared by the training loop (eager steps) and the CUDA-graph replay
(``graphs.py``, which captures exactly this function): the runs' state, the batch assembly for R >= 1 runs and the
loss with the label schedules' targets. The optimiser step itself stays in the loop."""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence

import torch

from atlas_fast.atlas.schedules import LabelSchedule, runs_cross_entropy
from atlas_fast.methods.base import PromptMethod


class TrainInputs(Protocol):
    """What the training loop reads: the inputs of each batch of one epoch, in a given item order."""

    def batches(self, epoch: int, order: torch.Tensor, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(inputs, index)`` per batch of ``order`` (a permutation of the training items; the last partial batch
        is kept); ``index`` (B,) selects the batch's labels and soft rows."""
        ...


class RunState:
    """One run of a group: its training inputs, labels, soft labels, label schedule and data-order generator."""

    def __init__(self, train_inputs: TrainInputs, labels: torch.Tensor, soft_rows: torch.Tensor | None,
                 schedule: LabelSchedule, seed: int, device: torch.device) -> None:
        self.train_inputs, self.schedule = train_inputs, schedule
        self.labels = labels.to(device)
        self.soft_rows = soft_rows.to(device) if soft_rows is not None else None
        self.generator = torch.Generator().manual_seed(seed)

    def targets(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The labels and soft rows of the items ``index``."""
        return self.labels[index], self.soft_rows[index] if self.soft_rows is not None else None


def step_batch(batches: list, runs: Sequence[RunState], device: torch.device):
    """One step's inputs, labels, per-run targets ``(r, labels, soft rows)`` and batch sizes from each run's next
    batch (None for a run whose epoch is over). One run's batch is passed as it comes; R > 1 are stacked into
    zero-padded (R, B_max, ...) inputs and (R, B_max) labels."""
    sizes = [len(batch[1]) if batch is not None else 0 for batch in batches]
    targets = []
    for r, batch in enumerate(batches):
        if batch is not None:
            targets.append((r, *runs[r].targets(batch[1].to(device))))
    if len(runs) == 1:
        return batches[0][0].to(device), targets[0][1], targets, sizes
    inputs = stack_runs_inputs([batch[0] if batch is not None else None for batch in batches], sizes, device)
    if min(sizes) == max(sizes):  # every run's batch full-size: one stack (the per-run copies are launches)
        return inputs, torch.stack([batch_labels for _, batch_labels, _ in targets]), targets, sizes
    labels = torch.zeros((len(runs), max(sizes)), dtype=torch.long, device=device)
    for r, batch_labels, _ in targets:
        labels[r, :sizes[r]] = batch_labels
    return inputs, labels, targets, sizes


def stack_runs_inputs(parts: list, sizes: list[int], device: torch.device):
    """Each run's inputs (B_r, ...) (None for a run that sits out) as zero-padded (R, B_max, ...), one stack when
    every run's batch is full-size; a tuple of tensors (a pixel batch with its frozen features) is stacked field
    by field."""
    first = next(part for part in parts if part is not None)
    if isinstance(first, tuple):
        fields = [stack_runs_inputs([part[i] if part is not None else None for part in parts], sizes, device)
                  for i in range(len(first))]
        return type(first)(*fields)
    if min(sizes) == max(sizes):
        return torch.stack([part if part.device == device else part.to(device) for part in parts])
    inputs = first.new_zeros((len(parts), max(sizes), *first.shape[1:]), device=device)
    for r, part in enumerate(parts):
        if part is not None:
            inputs[r, :sizes[r]] = part.to(device)
    return inputs


def forward_backward(method: PromptMethod, runs: Sequence[RunState], optimizer: torch.optim.Optimizer,
                     scaler: torch.amp.GradScaler, epoch: int, inputs, labels: torch.Tensor, targets: list,
                     sizes: list[int], device: torch.device, amp: bool, autocast_cache: bool = True
                     ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """One step's loss (and each run's loss) and its (scaled) gradients in the parameters' ``.grad``.

    The criterion is the sum over the runs in this step of run r's schedule loss of its logits
    (R, B_max, C)[r, :B_r] ((B, C) logits are one run's); ``observe``: these are the method's class predictions
    (OLS learns from them), not an auxiliary head's; ``per_run``: each run's loss (R,) instead of their sum (0 for a
    run that sits out the step). ``criterion.sizes`` are the runs' batch sizes B_r: rows past a run's size are
    padding, which a method's terms beyond the criterion must leave out. A method's ``training_loss`` returns the
    step's loss or, with terms beyond the criterion, each run's loss (R,) (their sum is backpropagated); each run's
    loss is the criterion's otherwise."""
    losses: dict[int, torch.Tensor] = {}
    # R runs, each with a full batch and a plain CE loss this epoch: their losses in one pass (runs_cross_entropy)
    kinds = [run.schedule.cross_entropy_kind(epoch) for run in runs]
    together = (len(runs) > 1 and len(targets) == len(runs) and min(sizes) == max(sizes) and None not in kinds
                and not any(run.schedule.observes_predictions for run in runs)
                and all(soft is not None for (_, _, soft), kind in zip(targets, kinds) if kind == "soft"))

    def criterion(logits: torch.Tensor, observe: bool = True, per_run: bool = False) -> torch.Tensor:
        logits = logits if logits.dim() == 3 else logits.unsqueeze(0)
        if together:
            vector = runs_cross_entropy(kinds, logits, labels, [soft for _, _, soft in targets])
            losses.update(enumerate(vector.unbind()))
            return vector if per_run else vector.sum()
        for r, batch_labels, soft in targets:
            run_logits = logits[r, :sizes[r]]
            if observe:
                runs[r].schedule.observe(run_logits, batch_labels)
            losses[r] = runs[r].schedule.loss(epoch, run_logits.float(), batch_labels, soft)
        if per_run:
            zero = logits.new_zeros((), dtype=torch.float32)
            return torch.stack([losses.get(r, zero) for r in range(logits.shape[0])])
        return torch.stack(list(losses.values())).sum()

    criterion.sizes = sizes  # type: ignore[attr-defined]
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp,
                        cache_enabled=autocast_cache):
        loss = method.training_loss(inputs, labels, criterion)
    if loss.dim() == 1:  # each run's loss: the method has terms beyond the criterion (PromptSRC, DePT)
        losses = {r: value for r, value in enumerate(loss.unbind()) if sizes[r]}
        loss = loss.sum()
    scaler.scale(loss).backward()
    return loss, losses
