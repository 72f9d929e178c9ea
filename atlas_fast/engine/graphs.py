"""CUDA graphs for the training step (``TrainConfig.graph_steps``; on by default wherever they apply): full-size
steps replay a captured forward, loss and backward, on cached features or on pixels (the prompted image towers); the
optimiser step and gradient scaler run as usual on the graph's gradient buffers. Nothing here runs on a CPU (the
refusals and the bookkeeping are tested there with torch.cuda faked; the replays themselves by
benchmarks/gpu_check.py on a GPU); a step that still reads values back from the device trains eagerly with a warning.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import torch

from atlas_fast.atlas.schedules import LabelSchedule
from atlas_fast.engine.step import RunState, forward_backward
from atlas_fast.methods.base import PromptMethod


# Eager steps of a step shape before its graph is captured (cuBLAS handles, autograd, the scaler's state, a
# method's cached tensors are created lazily); the last of them is checked for host synchronisation (StepGraphs).
GRAPH_WARMUP_STEPS = 2


def graph_steps_refusal(entry, schedules: Sequence[LabelSchedule], device: torch.device) -> str | None:
    """Why ``graph_steps`` cannot give exactly the eager steps of these runs (None when it can)."""
    if device.type != "cuda":
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


def sync_messages(messages) -> list[str]:
    """The first lines of the warnings that report a host synchronisation. torch's notice that the sync debug mode
    is a prototype (given once per process, the first time the mode is set) reports none: counting it once kept the
    first run of every process from replaying graphs (seen on an H100)."""
    return [message.splitlines()[0] for message in messages
            if "synchroniz" in message and "debug mode is a prototype" not in message]


def clone_inputs(inputs):
    """A graph's static copy of a step's inputs: a tensor, or a tuple of tensors (pixels with frozen features)."""
    if isinstance(inputs, tuple):
        return type(inputs)(*(clone_inputs(part) for part in inputs))
    return inputs.clone()


def copy_inputs(static, inputs) -> None:
    """Copy a step's inputs into the graph's static buffers (same structure and shapes)."""
    if isinstance(static, tuple):
        for static_part, part in zip(static, inputs):
            copy_inputs(static_part, part)
    else:
        static.copy_(inputs)


class StepGraphs:
    """CUDA graphs of the forward, loss and backward of the full-size steps of R runs (cached features or pixels).

    A step's shapes are static when every run's batch is full-size; its graph is keyed by which runs use soft labels
    in the epoch (the only way the supported schedules' losses depend on it). A key's first
    :data:`GRAPH_WARMUP_STEPS` steps run eagerly; the last warm-up step of the first key runs under torch's sync
    debug mode, and if the method's step reads anything back from the device (which a graph cannot replay) the run
    stays eager, with a warning saying where. Then the step is captured once and replayed: each step copies its
    inputs, labels and soft rows into the graph's static buffers and replays the very kernels of an eager step, so
    the numbers are the eager ones. The optimiser step (and the gradient scaler) run eagerly after it, on the
    graph's gradient buffers, so the per-epoch lr needs no recapture. Graphs are dropped when the method's tensors
    move (``set_classnames`` during a per-epoch evaluation builds new buffers) and captured again. Partial batches
    run eagerly."""

    def __init__(self, method: PromptMethod, runs: Sequence[RunState], optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, batch_size: int, amp: bool) -> None:
        self.method, self.runs, self.optimizer, self.scaler = method, runs, optimizer, scaler
        self.batch_size, self.amp = batch_size, amp
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.device = self.params[0].device
        self.stream = torch.cuda.Stream(self.device)  # the warm-up steps and the captures run here
        self.graphs: dict[tuple, dict[str, Any]] = {}
        self.seen: dict[tuple, int] = {}
        self.checked = False
        self.refused: str | None = None
        self.pointers: tuple[int, ...] = ()
        self.replayed = 0

    def key(self, epoch: int, sizes: list[int]) -> tuple | None:
        if self.refused is not None or any(size != self.batch_size for size in sizes):
            return None
        return tuple(run.schedule.uses_soft_labels(epoch) for run in self.runs)

    def start_epoch(self) -> None:
        """Drop the graphs if a tensor they read was replaced (new class buffers after a per-epoch evaluation)."""
        import itertools

        pointers = tuple(t.data_ptr() for t in itertools.chain(self.method.parameters(), self.method.buffers()))
        if pointers != self.pointers:
            self.graphs.clear()
            self.pointers = pointers

    def end_epoch(self) -> int:
        replayed, self.replayed = self.replayed, 0
        return replayed

    def _eager(self, epoch, inputs, labels, targets, sizes):
        """An eager forward + backward on the capture stream (as torch's CUDA-graph warm-up asks), ordered after and
        before the work of the current stream."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            result = forward_backward(self.method, self.runs, self.optimizer, self.scaler, epoch, inputs, labels,
                                      targets, sizes, self.device, self.amp)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return result

    def step(self, key: tuple, epoch: int, inputs: torch.Tensor, labels: torch.Tensor, targets: list,
             sizes: list[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        graph = self.graphs.get(key)
        if graph is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] <= GRAPH_WARMUP_STEPS:
                if self.checked or self.seen[key] < GRAPH_WARMUP_STEPS:
                    return self._eager(epoch, inputs, labels, targets, sizes)
                # the last warm-up step (lazy caches are built by now): does it read back from the device?
                self.checked = True
                result, syncs = host_syncs(lambda: self._eager(epoch, inputs, labels, targets, sizes))
                if syncs:
                    self._refuse(f"one step of {self.method.name} synchronises with the host {len(syncs)} time(s) "
                                 f"(first: {syncs[0]!r})")
                return result
            try:
                graph = self._capture(key, epoch, inputs, labels, targets, sizes)
            except RuntimeError as exc:  # a step torch cannot capture: train on eagerly, the same numbers
                self._refuse(f"capturing a step of {self.method.name} failed: {str(exc).splitlines()[0][:200]}")
                return self._eager(epoch, inputs, labels, targets, sizes)
        with torch.no_grad():
            copy_inputs(graph["inputs"], inputs)
            graph["labels"].copy_(labels)
            for (_, run_labels, soft), (_, static_labels, static_soft) in zip(targets, graph["targets"]):
                static_labels.copy_(run_labels)
                if soft is not None:
                    static_soft.copy_(soft)
        graph["graph"].replay()
        for param, grad in zip(self.params, graph["grads"]):
            param.grad = grad
        self.replayed += 1
        return graph["loss"], graph["losses"]

    def _capture(self, key, epoch, inputs, labels, targets, sizes) -> dict[str, Any]:
        static_inputs, static_labels = clone_inputs(inputs), labels.clone()
        static_targets = [(r, run_labels.clone(), soft.clone() if soft is not None else None)
                          for r, run_labels, soft in targets]
        self.optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):  # autocast's weight cache must be off while capturing
            loss, losses = forward_backward(self.method, self.runs, self.optimizer, self.scaler, epoch,
                                            static_inputs, static_labels, static_targets, sizes, self.device,
                                            self.amp, autocast_cache=False)
        captured = {"graph": graph, "inputs": static_inputs, "labels": static_labels, "targets": static_targets,
                    "loss": loss, "losses": losses, "grads": [p.grad for p in self.params]}
        self.graphs[key] = captured
        return captured

    def _refuse(self, reason: str) -> None:
        self.refused = reason
        self.graphs.clear()
        warnings.warn(f"graph_steps: {reason}; a CUDA graph cannot replay that, so these runs train eagerly (the "
                      f"same numbers, without the graphs' speed).", stacklevel=3)
