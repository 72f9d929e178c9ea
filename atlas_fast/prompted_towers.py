"""Deep prompts in CLIP's towers, run over open_clip's own modules (nothing in open_clip is patched).

The multi-modal methods (IVLP, MaPLe, PromptSRC; ``methods.md`` §6-§8) change the towers in two places:

* **input prompts**: text context tokens at positions 1..M of the embedded prompt (built by the method, see
  :mod:`atlas_fast.text_encoder`), and M_v visual tokens **appended after the patch tokens**, after the positional
  embedding and before ``ln_pre``: ``[CLS, patches, P_v]``. Visual prompts get ``ln_pre`` but no positional embedding;
  the class token stays at index 0 and is what the tower pools.
* **deep prompts**: at the *input* of block i, 1 <= i < J, the hidden states at the prompt slots are **replaced** by
  that block's own prompts (text: positions 1..M; vision: the last M_v tokens). Block 0 never gets a deep prompt, so
  depth J means the input prompt plus J - 1 deep sets. Deep prompts skip ``ln_pre`` and get no positional embedding.

:func:`run_blocks` is the block loop with that replacement; :class:`PromptedVisionEncoder` is the vision tower around
it (the text tower is :class:`atlas_fast.text_encoder.PromptTextEncoder`). Both take prompts with a leading run
dimension R (several runs trained together, ``methods/base.py``) and fold it into the batch.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import nn

from atlas_fast.backbones import Backbone

Slot = Literal["text", "vision"]


def runs_to_batch(prompts: torch.Tensor, per_run: int) -> torch.Tensor:
    """Prompts (R, M, w) repeated for each of ``per_run`` sequences of a run: (R * per_run, M, w), run-major."""
    if prompts.dim() != 3:
        raise ValueError(f"prompts must be (R, M, width), got {tuple(prompts.shape)}")
    runs, length, width = prompts.shape
    return prompts.unsqueeze(1).expand(runs, per_run, length, width).reshape(runs * per_run, length, width)


def replace_slot(x: torch.Tensor, prompts: torch.Tensor, slot: Slot) -> torch.Tensor:
    """Hidden states (N, L, w) with the prompt slot replaced by ``prompts`` (N, M, w): positions 1..M for text,
    the last M positions for vision. Functional (``torch.cat``), so gradients reach ``prompts`` and not the old
    states."""
    length = prompts.shape[1]
    prompts = prompts.to(x.dtype)
    if slot == "text":
        return torch.cat([x[:, :1], prompts, x[:, 1 + length:]], dim=1)
    return torch.cat([x[:, :x.shape[1] - length], prompts], dim=1)


def run_blocks(transformer: nn.Module, x: torch.Tensor, attn_mask: torch.Tensor | None,
               deep_prompts: Sequence[torch.Tensor], slot: Slot) -> torch.Tensor:
    """open_clip's ``Transformer.forward`` over (N, L, w) batch-first states, with ``deep_prompts[i - 1]`` (N, M, w)
    written into the prompt slot at the input of block i (1 <= i <= len(deep_prompts))."""
    blocks = transformer.resblocks
    if len(deep_prompts) >= len(blocks):
        raise ValueError(f"{len(deep_prompts)} deep prompt sets need more than the tower's {len(blocks)} blocks "
                         f"(depth J may be at most the number of blocks)")
    batch_first = getattr(transformer, "batch_first", True)
    for i, block in enumerate(blocks):
        if 1 <= i <= len(deep_prompts):
            x = replace_slot(x, deep_prompts[i - 1], slot)
        if batch_first:
            x = block(x, attn_mask=attn_mask)
        else:  # sequence-first blocks (older open_clip): LND inside the block only
            x = block(x.transpose(0, 1), attn_mask=attn_mask).transpose(0, 1)
    return x


def check_prompted_vision(visual: nn.Module) -> None:
    """Refuse vision towers that the visual prompts cannot be injected into as the references do."""
    needed = ("conv1", "class_embedding", "positional_embedding", "ln_pre", "transformer", "ln_post")
    missing = [name for name in needed if not hasattr(visual, name)]
    if missing:
        raise ValueError(f"Visual prompts need an open_clip VisionTransformer (class token + patch tokens); "
                         f"{type(visual).__name__} lacks {missing} (ResNet and timm towers are not supported)")
    if getattr(visual, "attn_pool", None) is not None or getattr(visual, "pool_type", "tok") != "tok":
        raise ValueError("Visual prompts need a tower pooled at the class token (pool_type 'tok', no attentional "
                         "pooler): average or attention pooling would pool the prompts too")


class PromptedVisionEncoder:
    """The frozen vision tower of ``backbone`` with optional input and deep visual prompts.

    Not an ``nn.Module`` (as :class:`~atlas_fast.text_encoder.PromptTextEncoder`): the frozen weights stay in the
    backbone. Without prompts it computes exactly ``model.encode_image``.
    """

    def __init__(self, backbone: Backbone) -> None:
        visual = backbone.model.visual
        check_prompted_vision(visual)
        self.visual = visual
        self.width = int(visual.class_embedding.shape[-1])
        self.layers = len(visual.transformer.resblocks)

    def __call__(self, pixels: torch.Tensor, prompts: torch.Tensor | None = None,
                 deep_prompts: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        return self.forward(pixels, prompts, deep_prompts)

    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        """Patch tokens + class token + positional embedding (B, 1 + P, w): everything before the prompts."""
        visual = self.visual
        x = visual.conv1(pixels.to(visual.conv1.weight.dtype))
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
        cls = visual.class_embedding.to(x.dtype).view(1, 1, -1).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + visual.positional_embedding.to(x.dtype)
        return visual.patch_dropout(x)

    def forward(self, pixels: torch.Tensor, prompts: torch.Tensor | None = None,
                deep_prompts: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Un-normalised image features (R, B, D).

        ``prompts``: input visual prompts (R, M_v, w) or None (then R = 1 and no deep prompts are allowed);
        ``deep_prompts``: one (R, M_v, w) tensor per block 1..J-1.
        """
        if pixels.dim() != 4:
            raise ValueError(f"pixels must be (B, 3, H, W), got {tuple(pixels.shape)}")
        if prompts is None and len(deep_prompts):
            raise ValueError("deep visual prompts need input visual prompts (they replace the appended tokens)")
        for p in ([prompts] if prompts is not None else []) + list(deep_prompts):
            if p.dim() != 3 or p.shape[-1] != self.width:
                raise ValueError(f"visual prompts must be (R, M_v, {self.width}), got {tuple(p.shape)}")
        x = self.embed(pixels)
        batch = x.shape[0]
        runs = 1
        if prompts is not None:
            runs = prompts.shape[0]
            x = x.unsqueeze(0).expand(runs, -1, -1, -1).reshape(runs * batch, *x.shape[1:])
            x = torch.cat([x, runs_to_batch(prompts, batch).to(x.dtype)], dim=1)
        x = self.visual.ln_pre(x)
        deep = [runs_to_batch(p, batch) for p in deep_prompts]
        x = run_blocks(self.visual.transformer, x, None, deep, "vision")
        pooled = self.visual.ln_post(x[:, 0])  # LayerNorm is per token: normalising token 0 alone is the same
        if self.visual.proj is not None:
            pooled = pooled @ self.visual.proj
        return pooled.reshape(runs, batch, -1)
