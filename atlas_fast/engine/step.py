"""One optimiser step of R >= 1 runs, whole: batch, loss with the schedules' targets, backward, every run's update
(fp16 overflows per run) and the epoch's per-run loss sums, all device work that reads nothing back to the host.
``loop.py`` runs a :class:`TrainStep` eagerly; ``graphs.py`` captures the very same call and replays it.

Batches: :class:`GatheredBatches` gathers rows of the cached views already on the device (each epoch's order
uploaded once; replayed steps read a device step counter); :class:`StreamedBatches` stacks any
:class:`TrainInputs`' next batches (pixels from a loader), which a graphed step copies into its input buffers.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, NamedTuple, Protocol, Sequence

import torch
from atlas_fast.atlas.criterion import ScheduleCriterion, size_rows
from atlas_fast.atlas.schedules import LabelSchedule
from atlas_fast.engine.optim import RunsOptimizer
from atlas_fast.methods.base import PromptMethod


class TrainInputs(Protocol):
    """What the training loop reads: the inputs of each batch of one epoch, in a given item order. Inputs whose
    items are rows of one tensor on the training device may also offer ``device_rows() -> (rows, V)``: the (N x V,
    ...) rows, item n's input in epoch e being row ``n * V + e % V`` (or None when they are not there)."""

    def batches(self, epoch: int, order: torch.Tensor, batch_size: int) -> Iterator[tuple[Any, torch.Tensor]]:
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


class StepBatch(NamedTuple):
    """One step of the group: its position in the epoch, each run's batch size (0: the run sits the step out) and
    ``tensors()``, the step's ``(inputs, labels, targets)`` (see :func:`stack_batches`)."""

    index: int
    sizes: list[int]
    tensors: Callable[[], tuple[Any, torch.Tensor, list]]


def stack_batches(batches: list, runs: Sequence[RunState], device: torch.device):
    """One step's inputs, labels and per-run targets ``(r, labels, soft rows)`` from each run's next batch (None for
    a run that sits the step out). One run's batch is passed as it comes; R > 1 are stacked into zero-padded
    (R, B_max, ...) inputs and (R, B_max) labels."""
    sizes = [len(batch[1]) if batch is not None else 0 for batch in batches]
    targets = []
    for r, batch in enumerate(batches):
        if batch is not None:
            targets.append((r, *runs[r].targets(batch[1].to(device))))
    if len(runs) == 1:
        return batches[0][0].to(device), targets[0][1], targets
    inputs = stack_runs_inputs([batch[0] if batch is not None else None for batch in batches], sizes, device)
    if min(sizes) == max(sizes):  # every run's batch full-size: one stack (the per-run copies are launches)
        return inputs, torch.stack([batch_labels for _, batch_labels, _ in targets]), targets
    labels = torch.zeros((len(runs), max(sizes)), dtype=torch.long, device=device)
    for r, batch_labels, _ in targets:
        labels[r, :sizes[r]] = batch_labels
    return inputs, labels, targets


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


class StreamedBatches:
    """Each run's batches from its :class:`TrainInputs`, a step at a time, stacked (:func:`stack_batches`)."""

    gathers_on_device = False

    def __init__(self, runs: Sequence[RunState], batch_size: int, device: torch.device) -> None:
        self.runs, self.batch_size, self.device = runs, batch_size, device

    def epoch(self, epoch: int, orders: list[torch.Tensor | None]) -> Iterator[StepBatch]:
        streams = [run.train_inputs.batches(epoch, order, self.batch_size) if order is not None else iter(())
                   for run, order in zip(self.runs, orders)]
        index = 0
        while True:
            batches = [next(stream, None) for stream in streams]
            if all(batch is None for batch in batches):
                return
            sizes = [len(batch[1]) if batch is not None else 0 for batch in batches]
            tensors = stack_batches(batches, self.runs, self.device)
            yield StepBatch(index, sizes, lambda tensors=tensors: tensors)
            index += 1


class GatheredBatches:
    """Batches gathered on the device from every run's rows there (``device_rows``): the data order of an epoch
    is copied to the device once (``items``, (R, N_max)), and step s of every run reads positions ``s * B ..``
    of it; its rows, labels and soft rows are gathered by index on the device. A replayed step reads s from
    :attr:`counter`, a device scalar the captured step advances itself."""

    gathers_on_device = True

    def __init__(self, runs: Sequence[RunState], batch_size: int, device: torch.device,
                 sources: list[tuple[torch.Tensor, int]]) -> None:
        self.runs, self.batch_size, self.device = runs, batch_size, device
        self.counts = [len(run.labels) for run in runs]
        width = max(self.counts)
        self.sources = sources
        self.items = torch.zeros(len(runs), width, dtype=torch.long, device=device)
        self.labels = torch.zeros(len(runs), width, dtype=torch.long, device=device)
        for r, run in enumerate(runs):
            self.labels[r, :self.counts[r]] = run.labels
        self.views = torch.zeros(len(runs), dtype=torch.long, device=device)  # the epoch's view of each run
        self.counter = torch.zeros((), dtype=torch.long, device=device)
        self.counter_at: int | None = None  # what the host knows the counter holds
        self.positions = torch.arange(batch_size, device=device)
        self.active: list[bool] = [True] * len(runs)

    def epoch(self, epoch: int, orders: list[torch.Tensor | None]) -> Iterator[StepBatch]:
        order = torch.zeros(self.items.shape, dtype=torch.long)
        for r, run_order in enumerate(orders):
            if run_order is not None:
                order[r, :len(run_order)] = run_order
        if self.device.type == "cuda":
            order = order.pin_memory()
        self.items.copy_(order, non_blocking=True)  # one copy per epoch
        for r, (_, views) in enumerate(self.sources):
            self.views[r] = epoch % views
        self.active = [order is not None for order in orders]
        batch = self.batch_size
        steps = max((-(-n // batch) for n, on in zip(self.counts, self.active) if on), default=0)
        for s in range(steps):
            sizes = [max(0, min(batch, n - s * batch)) if on else 0 for n, on in zip(self.counts, self.active)]
            yield StepBatch(s, sizes, lambda s=s, sizes=sizes: self.gather(s * self.batch_size, sizes))

    def gather(self, start: int | torch.Tensor, sizes: list[int]):
        """The step's ``(inputs, labels, targets)`` at epoch position ``start`` (a host int, or the step counter's
        ``counter * B`` on the device while capturing)."""
        if isinstance(start, int):
            items = self.items[:, start:start + max(sizes)]
        else:
            items = self.items.index_select(1, start + self.positions)
        labels = self.labels.gather(1, items)
        rows, targets = [], []
        for r, (run, (source, views)) in enumerate(zip(self.runs, self.sources)):
            rows.append(source.index_select(0, items[r] * views + self.views[r]))
            if sizes[r]:
                run_items = items[r, :sizes[r]]
                soft = run.soft_rows.index_select(0, run_items) if run.soft_rows is not None else None
                targets.append((r, labels[r, :sizes[r]], soft))
        if len(self.runs) == 1:
            return rows[0][:sizes[0]], labels[0, :sizes[0]], targets
        return torch.stack(rows), labels, targets

    def graph_tensors(self, sizes: list[int]):
        """The step's tensors as a captured step reads them: at the device's step counter."""
        return self.gather(self.counter * self.batch_size, sizes)

    def advance(self) -> None:
        """Move the device's step counter on (recorded into a captured step)."""
        self.counter += 1

    def place_counter(self, index: int) -> None:
        """Make the device's step counter hold ``index`` before a replay (a launch only when it does not)."""
        if self.counter_at != index:
            self.counter.fill_(index)
        self.counter_at = index + 1


def same_device(where: torch.device, device: torch.device) -> bool:
    """Whether a tensor on ``where`` is on ``device`` (``cuda`` is the current CUDA device, e.g. ``cuda:0``)."""
    if where.type != device.type:
        return False
    if where.type != "cuda":
        return True
    index = [d.index if d.index is not None else torch.cuda.current_device() for d in (where, device)]
    return index[0] == index[1]


def batches_for(runs: Sequence[RunState], batch_size: int, device: torch.device
                ) -> GatheredBatches | StreamedBatches:
    """:class:`GatheredBatches` when every run's inputs are rows on ``device``, else :class:`StreamedBatches`."""
    sources = []
    for run in runs:
        rows = getattr(run.train_inputs, "device_rows", lambda: None)()
        if rows is None or not same_device(rows[0].device, torch.device(device)):
            return StreamedBatches(runs, batch_size, device)
        sources.append(rows)
    return GatheredBatches(runs, batch_size, device, sources)


class TrainStep:
    """One whole step of the R runs held by ``method``: the forward under fp16 autocast (``amp``), the loss of each
    run, the backward of ``sum_r scale_r loss_r``, the update (``optimizer``) of the runs that take part, and the
    epoch's per-run loss sums (:attr:`totals`, ``loss_r x B_r``), all on the device."""

    def __init__(self, method: PromptMethod, runs: Sequence[RunState], optimizer: RunsOptimizer, device: torch.device,
                 amp: bool) -> None:
        self.method, self.runs, self.optimizer, self.device, self.amp = method, runs, optimizer, device, amp
        self.totals = torch.zeros(len(runs), device=device)
        self._weights: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = {}

    def weights(self, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(the runs' batch sizes as floats, which runs take part (None: all), the sizes as integers) on the device,
        made once per pattern of sizes without a copy from the host (:func:`size_rows`): a step, replayed or not,
        uploads nothing, and the tensors a captured step reads live as long as the step does."""
        key = tuple(sizes)
        if key not in self._weights:
            rows = size_rows(sizes, self.device)
            weights = rows.float()
            self._weights[key] = (weights, None if all(sizes) else weights > 0, rows)
        return self._weights[key]

    def __call__(self, epoch: int, inputs: Any, labels: torch.Tensor, targets: list, sizes: list[int],
                 autocast_cache: bool = True) -> torch.Tensor:
        """Run the step; returns each run's loss (R,) (detached)."""
        weights, active, rows = self.weights(sizes)
        losses, grads = forward_backward(self.method, self.runs, self.optimizer, epoch, inputs, labels, targets,
                                         sizes, self.device, self.amp, autocast_cache, rows)
        self.optimizer.step(grads, active)
        losses = losses.detach().float()
        self.totals += losses * weights if active is None else torch.where(active, losses * weights, 0.0)
        return losses


def forward_backward(method: PromptMethod, runs: Sequence[RunState], optimizer: RunsOptimizer, epoch: int, inputs,
                     labels: torch.Tensor, targets: list, sizes: list[int], device: torch.device, amp: bool,
                     autocast_cache: bool = True, rows: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Each run's loss (R,) and the (scaled) gradients of :attr:`RunsOptimizer.params`.

    The method's ``training_loss`` gets the step's :class:`~atlas_fast.atlas.criterion.ScheduleCriterion` (each
    run's schedule loss of its logits, the runs' sizes, and ``rows``: the sizes on the device, given or made here
    by fills) and returns the step's loss or, with terms beyond the criterion, each run's loss (R,); each run's loss
    is the criterion's otherwise. The backward pass differentiates ``sum_r scale_r loss_r`` (each run's own fp16
    loss scale)."""
    count = len(runs)
    criterion = ScheduleCriterion([run.schedule for run in runs], epoch, labels, targets, sizes,
                                  rows if rows is not None else size_rows(sizes, device))
    with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp, cache_enabled=autocast_cache):
        loss = method.training_loss(inputs, labels, criterion)
    if loss.dim() == 1:  # each run's loss: the method has terms beyond the criterion (KgCoOp, DePT, PromptSRC)
        per_run = loss
    elif count == 1:
        per_run = loss.reshape(1)
    else:  # the sum of the criterion's losses: each run's loss is its criterion loss
        per_run = criterion.run_vector(loss)
    if tuple(per_run.shape) != (count,):
        raise ValueError(f"{method.name}.training_loss must return the step's loss or each run's loss, shape "
                         f"({count},), got {tuple(per_run.shape)}")
    grads = torch.autograd.grad(optimizer.scale_losses(per_run), optimizer.params, allow_unused=True)
    return per_run, list(grads)
