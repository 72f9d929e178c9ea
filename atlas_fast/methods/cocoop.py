"""CoCoOp: CoOp's context shifted per image by a meta-net on the image feature (``docs/method-zoo.md``, section CoCoOp).

For image i, ``ctx_i = ctx + meta_net(f_v,i)`` with f_v,i the **normalised** image feature and the same bias added
to every one of the M context tokens; the C class prompts of image i are ``[SOT][ctx_i][class tokens][.][EOT]``,
so a batch of B images costs B x C text sequences (truncated to the longest EOT, as CoOp's are). The meta-net is
Linear(D_v -> D_v // 16) -> ReLU -> Linear(D_v // 16 -> d) with D_v the image embedding dim and d the text width
(512 -> 32 -> 512 for ViT-B/16). Image features come from the cache; the meta-net sits after the frozen image
encoder, so no image-side graph exists. All of CoCoOp's math is in this file.

Evaluation encodes at most :attr:`CoCoOp.eval_sequences` sequences per text-encoder call, so memory is bounded by
that budget, not by the test set (ImageNet: 50,000 x 1,000 sequences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn
from atlas_fast.progress import progress_bar

from atlas_fast.clip.backbones import Backbone
from atlas_fast.methods.config import MissingRecipe, OptimRecipe, check_family
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.coop import PAPER_CTX_INIT, CoOp, CoOpConfig
from atlas_fast.vocabulary import RecipeFamily, Setting

META_NET_REDUCTION = 16


@dataclass(frozen=True)
class CoCoOpConfig(CoOpConfig):
    """CoCoOp's prompt learner: CoOp's shared context with the class name at the end (no class-specific context,
    no other class position, as in the reference) plus the meta-net. Reference defaults: 16 random tokens; its
    configs use "a photo of a"."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.csc:
            raise ValueError("CoCoOpConfig: csc must be False (CoCoOp has one context shared by all classes)")
        if self.class_token_position != "end":
            raise ValueError(f"CoCoOpConfig: class_token_position must be 'end' (CoCoOp puts the class name after "
                             f"the context), got {self.class_token_position!r}")


def cocoop_recipe(family: RecipeFamily, setting: Setting, shots: int, dataset: str) -> tuple[CoCoOpConfig, OptimRecipe]:
    """CoCoOp's recipe (``docs/method-zoo.md``, section Recipes): ``vit_b16_c4_ep10_batch1_ctxv1`` for base-to-new and
    cross-dataset, 10 epochs, batch 1, lr 0.002, M = 4 from "a photo of a" in both families (the paper's choice is the
    CoCoOp config's). The references have no few-shot CoCoOp recipe: that setting raises :class:`MissingRecipe`."""
    check_family("CoCoOp", family)
    config = CoCoOpConfig(ctx_init=PAPER_CTX_INIT)
    if setting not in ("base2new", "cross_dataset"):
        raise MissingRecipe("CoCoOp", setting, config)
    return config, OptimRecipe(epochs=10, batch_size=1, lr=0.002)


class CoCoOp(CoOp):
    """CoCoOp on cached image features. Learned tensors: ``ctx`` (R, M, d) and the meta-net of every run,
    ``meta_weight1`` (R, H, D_v), ``meta_bias1`` (R, H), ``meta_weight2`` (R, d, H), ``meta_bias2`` (R, d)."""

    name = "cocoop"
    printed_name = "CoCoOp"
    recipe_function = staticmethod(cocoop_recipe)
    config_class = CoCoOpConfig
    supports_batched_runs = True  # ctx and the meta-net's weights lead with R (tests/test_batched.py)
    #: text sequences per text-encoder call at evaluation (images per call = max(1, eval_sequences // C)).
    eval_sequences: int = 4096

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: CoCoOpConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        vis_dim = backbone.embed_dim
        hidden = vis_dim // META_NET_REDUCTION
        if hidden < 1:
            raise ValueError(f"CoCoOp's meta-net hidden width is embed_dim // {META_NET_REDUCTION}, which is 0 for "
                             f"embed_dim {vis_dim}")
        width = self.ctx.shape[-1]
        # One torch Linear per layer and run, so each run starts from PyTorch's default init, drawn after ctx.
        layers = [(nn.Linear(vis_dim, hidden), nn.Linear(hidden, width)) for _ in range(self.num_runs)]
        device = self.ctx.device
        self.meta_weight1 = nn.Parameter(torch.stack([a.weight.detach() for a, _ in layers]).to(device))
        self.meta_bias1 = nn.Parameter(torch.stack([a.bias.detach() for a, _ in layers]).to(device))
        self.meta_weight2 = nn.Parameter(torch.stack([b.weight.detach() for _, b in layers]).to(device))
        self.meta_bias2 = nn.Parameter(torch.stack([b.bias.detach() for _, b in layers]).to(device))

    def meta_net(self, image_features: torch.Tensor) -> torch.Tensor:
        """The per-image context bias pi (R, B, d) of normalised image features (1 or R, B, D_v)."""
        x = image_features.to(self.meta_weight1.dtype).expand(self.num_runs, -1, -1)
        hidden = torch.relu(torch.baddbmm(self.meta_bias1.unsqueeze(1), x, self.meta_weight1.transpose(1, 2)))
        return torch.baddbmm(self.meta_bias2.unsqueeze(1), hidden, self.meta_weight2.transpose(1, 2))

    def class_text_features(self, image_features: torch.Tensor) -> torch.Tensor:
        """Un-normalised text features (R, B, C, D): image b's C prompts carry ctx + meta_net(normalise(f_b))."""
        normalised = nn.functional.normalize(image_features, dim=-1)
        ctx = self.ctx.unsqueeze(1) + self.meta_net(normalised).unsqueeze(2)  # (R, B, M, d): one bias per token
        return self.class_prompts.encode(self.text_encoder, ctx)

    def raw_text_features(self) -> torch.Tensor:
        raise TypeError("CoCoOp's class text depends on the image: use class_text_features(image_features)")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (R, B, C), each image scored against its own conditioned class prompts."""
        image_features = self.image_batch(images)
        return self.similarity_logits(image_features, self.class_text_features(image_features))

    def eval_chunk(self) -> int:
        """Images per text-encoder call at evaluation: the sequence budget over the class count (at least 1)."""
        return max(1, self.eval_sequences // max(1, len(self.classnames) * self.num_runs))

    @torch.no_grad()
    def eval_logit_chunks(self, features: torch.Tensor) -> Iterator[torch.Tensor]:
        """Logits (R, n, C) of :meth:`eval_chunk` images at a time (one text-encoder call each)."""
        chunks = features.split(self.eval_chunk())
        device = self.device
        with progress_bar(chunks, desc=f"eval {self.name} ({len(self.classnames)} classes)", unit="chunk",
                          enabled=len(chunks) > 1, leave=False) as bar:
            for x in bar:
                yield self(x.to(device)).float()


register_method(CoCoOp)
