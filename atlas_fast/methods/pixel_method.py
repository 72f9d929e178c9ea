"""The contract of a method that prompts or adapts CLIP's image tower (:class:`PixelMethod`): it trains and is
evaluated on decoded pixels, not on cached image features.

The engine calls only :meth:`PixelMethod.training_loss` on pixels (B, 3, H, W), (R, B, 3, H, W) for R runs, or a
:class:`~atlas_fast.engine.feed.PixelBatch` with cached frozen features (``reads_frozen_features``); and, at
evaluation, ``classify = method.pixel_classifier()`` once per class set, then
``classify(method.eval_pixel_features(pixels))`` per batch, so an image goes through the image tower once for every
class set. A pixel method implements :meth:`PixelMethod.image_batch`, ``raw_text_features()`` (R, C, D) and
``text_features()``. A method whose test logits are more than one cosine (MMRL, DePT-MaPLe) overrides
:meth:`PixelMethod.eval_pixel_features` and :meth:`PixelMethod.pixel_classifier` together; a wrapper (DePT-MaPLe)
lists its class first, so its ``forward`` and loss stay its own.
"""

from __future__ import annotations

from typing import Callable

import torch

from atlas_fast.methods.base import PromptMethod


class PixelMethod(PromptMethod):
    """Base class of the methods with ``reads_pixels`` (IVLP, MaPLe, PromptSRC, CoPrompt, CLIP-LoRA, MMRL, PromptKD,
    DePT-MaPLe, KDPL on MaPLe and PromptSRC); :func:`~atlas_fast.methods.registry.register_method` refuses a class
    that reads pixels without deriving from it, or derives from it and reads none."""

    reads_pixels = True

    def check_pixels(self, pixels: torch.Tensor) -> None:
        """Refuse anything but preprocessed pixels (B, 3, H, W) seen by every run or, for a method that trains R runs
        together, (R, B, 3, H, W), one batch per run."""
        runs = self.num_runs
        if pixels.dim() == 4 or (self.supports_batched_runs and pixels.dim() == 5 and pixels.shape[0] == runs):
            return
        shapes = f"(B, 3, H, W) or (R={runs}, B, 3, H, W)" if self.supports_batched_runs else "(B, 3, H, W)"
        raise ValueError(f"{type(self).__name__} reads pixels {shapes}, got {tuple(pixels.shape)}")

    def image_batch(self, pixels: torch.Tensor) -> torch.Tensor:
        """Un-normalised image features (R, B, D) of preprocessed pixels (:meth:`check_pixels`), through the
        method's prompted or adapted image tower."""
        raise NotImplementedError(f"{type(self).__name__} reads pixels and must implement image_batch()")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (R, B, C) of preprocessed pixels: CLIP's scaled cosine of :meth:`image_batch` and the class text."""
        return self.similarity_logits(self.image_batch(images), self.raw_text_features())

    def eval_pixel_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The part of the test-time logits that does not depend on the class set, (R, B, ...) of pixels
        (B, 3, H, W) seen by every run; default: :meth:`image_batch`."""
        return self.image_batch(pixels)

    def pixel_classifier(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The current class set's test-time logits (R, B, C) as a function of :meth:`eval_pixel_features`, with the
        class text encoded once, now (a later class set leaves it as is); default: the scaled cosine with
        ``text_features()``."""
        text = self.text_features()
        return lambda features: self.similarity_logits(features, text)
