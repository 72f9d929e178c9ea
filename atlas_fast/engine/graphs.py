"""CUDA graphs of the whole training step (``TrainConfig.graph_steps``, on by default wherever they apply): a
full-size step (batch, loss, backward, every run's update and overflow check, the loss sums) is one replay of a
captured :class:`~atlas_fast.engine.step.TrainStep`. A step that synchronises with the host, uploads from it or
reads values back, or whose capture or first replay fails, trains eagerly with one warning (docs/protocol.md,
"CUDA graphs"). CPU tests fake torch.cuda; the replays are checked by benchmarks/gpu_check.py on a GPU.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections import Counter
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from atlas_fast.atlas.schedules import LabelSchedule
from atlas_fast.clip.text_encoder import cached_layouts
from atlas_fast.engine.step import GatheredBatches, StepBatch, StreamedBatches, TrainStep


# Eager steps of a step shape before its graph is captured (cuBLAS handles, autograd, the scaler's state, a
# method's cached tensors are created lazily); the last of them is checked for host synchronisation (StepGraphs).
GRAPH_WARMUP_STEPS = 2


def graphs_available(device: torch.device) -> bool:
    """Whether CUDA graphs can be captured on ``device`` (the tests fake them on the CPU)."""
    return device.type == "cuda"


def device_refusal(device: torch.device) -> str | None:
    """Why ``graph_steps`` cannot run on ``device`` at all (None on CUDA)."""
    if not graphs_available(device):
        return f"graph_steps replays CUDA graphs and needs a CUDA device; this run is on {device.type}"
    return None


def graph_steps_refusal(entry, schedules: Sequence[LabelSchedule], device: torch.device) -> str | None:
    """Why ``graph_steps`` cannot give exactly the eager steps of these runs (None when it can)."""
    if refusal := device_refusal(device):
        return refusal
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

#: aten operators that turn host data into a tensor (``torch.tensor``, ``torch.as_tensor``, ``from_numpy``, indexing
#: with a Python list): on a GPU each is an upload from the host, which a captured graph cannot replay (it would
#: replay the first step's values, and the copy from pageable memory synchronises)
UPLOAD_OPS = frozenset({"lift_fresh", "lift_fresh_copy", "lift"})

#: aten operators that copy between devices; :class:`DispatchCount` counts those from the host to a device as
#: uploads and those from a device to the host as reads back (a device only: on the CPU every copy stays there)
COPY_OPS = frozenset({"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"})


def _devices_of_copy(name: str, args: tuple, kwargs: dict) -> tuple[str | None, str | None]:
    """(source device type, destination device type) of a copy operator's call, None where not known."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name == "_to_copy" and tensors:
        target = kwargs.get("device")
        return tensors[0].device.type, (torch.device(target).type if target is not None else tensors[0].device.type)
    if name == "copy_" and len(tensors) >= 2:
        return tensors[1].device.type, tensors[0].device.type
    if name.startswith("_copy_from") and len(tensors) >= 2:
        return tensors[0].device.type, tensors[1].device.type
    return None, None


class DispatchCount(TorchDispatchMode):
    """Counts the aten operators dispatched while active (``ops``), reads back to the host (``read_backs``) and
    uploads of host data (``uploads``), on any device (where CUDA's sync debug mode cannot run). A step a CUDA graph
    replays must have neither."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.transfers: Counter[str] = Counter()  # "upload:<op>" / "read_back:<op>" of copies across devices
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.paused:
            name = func.overloadpacket.__name__
            self.ops[name] += 1
            if name in COPY_OPS:
                source, target = _devices_of_copy(name, args, kwargs)
                if source == "cpu" and target not in (None, "cpu", "meta"):
                    self.transfers[f"upload:{name}"] += 1
                elif target == "cpu" and source not in (None, "cpu", "meta"):
                    self.transfers[f"read_back:{name}"] += 1
        return func(*args, **kwargs)

    @property
    def read_backs(self) -> int:
        return (sum(n for name, n in self.ops.items() if name in READ_BACK_OPS)
                + sum(n for name, n in self.transfers.items() if name.startswith("read_back:")))

    @property
    def uploads(self) -> int:
        return (sum(n for name, n in self.ops.items() if name in UPLOAD_OPS)
                + sum(n for name, n in self.transfers.items() if name.startswith("upload:")))

    def host_traffic(self) -> list[str]:
        """One line per kind of host traffic counted (empty: none), e.g. ``"2 upload(s) from the host (lift_fresh)"``."""
        lines = []
        for what, count, names in (
                ("upload(s) from the host", self.uploads,
                 [n for n in self.ops if n in UPLOAD_OPS] + [n for n in self.transfers if n.startswith("upload:")]),
                ("read(s) back to the host", self.read_backs,
                 [n for n in self.ops if n in READ_BACK_OPS] + [n for n in self.transfers
                                                                if n.startswith("read_back:")])):
            if count:
                lines.append(f"{count} {what} ({', '.join(sorted(names))})")
        return lines

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def host_traffic(function: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``function()`` and what it asked of the host that a captured graph cannot replay: the synchronisations of
    torch's sync debug mode (on a GPU, :func:`host_syncs`) and the uploads and reads back :class:`DispatchCount`
    sees (on any device)."""
    counter = DispatchCount()

    def counted() -> Any:
        with counter:
            return function()

    result, syncs = host_syncs(counted)
    return result, [*syncs, *counter.host_traffic()]


def sync_messages(messages) -> list[str]:
    """The first lines of the warnings that report a host synchronisation (not torch's once-per-process notice that
    the sync debug mode is a prototype)."""
    return [message.splitlines()[0] for message in messages
            if "synchroniz" in message and "debug mode is a prototype" not in message]


#: Set to 1 to capture every step graph with torch's input-liveness check (``check_input_liveness``): each replay
#: then fails, naming the tensor, if a tensor the graph reads was freed since its capture (slow; for debugging).
GRAPH_DEBUG_VARIABLE = "ATLAS_FAST_GRAPH_DEBUG"


def graph_debug() -> bool:
    """Whether :data:`GRAPH_DEBUG_VARIABLE` turns the input-liveness check on (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get(GRAPH_DEBUG_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


#: How a capture treats CUDA calls that are unsafe while it runs: only those of the capturing thread fail it. The
#: pixel loader's pin-memory thread allocates pinned host memory while a step is captured; under torch's default
#: ("global") that allocation would fail the capture and raise again in the loader at its next batch.
CAPTURE_ERROR_MODE = "thread_local"


def capture(body: Callable[[], Any], stream: torch.cuda.Stream, pool: Any = None) -> tuple[Callable[[], None], Any]:
    """Capture ``body()`` in a CUDA graph on ``stream`` (nothing runs), its memory from ``pool``, with
    :data:`CAPTURE_ERROR_MODE` (other threads, e.g. the loader's, may go on working) and, under
    :data:`GRAPH_DEBUG_VARIABLE`, torch's input-liveness check; returns the graph's replay and what ``body``
    returned while captured (the tensors each replay writes)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    options: dict[str, Any] = {"capture_error_mode": CAPTURE_ERROR_MODE}
    if graph_debug():
        options["check_input_liveness"] = True
    with torch.cuda.graph(graph, stream=stream, pool=pool, **options):
        outputs = body()
    return graph.replay, outputs


class StepGraphs:
    """CUDA graphs of the full-size steps of R runs.

    A graph is keyed by which runs take part (full-size or empty batch) and which use soft labels in the epoch.
    Each key's first :data:`GRAPH_WARMUP_STEPS` steps run eagerly, the last under :func:`host_traffic` (host
    traffic falls back); then the step is captured once and replayed. With
    :class:`~atlas_fast.engine.step.GatheredBatches` a replay gathers its batch at the device's step counter and
    advances it; otherwise inputs are copied into the graph's buffers first. The lr lives in device scalars.

    Graphs are dropped and captured again when a tensor they read is rebuilt (replaced, moved, or a new class set:
    ``class_version`` catches buffers landing at the old addresses); until then those tensors are held, so none is
    freed under a live graph. Partial batches run eagerly. A fallback ends the whole group's graphs with one
    warning, the same numbers; :attr:`fallback` says why (the record keeps it)."""

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
        self.refused: str | None = None
        self.held: list[torch.Tensor] = []  # the learned tensors and buffers the graphs read, kept alive
        self.held_layouts: list[Any] = []  # the text layouts cached on those buffers when a graph was captured
        self.pointers: tuple[int, ...] = ()
        self.versions: tuple[int, ...] = ()
        self.replayed = 0

    @property
    def fallback(self) -> str | None:
        """Why these runs stopped replaying graphs (None: they did not)."""
        return self.refused

    def key(self, epoch: int, sizes: list[int]) -> tuple | None:
        if self.refused is not None or any(size not in (0, self.batch_size) for size in sizes) or not any(sizes):
            return None
        runs = self.train_step.runs
        return tuple((size > 0, size > 0 and run.schedule.uses_soft_labels(epoch)) for run, size in zip(runs, sizes))

    def _read_tensors(self) -> list[torch.Tensor]:
        return list(itertools.chain(self.method.parameters(), self.method.buffers()))

    def _versions(self) -> tuple[int, ...]:
        """The class-set versions of the method and every method inside it (DePT's base)."""
        return tuple(getattr(module, "class_version", 0) for module in self.method.modules())

    def _stale(self) -> bool:
        """Whether a tensor the graphs read was rebuilt, replaced or moved since :meth:`end_epoch` noted them."""
        tensors = self._read_tensors()
        return (self._versions() != self.versions or len(tensors) != len(self.held)
                or any(now is not held for now, held in zip(tensors, self.held))
                or tuple(t.data_ptr() for t in tensors) != self.pointers)

    def start_epoch(self) -> None:
        """Drop the graphs if a tensor they read was rebuilt since the last epoch's steps, so they are warmed up,
        checked and captured again; warm-up counts restart too (the first step after a rebuild fills lazy caches)."""
        if self.held and self._stale():
            self.graphs.clear()
            self.held, self.held_layouts = [], []  # noted again at the next capture or the epoch's end
            self.seen.clear()

    def end_epoch(self) -> int:
        """The steps replayed in the epoch; notes (and holds) the tensors the graphs read, before any per-epoch
        callback."""
        self.held = self._read_tensors()
        self.pointers = tuple(t.data_ptr() for t in self.held)
        self.versions = self._versions()
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
            if self.seen[key] < GRAPH_WARMUP_STEPS:
                return self._eager(epoch, batch)
            if self.seen[key] == GRAPH_WARMUP_STEPS:
                # the key's last warm-up step (lazy caches are built by now): does it ask anything of the host?
                result, traffic = host_traffic(lambda: self._eager(epoch, batch))
                if traffic:
                    self._refuse(key, f"its step synchronises with the host or copies to or from it: "
                                      f"{'; '.join(traffic[:3])}")
                return result
            try:
                graph = self._capture(key, epoch, batch)
            except RuntimeError as exc:  # a step torch cannot capture: train on eagerly, the same numbers
                self._refuse(key, f"capturing its step failed: {first_line(exc)}")
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
        if graph["replays"]:
            graph["replay"]()
        else:  # a graph that cannot launch fails at its first replay, before it ran: fall back, the same numbers
            try:
                graph["replay"]()
            except RuntimeError as exc:
                self._refuse(key, f"the first replay of its graph failed: {first_line(exc)}")
                return self._eager(epoch, batch)
        graph["replays"] += 1
        self.replayed += 1
        return graph["losses"]

    def _capture(self, key: tuple, epoch: int, batch: StepBatch) -> dict[str, Any]:
        captured: dict[str, Any] = {"replays": 0}
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
        if not self.held:  # the tensors this graph reads stay alive while it does (noted again at the epoch's end)
            self.held = self._read_tensors()
            self.pointers = tuple(t.data_ptr() for t in self.held)
            self.versions = self._versions()
        # and so do the text layouts cached on the class buffers (the cache's bound may clear it meanwhile)
        self.held_layouts += [layout for tensor in self.method.buffers() for layout in cached_layouts(tensor)]
        replay, losses = capture(body, self.stream, self.pool)
        captured.update(replay=replay, losses=losses)
        self.graphs[key] = captured
        return captured

    def _refuse(self, key: tuple, reason: str) -> None:
        self.refused = f"{self.method.name}, step {describe_key(key)}: {reason}"
        self.graphs.clear()
        self.held, self.held_layouts = [], []
        warnings.warn(f"graph_steps: {self.refused}; a CUDA graph cannot replay that, so these runs train eagerly "
                      f"from here on (the same numbers, without the graphs' speed).", stacklevel=3)


def describe_key(key: tuple) -> str:
    """A step graph's key in words: ``"runs 0, 2 (soft labels: 2)"``."""
    runs = [r for r, (takes_part, _) in enumerate(key) if takes_part]
    soft = [r for r, (_, uses_soft) in enumerate(key) if uses_soft]
    text = f"run{'s' if len(runs) > 1 else ''} {', '.join(map(str, runs))} of {len(key)}"
    return text + (f" (soft labels: {', '.join(map(str, soft))})" if soft else " (one-hot)")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, at most 200 characters."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
