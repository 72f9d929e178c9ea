"""MaPLe: deep text prompts coupled to the vision tower by per-layer linear maps (``docs/method-zoo.md``, section
MaPLe).

Learned tensors (R runs lead each one):

* ``ctx`` (R, M, d_t): the text input context, initialised as IVLP's (first M words of ``ctx_init`` learnable).
* ``deep_text`` (R, J - 1, M, d_t): one text prompt set per block 1..J-1, N(0, 0.02^2).
* ``coupling_weight`` (R, J, d_t, d_v) and ``coupling_bias`` (R, J, d_v): J independent Linear(d_t -> d_v) maps.
  Level 0 maps ``ctx`` to the visual input prompts, level k maps ``deep_text[k - 1]`` to the visual prompts of vision
  block k; **no independent visual parameters**. As in the reference, the J - 1 deep maps start as copies of
  **one** Linear and the input map separately (PyTorch's default Linear init).

With ViT-B/16 widths (d_t = 512, d_v = 768), M = 2 and J = 9 this is 1,024 + 393,984 + 8 * (1,024 + 393,984) =
3,555,072 parameters. The reference hard-codes 512 -> 768; here both widths come from the backbone. Everything else
(injection, logits, CE loss) is IVLP's (:mod:`atlas_fast.methods.ivlp`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from atlas_fast.methods.config import MethodConfig, OptimRecipe
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.ivlp import (IVLP, PAPER_CTX_INIT, check_context_init, check_depth, check_setting,
                                     normal_prompts)
from atlas_fast.methods.prompts import init_phrase


@dataclass(frozen=True)
class MaPLeConfig(MethodConfig):
    """MaPLe's prompt learner. Defaults: the reference base-to-new config (M = 2 "a photo of a" with its first two
    words learnable, J = 9). J = 1 is shallow MaPLe (input level only)."""

    n_ctx: int = 2
    ctx_init: str = PAPER_CTX_INIT
    depth: int = 9

    def __post_init__(self) -> None:
        super().__post_init__()
        check_context_init(type(self).__name__, self.n_ctx, self.ctx_init)
        if self.depth < 1:
            raise ValueError(f"MaPLeConfig.depth must be >= 1, got {self.depth}")


def maple_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[MaPLeConfig, OptimRecipe]:
    """MaPLe's recipe (``docs/method-zoo.md``, section Recipes; MaPLe repository configs).

    * base-to-new: J = 9, 5 epochs, batch 4, lr 0.0035.
    * cross-dataset (train on ImageNet): J = 3, 2 epochs (1 warmup + 1 at lr), batch 4, lr 0.0026.
    * ``original``: M = 2 (the first two words of "a photo of a" learnable, "of a" fixed); ``paper``: M = 4.
    * few-shot: the references define none (:class:`~atlas_fast.methods.config.MissingRecipe`).
    """
    n_ctx = 2 if family == "original" else 4
    config = MaPLeConfig(n_ctx=n_ctx, depth=3 if setting == "cross_dataset" else 9)
    check_setting("MaPLe", family, setting, config, ("base2new", "cross_dataset"))
    if setting == "cross_dataset":
        return config, OptimRecipe(epochs=2, batch_size=4, lr=0.0026)
    return config, OptimRecipe(epochs=5, batch_size=4, lr=0.0035)


class MaPLe(IVLP):
    """Multi-modal prompt learning: vision prompts are linear maps of the text prompts; reads pixels."""

    name = "maple"
    printed_name = "MaPLe"
    recipe_function = staticmethod(maple_recipe)
    depth_options = ("depth",)
    config_class = MaPLeConfig

    def text_context_shape(self) -> tuple[int, str]:
        return self.config.n_ctx, init_phrase(self.config.ctx_init)

    def create_prompts(self) -> None:
        depth, runs, device = self.config.depth, self.num_runs, self.ctx.device
        check_depth("MaPLe", "depth", depth, min(self.text_layers, self.image_encoder.layers), 1)
        self.deep_text = (nn.Parameter(normal_prompts((runs, depth - 1, self.n_ctx, self.text_width), device))
                          if depth > 1 else None)
        weights, biases = [], []
        for _ in range(runs):
            input_map = nn.Linear(self.text_width, self.vision_width)
            deep_map = nn.Linear(self.text_width, self.vision_width)  # copied to every deep level, as the reference
            maps = [input_map] + [copy.deepcopy(deep_map) for _ in range(depth - 1)]
            weights.append(torch.stack([m.weight.detach().t() for m in maps]))
            biases.append(torch.stack([m.bias.detach() for m in maps]))
        self.coupling_weight = nn.Parameter(torch.stack(weights).to(device))  # (R, J, d_t, d_v)
        self.coupling_bias = nn.Parameter(torch.stack(biases).to(device))  # (R, J, d_v)

    def vision_prompts(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Level k's visual prompts = F_k(text prompts of level k): (R, M, d_v) each."""
        ctx, deep = self.text_prompts()
        text = torch.stack([ctx] + deep, dim=1)  # (R, J, M, d_t)
        visual = torch.einsum("rjmt,rjtv->rjmv", text, self.coupling_weight) + self.coupling_bias.unsqueeze(2)
        levels = visual.unbind(1)
        return levels[0], list(levels[1:])


register_method(MaPLe)
