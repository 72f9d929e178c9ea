"""Pixels of seeded image views, decoded once, for the methods whose image tower is prompted.

A view is the same pixels here as in the feature cache (:func:`~atlas_fast.clip.transforms.load_views`, bit for bit,
wherever it is decoded), so a pixel run sees exactly the views whose frozen features the cache holds. Three pieces:
:class:`DecodingPool`, the decoding processes, **one per command** (:func:`decoding_pool`), so no epoch and no
evaluated class set starts processes again; :class:`ViewFeed`, which decodes each distinct (image, view) of a step
once for every run of a group that reads it (the label variants of one seed read the same images in the same
order); :class:`ImageViews`, the items of one split served as batches of one view through a feed. On a GPU a
step's decoded views come through pinned memory and are copied to the device once, without blocking.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from atlas_fast.clip.backbones import Backbone
from atlas_fast.clip.transforms import TransformSpec, load_views
from atlas_fast.data.base import Datum

# One view to decode: (image path, image key, view, transform spec).
ViewRequest = tuple[str, str, int, TransformSpec]


def decode_view(request: ViewRequest) -> torch.Tensor:
    """The pixels (3, S, S) of one (image path, key, view, spec)."""
    impath, key, view, spec = request
    return load_views(impath, key, [view], spec)[0]


class _DecodeRequests(Dataset):
    """A request -> its pixels (:func:`decode_view`): stateless, so one pool serves every split, view and
    augmentation seed of a command."""

    def __getitem__(self, request: ViewRequest) -> torch.Tensor:  # type: ignore[override]
        return decode_view(request)

    def __len__(self) -> int:  # DataLoader asks; the requests come from the schedule
        return 0


class _Schedule:
    """The batch sampler of a pool: the requests of each step of the current pass."""

    def __init__(self) -> None:
        self.steps: list[list[ViewRequest]] = []

    def __iter__(self) -> Iterator[list[ViewRequest]]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)


def default_workers(device: torch.device) -> int:
    """Decoding processes: up to 8 on a GPU machine (decoding must keep up with the GPU); none on the CPU, where
    the model's own compute is the bottleneck and worker processes would only compete for the same cores."""
    return min(8, max(1, (os.cpu_count() or 2) - 1)) if device.type == "cuda" else 0


class DecodingPool:
    """The decoding processes of a command: ``workers`` DataLoader processes that persist across passes (0: decode
    in this process), batches pinned for a GPU with ``pin_memory``. One pass at a time: starting a pass ends the
    one before it (its generator then refuses to go on)."""

    def __init__(self, workers: int, pin_memory: bool = False) -> None:
        if workers < 0:
            raise ValueError(f"workers must be >= 0 decoding processes, got {workers}")
        self.workers = workers
        self.schedule = _Schedule()
        self.loader = DataLoader(_DecodeRequests(), batch_sampler=self.schedule, num_workers=workers,
                                 persistent_workers=workers > 0, pin_memory=pin_memory)
        self.passes = 0

    def decode(self, steps: list[list[ViewRequest]]) -> Iterator[torch.Tensor]:
        """The pixels (n_s, 3, S, S) of each step's requests, in order; the workers decode ahead."""
        self.passes += 1
        current = self.passes
        self.schedule.steps = steps
        batches = iter(self.loader)
        for _ in steps:
            if self.passes != current:
                raise RuntimeError("a decoding pass was superseded by another one before it finished")
            yield next(batches)

    def close(self) -> None:
        """Stop the worker processes (they also stop with the process)."""
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self.loader._iterator = None


_POOLS: dict[tuple[int, bool], DecodingPool] = {}


def decoding_pool(workers: int, pin_memory: bool = False) -> DecodingPool:
    """This process's decoding pool with ``workers`` processes (created once: one per command)."""
    key = (workers, pin_memory)
    if key not in _POOLS:
        _POOLS[key] = DecodingPool(workers, pin_memory)
    return _POOLS[key]


@atexit.register
def close_decoding_pools() -> None:
    """Stop every pool's workers (at exit, or when a caller wants its processes back)."""
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


@dataclass
class _Plan:
    """One run's pass: the view of its items in ``batches`` (each a (B,) index tensor into ``items``)."""

    items: Sequence[Datum]
    spec: TransformSpec
    view: int
    batches: list[torch.Tensor]


class ViewFeed:
    """Decodes the views that the runs of a group read, each distinct (image, view) of a step once.

    :meth:`register` takes one run's pass (its items, view and order) and returns its batches. The plans registered
    before the first batch of any of them is asked for form one pass: step s decodes the union of every plan's
    batch s (each distinct request once) in the command's pool and gives each plan its rows. Plans are read step by
    step together (the training loop does; one plan alone may be read at any pace); a plan that asks for a step the
    pass has left behind is an error, not a silent second decode."""

    def __init__(self, pool: DecodingPool, device: torch.device | str = "cpu") -> None:
        self.pool, self.device = pool, torch.device(device)
        self.pending: list[_Plan] = []
        self.plans: dict[int, int] = {}  # id(plan) -> its position in the current pass
        self.positions: list[list[torch.Tensor | None]] = []  # per step, per plan of the pass: its decoded rows
        self.stream: Iterator[torch.Tensor] | None = None
        self.step, self.pixels = -1, None

    def register(self, items: Sequence[Datum], spec: TransformSpec, view: int, order: torch.Tensor,
                 batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(pixels (B, 3, S, S), index (B,))``, both on the device, per batch of ``order`` (the last partial
        batch is kept), decoded together with the other plans registered before the pass starts."""
        plan = _Plan(items, spec, view, list(order.cpu().split(batch_size)))
        self.pending.append(plan)
        return self._serve(plan, order.to(self.device).split(batch_size))

    def _start(self) -> None:
        plans, self.pending = self.pending, []
        self.plans = {id(plan): p for p, plan in enumerate(plans)}
        steps, flat, spans = [], [], []
        for s in range(max(len(plan.batches) for plan in plans)):
            where: dict[ViewRequest, int] = {}
            step_spans = []
            for plan in plans:
                if s >= len(plan.batches):
                    step_spans.append(None)
                    continue
                step_spans.append((len(flat), len(plan.batches[s])))
                requests = [(plan.items[i].impath, plan.items[i].key, plan.view, plan.spec)
                            for i in plan.batches[s].tolist()]
                flat += [where.setdefault(request, len(where)) for request in requests]
            steps.append(list(where))
            spans.append(step_spans)
        rows = torch.tensor(flat).to(self.device)  # every step's rows moved once per pass, not once per step
        self.positions = [[None if span is None else rows[span[0]:span[0] + span[1]] for span in step_spans]
                          for step_spans in spans]
        self.stream = self.pool.decode(steps)
        self.step, self.pixels = -1, None

    def _serve(self, plan: _Plan, indices: Sequence[torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for s, index in enumerate(indices):  # the batches' item indices, on the device (read there, no copy)
            if s == 0 and any(pending is plan for pending in self.pending):
                self._start()
            p = self.plans.get(id(plan))
            if p is None or s < self.step:
                raise RuntimeError("the runs of a decoding pass must read their batches step by step together; "
                                   "this run's step was already left behind (or its pass was superseded)")
            while self.step < s:
                self.pixels = next(self.stream).to(self.device, non_blocking=True)
                self.step += 1
            yield self.pixels.index_select(0, self.positions[s][p]), index


class ImageViews:
    """The items of one split, served as batches of pixels of one view each, through ``feed`` (the group's, so
    runs on the same images decode them once; default: a feed of its own on this command's pool)."""

    def __init__(self, items: Sequence[Datum], backbone: Backbone, aug_seed: int = 0, workers: int | None = None,
                 device: torch.device | str = "cpu", feed: ViewFeed | None = None) -> None:
        if not items:
            raise ValueError("ImageViews needs at least one image")
        self.items = tuple(items)
        self.spec = backbone.transform_for(aug_seed)
        self.device = torch.device(device)
        self.workers = default_workers(self.device) if workers is None else workers
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 DataLoader processes, got {self.workers}")
        self.feed = feed if feed is not None else ViewFeed(decoding_pool(self.workers, self.device.type == "cuda"),
                                                           self.device)

    def __len__(self) -> int:
        return len(self.items)

    def batches(self, view: int, order: torch.Tensor | None, batch_size: int
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(pixels (B, 3, S, S), index (B,))`` on the device, of view ``view`` for the items in ``order`` (all items
        in their order when None), ``batch_size`` at a time; the last partial batch is kept. Registered with the
        feed now (not at the first batch), so the batches of the runs asked before any is read are decoded
        together."""
        order = torch.arange(len(self.items)) if order is None else order
        return self.feed.register(self.items, self.spec, view, order, batch_size)
