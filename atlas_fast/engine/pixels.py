"""Pixels of seeded image views through a DataLoader, for the methods whose image tower is prompted.

A view is the same pixels here as in the feature cache (:mod:`atlas_fast.clip.transforms`: view 0 = the test transform,
view v >= 1 = the augmentation seeded by (aug_seed, image key, v)), so a pixel run sees exactly the views whose frozen
features the cache holds. Workers decode in parallel; on a GPU the batches come through pinned memory and are copied
without blocking.
"""

from __future__ import annotations

import os
from typing import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from atlas_fast.clip.backbones import Backbone
from atlas_fast.data.base import Datum
from atlas_fast.clip.transforms import TransformSpec, load_views


class _OneView(Dataset):
    """Item i -> (view ``view`` of image i (3, S, S), i)."""

    def __init__(self, items: Sequence[Datum], spec: TransformSpec, view: int) -> None:
        self.items, self.spec, self.view = items, spec, view

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        datum = self.items[index]
        return load_views(datum.impath, datum.key, [self.view], self.spec)[0], index


def default_workers(device: torch.device) -> int:
    """Decoding processes: up to 8 on a GPU machine (decoding must keep up with the GPU); none on the CPU, where
    the model's own compute is the bottleneck and worker processes would only compete for the same cores."""
    return min(8, max(1, (os.cpu_count() or 2) - 1)) if device.type == "cuda" else 0


class ImageViews:
    """The items of one split, served as batches of pixels of one view each."""

    def __init__(self, items: Sequence[Datum], backbone: Backbone, aug_seed: int = 0, workers: int | None = None,
                 device: torch.device | str = "cpu") -> None:
        if not items:
            raise ValueError("ImageViews needs at least one image")
        self.items = tuple(items)
        self.spec = backbone.transform_for(aug_seed)
        self.device = torch.device(device)
        self.workers = default_workers(self.device) if workers is None else workers
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 DataLoader processes, got {self.workers}")

    def __len__(self) -> int:
        return len(self.items)

    def batches(self, view: int, order: torch.Tensor | None, batch_size: int
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(pixels (B, 3, S, S) on the device, index (B,))`` of view ``view`` for the items in ``order`` (all items
        in their order when None), ``batch_size`` at a time; the last partial batch is kept."""
        order = torch.arange(len(self.items)) if order is None else order.cpu()
        loader = DataLoader(_OneView(self.items, self.spec, view),
                            batch_sampler=[chunk.tolist() for chunk in order.split(batch_size)],
                            num_workers=self.workers, pin_memory=self.device.type == "cuda")
        for pixels, index in loader:
            yield pixels.to(self.device, non_blocking=True), index
