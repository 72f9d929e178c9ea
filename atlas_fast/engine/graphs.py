"""CUDA graphs of the whole training step (``TrainConfig.graph_steps``; on by default wherever they apply): full-size
steps, on cached features or on pixels (the prompted image towers), replay a captured
:class:`~atlas_fast.engine.step.TrainStep`, its batch gathered on the device (cached views) or copied into the
graph's input buffers (pixels from the loader), the loss, the backward pass, every run's update with its own fp16
overflow check and the epoch's loss sums. A graphed step is one replay: no host synchronisation, no kernel
launched one by one. Nothing here runs on a CPU (the refusals and the bookkeeping are tested there with torch.cuda
faked; the replays themselves by benchmarks/gpu_check.py on a GPU); a step that still reads values back from the
device trains eagerly with a warning.
"""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from atlas_fast.atlas.schedules import LabelSchedule
from atlas_fast.engine.step import GatheredBatches, StepBatch, StreamedBatches, TrainStep


# Eager steps of a step shape before its graph is captured (cuBLAS handles, autograd, the scaler's state, a
# method's cached tensors are created lazily); the last of them is checked for host synchronisation (StepGraphs).
GRAPH_WARMUP_STEPS = 2


def graphs_available(device: torch.device) -> bool:
    """Whether CUDA graphs can be captured on ``device`` (the tests fake them on the CPU)."""
    return device.type == "cuda"


def graph_steps_refusal(entry, schedules: Sequence[LabelSchedule], device: torch.device) -> str | None:
    """Why ``graph_steps`` cannot give exactly the eager steps of these runs (None when it can)."""
    if not graphs_available(device):
        return f"graph_steps replays CUDA graphs and needs a CUDA device; this run is on {device.type}"
    if not entry.learns:
        return f"graph_steps replays training steps; {entry.name} learns nothing"
    for schedule in schedules:
        # a schedule's loss may depend on the epoch only through uses_soft_labels (part of a graph's key) and must
        # keep no statistics of the predictions (OLS reads them on the host every step)
        if schedule.observes_predictions:
            return (f"graph_steps cannot replay the {schedule.name!r} label schedule (it learns its targets from "
                    f"each step's predictions on the host)")
    return None


def use_graph_steps(requested: Sequence[bool | None], entry, schedules: Sequence[LabelSchedule],
                    device: torch.device) -> bool:
    """Whether a group of runs trains with graph steps, from each run's ``TrainConfig.graph_steps``: None is
    wherever a graph can replay the step, False turns it off for the group, and True where it cannot is refused."""
    refusal = graph_steps_refusal(entry, schedules, device)
    if True in requested and refusal:
        raise ValueError(f"{refusal}.")
    return refusal is None and False not in requested


def host_syncs(function: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``function()`` and the messages of the host synchronisations it made on the GPU (torch's sync debug mode:
    ``.item()``, ``.tolist()``, a copy from or to pageable host memory, ...)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = function()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return result, sync_messages(str(w.message) for w in caught)


#: aten operators that read a tensor's values back to the host (on CUDA each waits for the device) or give an output
#: whose shape depends on the values: a captured CUDA graph can replay none of them
READ_BACK_OPS = frozenset({"_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "nonzero_static",
                           "masked_select", "_unique2", "unique_consecutive", "unique_dim", "allclose"})


class DispatchCount(TorchDispatchMode):
    """Counts the aten operators dispatched while active (``ops``, by name) and those of :data:`READ_BACK_OPS`
    (``read_backs``): what a function asks of the device, measurable on any device (the CPU's tests and benchmarks
    use it where CUDA's sync debug mode cannot run)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def read_backs(self) -> int:
        return sum(n for name, n in self.ops.items() if name in READ_BACK_OPS)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def sync_messages(messages) -> list[str]:
    """The first lines of the warnings that report a host synchronisation. torch's notice that the sync debug mode
    is a prototype (given once per process, the first time the mode is set) reports none: counting it once kept the
    first run of every process from replaying graphs (seen on an H100)."""
    return [message.splitlines()[0] for message in messages
            if "synchroniz" in message and "debug mode is a prototype" not in message]


def capture(body: Callable[[], Any], stream: torch.cuda.Stream, pool: Any = None) -> tuple[Callable[[], None], Any]:
    """Capture ``body()`` in a CUDA graph on ``stream`` (nothing runs), its memory from ``pool``; returns the graph's
    replay and what ``body`` returned while captured (the tensors each replay writes)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, pool=pool):
        outputs = body()
    return graph.replay, outputs


class StepGraphs:
    """CUDA graphs of the full-size steps of R runs.

    A step's shapes are static when every run's batch is full-size (or empty: a run that sits the step out); its
    graph is keyed by which runs take part and which of them use soft labels in the epoch (the only way the
    supported schedules' losses depend on it). A key's first :data:`GRAPH_WARMUP_STEPS` steps run eagerly; the last
    warm-up step of the first key runs under torch's sync debug mode, and if the step reads anything back from the
    device (which a graph cannot replay) the runs stay eager, with a warning saying where. Then the step is captured
    once and replayed: with :class:`~atlas_fast.engine.step.GatheredBatches` the captured step gathers its batch at
    the device's step counter and advances it, so a replay is the whole step; otherwise each step's inputs, labels
    and soft rows are copied into the graph's buffers first. The per-epoch lr lives in device scalars, so it needs
    no recapture. Graphs are dropped when the method's tensors move (``set_classnames`` during a per-epoch
    evaluation builds new buffers) and captured again. Partial batches run eagerly."""

    def __init__(self, step: TrainStep, batches: GatheredBatches | StreamedBatches, batch_size: int) -> None:
        self.train_step, self.batches, self.batch_size = step, batches, batch_size
        self.method = step.method
        self.device = step.device
        self.stream = torch.cuda.Stream(self.device)  # the warm-up steps and the captures run here
        # one memory pool for every graph of these runs: they replay one at a time and read only tensors that live
        # outside it (learned tensors, optimiser state, the batches' buffers, the epoch's loss sums)
        self.pool: Any = None
        self.graphs: dict[tuple, dict[str, Any]] = {}
        self.seen: dict[tuple, int] = {}
        self.checked = False
        self.refused: str | None = None
        self.pointers: tuple[int, ...] = ()
        self.replayed = 0

    def key(self, epoch: int, sizes: list[int]) -> tuple | None:
        if self.refused is not None or any(size not in (0, self.batch_size) for size in sizes) or not any(sizes):
            return None
        runs = self.train_step.runs
        return tuple((size > 0, size > 0 and run.schedule.uses_soft_labels(epoch)) for run, size in zip(runs, sizes))

    def _pointers(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in itertools.chain(self.method.parameters(), self.method.buffers()))

    def start_epoch(self) -> None:
        """Drop the graphs if a tensor they read was replaced since the last epoch's steps (new class buffers after
        a per-epoch evaluation)."""
        if self.graphs and self._pointers() != self.pointers:
            self.graphs.clear()
            self.seen.clear()  # warm up again: a method rebuilds what it caches lazily (KgCoOp's targets)

    def end_epoch(self) -> int:
        """The steps replayed in the epoch; notes the tensors the graphs read (before any per-epoch callback)."""
        self.pointers = self._pointers()
        replayed, self.replayed = self.replayed, 0
        return replayed

    def _eager(self, epoch: int, batch: StepBatch) -> torch.Tensor:
        """An eager step on the capture stream (as torch's CUDA-graph warm-up asks), ordered after and before the
        work of the current stream."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            result = self.train_step(epoch, *batch.tensors(), batch.sizes)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return result

    def step(self, key: tuple, epoch: int, batch: StepBatch) -> torch.Tensor:
        """Run the full-size step ``batch`` (of key ``key``): eagerly while warming up, else by replaying its graph
        (captured first if need be); returns each run's loss (R,)."""
        graph = self.graphs.get(key)
        if graph is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] <= GRAPH_WARMUP_STEPS:
                if self.checked or self.seen[key] < GRAPH_WARMUP_STEPS:
                    return self._eager(epoch, batch)
                # the last warm-up step (lazy caches are built by now): does it read back from the device?
                self.checked = True
                result, syncs = host_syncs(lambda: self._eager(epoch, batch))
                if syncs:
                    self._refuse(f"one step of {self.method.name} synchronises with the host {len(syncs)} time(s) "
                                 f"(first: {syncs[0]!r})")
                return result
            try:
                graph = self._capture(key, epoch, batch)
            except RuntimeError as exc:  # a step torch cannot capture: train on eagerly, the same numbers
                self._refuse(f"capturing a step of {self.method.name} failed: {str(exc).splitlines()[0][:200]}")
                return self._eager(epoch, batch)
        if self.batches.gathers_on_device:
            self.batches.place_counter(batch.index)
        else:
            inputs, labels, targets = batch.tensors()
            with torch.no_grad():
                tree_map(lambda static, value: static.copy_(value), graph["inputs"], inputs)
                graph["labels"].copy_(labels)
                for (_, run_labels, soft), (_, static_labels, static_soft) in zip(targets, graph["targets"]):
                    static_labels.copy_(run_labels)
                    if soft is not None:
                        static_soft.copy_(soft)
        graph["replay"]()
        self.replayed += 1
        return graph["losses"]

    def _capture(self, key: tuple, epoch: int, batch: StepBatch) -> dict[str, Any]:
        captured: dict[str, Any] = {}
        if self.batches.gathers_on_device:
            tensors = None
        else:
            inputs, labels, targets = batch.tensors()
            static = (tree_map(lambda x: x.clone(), inputs), labels.clone(),
                      [(r, run_labels.clone(), soft.clone() if soft is not None else None)
                       for r, run_labels, soft in targets])
            captured.update(inputs=static[0], labels=static[1], targets=static[2])
            tensors = static

        def body() -> torch.Tensor:  # autocast's weight cache must be off while capturing
            step_tensors = tensors if tensors is not None else self.batches.graph_tensors(batch.sizes)
            losses = self.train_step(epoch, *step_tensors, batch.sizes, autocast_cache=False)
            if self.batches.gathers_on_device:
                self.batches.advance()
            return losses

        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        replay, losses = capture(body, self.stream, self.pool)
        captured.update(replay=replay, losses=losses)
        self.graphs[key] = captured
        return captured

    def _refuse(self, reason: str) -> None:
        self.refused = reason
        self.graphs.clear()
        warnings.warn(f"graph_steps: {reason}; a CUDA graph cannot replay that, so these runs train eagerly (the "
                      f"same numbers, without the graphs' speed).", stacklevel=3)
