"""The criterion a method's ``training_loss`` receives for one training step of R >= 1 runs: the label schedule's
loss of class logits, so every cross-entropy term of every method gets the epoch's targets (one-hot or soft) without
knowing the schedule. ``criterion(logits)`` is the loss of logits (R, B_max, C) (or (B, C), one run's) summed over
the runs; ``criterion.per_run(logits)`` each run's (R,) (0 for a run that sits the step out); ``observe=False`` for an
auxiliary head's logits (only class predictions may feed a schedule's statistics, OLS). ``sizes`` (host ints) and
``rows`` (the same, (R,) long on the device) are the runs' batch sizes B_r: rows past B_r are padding, which a
method's own terms leave out (:meth:`Criterion.padding_mask`) without uploading anything in a step.

:class:`ScheduleCriterion` is the engine's; :class:`LossCriterion` applies a given loss to each run's rows; a method
may replace it by its own (KDPL).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Sequence

import torch

from atlas_fast.atlas.schedules import LabelSchedule, runs_cross_entropy


def size_rows(sizes: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """``sizes`` as a (R,) long tensor on ``device``, made by fills (no copy from the host: nothing is uploaded,
    and a CUDA graph may capture it)."""
    rows = torch.zeros(len(sizes), dtype=torch.long, device=device)
    for r, size in enumerate(sizes):
        rows[r].fill_(size)  # not ``rows[r] = size``: that makes a tensor of the host's number
    return rows


class Criterion(ABC):
    """The loss of a method's logits for one step of R runs, and the runs' batch sizes (see the module's text)."""

    def __init__(self, sizes: Sequence[int], rows: torch.Tensor) -> None:
        #: Each run's batch size B_r this step (0: the run sits the step out); rows past B_r are padding.
        self.sizes: tuple[int, ...] = tuple(sizes)
        #: ``sizes`` on the device, (R,) long.
        self.rows = rows

    @property
    def runs(self) -> int:
        """R, the runs of the step."""
        return len(self.sizes)

    @abstractmethod
    def per_run(self, logits: torch.Tensor, observe: bool = True) -> torch.Tensor:
        """Each run's loss (R,) of logits (R, B_max, C) (or (B, C), one run's); 0 for a run that sits out."""

    def __call__(self, logits: torch.Tensor, observe: bool = True) -> torch.Tensor:
        """The loss of logits (R, B_max, C) (or (B, C)), summed over the runs in the step."""
        return self.per_run(logits, observe).sum()

    def padding_mask(self, width: int) -> torch.Tensor | None:
        """(R, width) bool, True on each run's own rows of a step ``width`` rows wide; None when every run's batch
        fills the width (no padding to leave out)."""
        if min(self.sizes) == width:
            return None
        return torch.arange(width, device=self.rows.device) < self.rows.unsqueeze(1)


def run_logits(logits: torch.Tensor) -> torch.Tensor:
    """Logits (B, C) of one run as (1, B, C); (R, B, C) as they are."""
    return logits if logits.dim() == 3 else logits.unsqueeze(0)


class ScheduleCriterion(Criterion):
    """The label schedules' loss of one training step (built by the engine's step): run r's schedule loss of its
    logits ``[r, :B_r]`` in ``epoch`` against its labels and soft rows (``targets``: ``(r, labels, soft rows)`` of
    each run in the step). Where every run has a full batch and a plain cross-entropy this epoch (``together``),
    the runs' losses are one pass (:func:`~atlas_fast.atlas.schedules.runs_cross_entropy`). :attr:`losses` keeps
    each run's loss of the last call (the class logits'), from which the engine reads each run's loss when a method
    returns their sum."""

    def __init__(self, schedules: Sequence[LabelSchedule], epoch: int, labels: torch.Tensor, targets: list,
                 sizes: Sequence[int], rows: torch.Tensor) -> None:
        super().__init__(sizes, rows)
        self.schedules, self.epoch, self.labels, self.targets = schedules, epoch, labels, targets
        self.kinds = [schedule.cross_entropy_kind(epoch) for schedule in schedules]
        count = len(schedules)
        self.together = (count > 1 and len(targets) == count and min(sizes) == max(sizes) and None not in self.kinds
                         and not any(schedule.observes_predictions for schedule in schedules)
                         and all(soft is not None for (_, _, soft), kind in zip(targets, self.kinds)
                                 if kind == "soft"))
        self.losses: dict[int, torch.Tensor] = {}

    def _losses(self, logits: torch.Tensor, observe: bool) -> torch.Tensor | None:
        """Fill :attr:`losses`; returns the one-pass vector (R,) when the runs go together, else None."""
        logits = run_logits(logits)
        if self.together:
            vector = runs_cross_entropy(self.kinds, logits, self.labels, [soft for _, _, soft in self.targets])
            self.losses.update(enumerate(vector.unbind()))
            return vector
        for r, batch_labels, soft in self.targets:
            own = logits[r, :self.sizes[r]]
            if observe:
                self.schedules[r].observe(own, batch_labels)
            self.losses[r] = self.schedules[r].loss(self.epoch, own.float(), batch_labels, soft)
        return None

    def per_run(self, logits: torch.Tensor, observe: bool = True) -> torch.Tensor:
        vector = self._losses(logits, observe)
        return vector if vector is not None else self.run_vector(logits)

    def __call__(self, logits: torch.Tensor, observe: bool = True) -> torch.Tensor:
        vector = self._losses(logits, observe)
        return vector.sum() if vector is not None else torch.stack(list(self.losses.values())).sum()

    def run_vector(self, like: torch.Tensor) -> torch.Tensor:
        """Each run's loss (R,) of the last call (0 for a run that sits the step out)."""
        count = self.runs
        if len(self.losses) == count:
            return torch.stack([self.losses[r] for r in range(count)])
        zero = like.new_zeros((), dtype=torch.float32)
        return torch.stack([self.losses.get(r, zero) for r in range(count)])


class LossCriterion(Criterion):
    """A given loss of each run's own rows: ``loss(logits_r, r)`` of run r's logits (B_r, C) (its first
    ``sizes[r]`` rows), each run's (R,) or their sum; a run of size 0 sits out (loss 0). ``observe`` is ignored (no
    schedule learns here). For a batch of one run, ``sizes`` is ``(B,)``; ``rows`` are made on ``device``."""

    def __init__(self, loss: Callable[[torch.Tensor, int], torch.Tensor], sizes: Sequence[int],
                 device: torch.device | str = "cpu") -> None:
        super().__init__(sizes, size_rows(sizes, device))
        self.loss = loss

    def per_run(self, logits: torch.Tensor, observe: bool = True) -> torch.Tensor:
        logits = run_logits(logits)
        zero = logits.new_zeros((), dtype=torch.float32)
        return torch.stack([self.loss(logits[r, :size], r) if size else zero for r, size in enumerate(self.sizes)])
