"""The one way a method builds on another (DePT's head, KDPL's distillation): composition. A
:class:`WrappedMethod` holds its base method as a submodule, ``self.base``, built for the same backbone, classes and
config (the wrapper's config class derives from the base's), and passes every hook it does not change to it
(class set, text features, logits, loss, optimiser groups, per-epoch bookkeeping). A wrapper overrides only what it
changes and declares its class attributes itself (``reads_pixels`` by deriving from
:class:`~atlas_fast.methods.pixel_method.PixelMethod` after the wrapper, ``reads_frozen_features``,
``depth_options``, ``supports_batched_runs``), as every registered class does, so the command line reads them from
the file without importing torch.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterator, Sequence, cast

import torch

from atlas_fast.atlas.criterion import Criterion
from atlas_fast.clip.backbones import Backbone
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import MethodConfig
from atlas_fast.methods.pixel_method import PixelMethod


class WrappedMethod(PromptMethod):
    """A method around ``base_class`` (see the module's text). Its learned tensors include the base's, named
    ``base.<name>``."""

    base_class: ClassVar[type[PromptMethod]]

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.base = self.base_class(backbone, classnames, config, runs)
        self.classnames = self.base.classnames

    def set_classnames(self, classnames: Sequence[str]) -> None:
        self.base.set_classnames(classnames)
        self.classnames = self.base.classnames

    def text_features(self) -> torch.Tensor:
        return self.base.text_features()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.base(images)

    def eval_logit_chunks(self, features: torch.Tensor) -> Iterator[torch.Tensor]:
        return self.base.eval_logit_chunks(features)

    # a wrapper of a pixel method derives from PixelMethod after this class: its test path is the base's
    def eval_pixel_features(self, pixels: torch.Tensor) -> torch.Tensor:
        return cast(PixelMethod, self.base).eval_pixel_features(pixels)

    def pixel_classifier(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return cast(PixelMethod, self.base).pixel_classifier()

    def training_loss(self, inputs: Any, labels: torch.Tensor, criterion: Criterion) -> torch.Tensor:
        return self.base.training_loss(inputs, labels, criterion)

    def param_groups(self) -> list[dict[str, Any]]:
        return self.base.param_groups()

    def end_epoch(self, epoch: int, num_epochs: int) -> None:
        self.base.end_epoch(epoch, num_epochs)

    def carry_runs(self, source: PromptMethod, keep: Sequence[int]) -> None:
        self.base.carry_runs(source.base if isinstance(source, WrappedMethod) else source, keep)

    def finish_training(self) -> None:
        self.base.finish_training()
