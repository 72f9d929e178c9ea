"""Deep prompts in CLIP's towers, run over open_clip's own modules (nothing in open_clip is patched).

The multi-modal methods (IVLP, MaPLe, PromptSRC) add input prompts (text positions 1..M; M_v visual tokens appended
after the patch tokens, ``[CLS, patches, P_v]``) and deep prompts that **replace** the prompt slots at the input of
blocks 1..J-1, as ``docs/method-zoo.md`` (section IVLP) specifies.

:func:`run_blocks` is the block loop with that replacement; :class:`PromptedVisionEncoder` is the vision tower around
it (the text tower is :class:`atlas_fast.clip.text_encoder.PromptTextEncoder`). Both take prompts with a leading run
dimension R (several runs trained together, ``methods/base.py``) and fold it into the batch.

**Fused attention.** open_clip's ``nn.MultiheadAttention`` transposes the sequence, splits heads and adds the causal
mask as a float tensor; :func:`fused_block` computes the same block from its own weights with one input-projection
matmul and ``F.scaled_dot_product_attention``, for the blocks it reproduces exactly
(:func:`fused_attention_supported`); any other block (gradient checkpointing included) runs its own ``forward``. When
one row per sequence is pooled, the fused last block computes only that row (:func:`pooled_block`).
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import nn
import torch.nn.functional as F
from open_clip.transformer import ResidualAttentionBlock

from atlas_fast.clip.backbones import Backbone

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


def fused_attention_supported(block: nn.Module) -> bool:
    """Whether :func:`fused_block` computes exactly what ``block.forward`` does: an open_clip
    ``ResidualAttentionBlock`` (forward not overridden) with a plain self-attention ``nn.MultiheadAttention`` (packed
    input projection, no extra key/value biases, no dropout in training) that no forward hook observes."""
    attn = getattr(block, "attn", None)
    if not isinstance(block, ResidualAttentionBlock) or not isinstance(attn, nn.MultiheadAttention):
        return False
    if (type(block).forward is not ResidualAttentionBlock.forward
            or type(block).attention is not ResidualAttentionBlock.attention or hasattr(block, "ln_1_kv")):
        return False
    if (not attn._qkv_same_embed_dim or attn.in_proj_weight is None or attn.bias_k is not None
            or attn.bias_v is not None or attn.add_zero_attn or (attn.dropout > 0 and attn.training)):
        return False
    return not (block._forward_hooks or block._forward_pre_hooks or attn._forward_hooks or attn._forward_pre_hooks)


def fused_tower_supported(transformer: nn.Module) -> bool:
    """Every block of ``transformer`` can run fused (and gradient checkpointing, which only the module loop does,
    is off)."""
    return (not getattr(transformer, "grad_checkpointing", False)
            and all(fused_attention_supported(block) for block in transformer.resblocks))


def is_causal_mask(mask: torch.Tensor) -> bool:
    """True for CLIP's additive causal mask: 0 on and below the diagonal, -inf above it."""
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        return False
    above = torch.ones(mask.shape, dtype=torch.bool, device=mask.device).triu(1)
    return bool(torch.equal(torch.isneginf(mask), above) and not mask.masked_fill(above, 0).any())


def attention_input(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``ln_1`` and the packed q/k/v projection of a block: (..., w) -> (..., 3w), one matmul."""
    attn = block.attn
    return F.linear(block.ln_1(x), attn.in_proj_weight, attn.in_proj_bias)


def block_residuals(block: nn.Module, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The rest of a block after attention: ``x + ls_1(out_proj(attended))``, then ``+ ls_2(mlp(ln_2(.)))``.
    ``attended`` is the attention output with the heads merged, shaped as ``x``."""
    attn = block.attn
    x = x + block.ls_1(F.linear(attended, attn.out_proj.weight, attn.out_proj.bias))
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (N, heads, L, w / heads) of a packed projection (N, L, 3w)."""
    n, length, width3 = qkv.shape
    return qkv.view(n, length, 3, heads, width3 // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(N, heads, L, d) -> (N, L, heads * d)."""
    n, heads, length, dim = x.shape
    return x.transpose(1, 2).reshape(n, length, heads * dim)


def fused_block(block: nn.Module, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """``block(x)`` for batch-first states (N, L, w) with one input-projection matmul and
    ``F.scaled_dot_product_attention`` (causal for text). Only for blocks :func:`fused_attention_supported` accepts."""
    q, k, v = split_heads(attention_input(block, x), block.attn.num_heads)
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return block_residuals(block, x, merge_heads(attended))


def pooled_block(block: nn.Module, x: torch.Tensor, rows: torch.Tensor, causal: bool) -> torch.Tensor:
    """``block(x)[n, rows[n]]`` (N, w) for states (N, L, w): the last block of a tower whose output is pooled at one
    row per sequence (the class token, the EOT). Keys and values come from every row (causally: rows <= the pooled
    one), but the query, output projection and MLP run for the pooled rows only. Same arithmetic per row as
    :func:`fused_block`."""
    attn = block.attn
    n, length, width = x.shape
    heads = attn.num_heads
    bias = attn.in_proj_bias
    h = block.ln_1(x)
    picked = torch.arange(n, device=x.device)
    q = F.linear(h[picked, rows], attn.in_proj_weight[:width], None if bias is None else bias[:width])
    kv = F.linear(h, attn.in_proj_weight[width:], None if bias is None else bias[width:])
    k, v = kv.view(n, length, 2, heads, width // heads).permute(2, 0, 3, 1, 4).unbind(0)
    mask = None
    if causal:
        mask = (torch.arange(length, device=x.device) <= rows.unsqueeze(1)).view(n, 1, 1, length)
    attended = F.scaled_dot_product_attention(q.view(n, heads, 1, width // heads), k, v, attn_mask=mask)
    return block_residuals(block, x[picked, rows], attended.reshape(n, width))


def run_blocks(transformer: nn.Module, x: torch.Tensor, attn_mask: torch.Tensor | None,
               deep_prompts: Sequence[torch.Tensor], slot: Slot, fused: bool = True,
               pooled_rows: torch.Tensor | None = None, causal: bool | None = None) -> torch.Tensor:
    """open_clip's ``Transformer.forward`` over (N, L, w) batch-first states, with ``deep_prompts[i - 1]`` (N, M, w)
    written into the prompt slot at the input of block i (1 <= i <= len(deep_prompts)).

    ``fused``: run the blocks with :func:`fused_block` where every block supports it and ``attn_mask`` is None or
    CLIP's causal mask (``causal=True``: the caller has checked that it is; None: it is inspected here); otherwise
    each block runs its own ``forward``. ``pooled_rows`` (N,): return only row ``pooled_rows[n]`` of sequence n,
    (N, w); fused, the last block computes only those rows (:func:`pooled_block`)."""
    blocks = transformer.resblocks
    if len(deep_prompts) >= len(blocks):
        raise ValueError(f"{len(deep_prompts)} deep prompt sets need more than the tower's {len(blocks)} blocks "
                         f"(depth J may be at most the number of blocks)")
    if fused and attn_mask is not None and causal is None:
        causal = is_causal_mask(attn_mask)
    fused = fused and fused_tower_supported(transformer) and (attn_mask is None or bool(causal))
    batch_first = getattr(transformer, "batch_first", True)
    for i, block in enumerate(blocks):
        if 1 <= i <= len(deep_prompts):
            x = replace_slot(x, deep_prompts[i - 1], slot)
        if fused and pooled_rows is not None and i == len(blocks) - 1:
            return pooled_block(block, x, pooled_rows.to(x.device), causal=attn_mask is not None)
        if fused:
            x = fused_block(block, x, causal=attn_mask is not None)
        elif batch_first:
            x = block(x, attn_mask=attn_mask)
        else:  # sequence-first blocks (older open_clip): LND inside the block only
            x = block(x.transpose(0, 1), attn_mask=attn_mask).transpose(0, 1)
    if pooled_rows is not None:
        return x[torch.arange(x.shape[0], device=x.device), pooled_rows.to(x.device)]
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

    Not an ``nn.Module``, as :class:`~atlas_fast.clip.text_encoder.PromptTextEncoder`. Without prompts it computes
    exactly ``model.encode_image``; with prompts the blocks run fused when :attr:`fused_attention` is on (the default).
    """

    def __init__(self, backbone: Backbone) -> None:
        visual = backbone.model.visual
        check_prompted_vision(visual)
        self.visual = visual
        self.width = int(visual.class_embedding.shape[-1])
        self.layers = len(visual.transformer.resblocks)
        #: prompted passes run the blocks fused (:func:`fused_block`); the unprompted pass is always the module's
        #: own, so it stays bit-identical to ``encode_image`` (the cached features).
        self.fused_attention = True

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

        ``pixels``: (B, 3, H, W), the same images for every run, or (R, B, 3, H, W), one batch per run (R runs
        trained together: each image goes through the tower once, with its own run's prompts); ``prompts``: input
        visual prompts (R, M_v, w) or None (then no deep prompts are allowed); ``deep_prompts``: one (R, M_v, w)
        tensor per block 1..J-1.
        """
        if pixels.dim() not in (4, 5):
            raise ValueError(f"pixels must be (B, 3, H, W) or (R, B, 3, H, W), got {tuple(pixels.shape)}")
        if prompts is None and len(deep_prompts):
            raise ValueError("deep visual prompts need input visual prompts (they replace the appended tokens)")
        for p in ([prompts] if prompts is not None else []) + list(deep_prompts):
            if p.dim() != 3 or p.shape[-1] != self.width:
                raise ValueError(f"visual prompts must be (R, M_v, {self.width}), got {tuple(p.shape)}")
        per_run = pixels.dim() == 5
        runs = pixels.shape[0] if per_run else prompts.shape[0] if prompts is not None else 1
        if per_run and prompts is not None and prompts.shape[0] != runs:
            raise ValueError(f"{runs} runs' pixels but visual prompts of {prompts.shape[0]} runs")
        batch = pixels.shape[1] if per_run else pixels.shape[0]
        x = self.embed(pixels.flatten(0, 1) if per_run else pixels)
        if not per_run and runs > 1:  # every run sees the same images: their patch embedding is computed once
            x = x.unsqueeze(0).expand(runs, -1, -1, -1).reshape(runs * batch, *x.shape[1:])
        if prompts is not None:
            x = torch.cat([x, runs_to_batch(prompts, batch).to(x.dtype)], dim=1)
        x = self.visual.ln_pre(x)
        deep = [runs_to_batch(p, batch) for p in deep_prompts]
        x = run_blocks(self.visual.transformer, x, None, deep, "vision",
                       fused=self.fused_attention and prompts is not None,
                       pooled_rows=torch.zeros(x.shape[0], dtype=torch.long, device=x.device))
        pooled = self.visual.ln_post(x)  # the class token; LayerNorm is per token, so normalising it alone is the same
        if self.visual.proj is not None:
            pooled = pooled @ self.visual.proj
        return pooled.reshape(runs, batch, -1)
