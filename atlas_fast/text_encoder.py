"""CLIP's text tower applied to prompt *embeddings* (learned context + class tokens), truncated to the longest prompt.

This is CoOp's ``TextEncoder`` (``methods.md`` §1.2) on the open_clip model: x = prompts + positional embedding, the
causal transformer, ``ln_final``, the row at the EOT position, ``text_projection``. Under the causal mask the EOT
output depends only on positions <= EOT, so running just the first ``max(eot_index) + 1`` positions (slicing the
positional embedding and the mask) gives the same features and gradients as the full 77-token pass, at a fraction of
the cost for short prompts. That stays exact with deep text prompts (IVLP, MaPLe, PromptSRC), which replace positions
1..M at the input of blocks 1..J-1 (:func:`atlas_fast.prompted_towers.run_blocks`): every replaced position is before
the EOT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from atlas_fast.backbones import Backbone
from atlas_fast.prompted_towers import run_blocks, runs_to_batch


@dataclass(frozen=True)
class PromptTokens:
    """Tokenized prompt strings: ids (N, L), their frozen token embeddings (N, L, d) and EOT positions (N,)."""

    ids: torch.Tensor
    embeddings: torch.Tensor
    eot_index: torch.Tensor


def eot_positions(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Where the text tower pools each sequence: argmax of the ids (EOT has the largest id in CLIP's vocabulary),
    or the first ``text_eos_id`` for models pooled with ``eos``."""
    pool_type = getattr(model, "text_pool_type", "argmax")
    if pool_type == "argmax":
        return ids.argmax(dim=-1)
    if pool_type == "eos":
        return (ids == model.text_eos_id).int().argmax(dim=-1)
    raise ValueError(f"Prompt tuning needs a text tower pooled at the EOT token ('argmax' or 'eos'); this model pools "
                     f"with {pool_type!r}")


@torch.no_grad()
def tokenize_prompts(backbone: Backbone, texts: Sequence[str], labels: Sequence[str] | None = None) -> PromptTokens:
    """Tokenize strings with the backbone's tokenizer and look up their (frozen) token embeddings. A text that does
    not fit the context length is a ValueError naming it (and its label, e.g. the class name), never cut."""
    model = backbone.model
    ids = backbone.tokenize(texts, labels).to(backbone.device)
    embeddings = model.token_embedding(ids).to(model.transformer.get_cast_dtype())
    return PromptTokens(ids=ids, embeddings=embeddings, eot_index=eot_positions(model, ids))


class PromptTextEncoder:
    """The frozen text tower of ``backbone`` as a function of prompt embeddings.

    Not an ``nn.Module`` on purpose: it owns no tensors (it uses the backbone's), so methods holding one keep the
    frozen CLIP out of their parameters, checkpoints and ``train()``/``eval()`` switches.
    """

    def __init__(self, backbone: Backbone) -> None:
        model = backbone.model
        eot_positions(model, torch.zeros(1, 1, dtype=torch.long))  # fail early on a tower not pooled at EOT
        self.model = model
        self.context_length = int(model.positional_embedding.shape[0])
        self.width = int(model.positional_embedding.shape[1])
        # Truncation is exact only under a causal mask; a tower without one runs every position it is given.
        self.causal = getattr(model, "attn_mask", None) is not None

    def __call__(self, prompt_embeddings: torch.Tensor, eot_index: torch.Tensor,
                 deep_prompts: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        if len(deep_prompts):
            return self.forward(prompt_embeddings, eot_index, deep_prompts)
        return self.forward(prompt_embeddings, eot_index)  # the two-argument call the text-only methods make

    def forward(self, prompt_embeddings: torch.Tensor, eot_index: torch.Tensor,
                deep_prompts: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Un-normalised text features (..., C, D) of prompt embeddings (..., C, L, d) pooled at ``eot_index``.

        ``eot_index`` is (C,) (shared by the leading dims, e.g. the R runs) or has the full leading shape (..., C).
        ``L`` may be anything from ``max(eot_index) + 1`` to the context length. ``deep_prompts``: one (R, M, d)
        tensor per block 1..J-1 (R = the product of the leading dims before C), written into positions 1..M.
        """
        if prompt_embeddings.dim() < 3 or prompt_embeddings.shape[-1] != self.width:
            raise ValueError(f"prompt_embeddings must be (..., C, L, {self.width}), got {tuple(prompt_embeddings.shape)}")
        *lead, length, width = prompt_embeddings.shape
        if length > self.context_length:
            raise ValueError(f"prompts have {length} positions, more than the context length {self.context_length}")
        eot_index = eot_index.to(prompt_embeddings.device).long().expand(*lead)
        n_used = int(eot_index.max()) + 1 if self.causal else length
        if n_used > length:
            raise ValueError(f"eot_index points at position {n_used - 1} but prompts have only {length} positions")

        model = self.model
        x = prompt_embeddings[..., :n_used, :].reshape(-1, n_used, width)
        x = x.to(model.transformer.get_cast_dtype()) + model.positional_embedding[:n_used].to(x.dtype)
        mask = model.attn_mask[:n_used, :n_used] if self.causal else None
        if deep_prompts:
            runs = math.prod(lead[:-1])
            deep = [runs_to_batch(p.reshape(runs, *p.shape[-2:]), lead[-1]) for p in deep_prompts]
            if any(p.shape[1] >= int(eot_index.min()) for p in deep):
                raise ValueError(f"deep text prompts of {deep[0].shape[1]} tokens would overwrite an EOT token "
                                 f"(the earliest is at position {int(eot_index.min())})")
            x = run_blocks(model.transformer, x, mask, deep, "text")
        else:
            x = model.transformer(x, attn_mask=mask)
        x = model.ln_final(x)
        x = x[torch.arange(x.shape[0], device=x.device), eot_index.reshape(-1)]
        projection = model.text_projection
        if isinstance(projection, nn.Linear):
            x = projection(x)
        elif projection is not None:
            x = x @ projection
        return x.reshape(*lead, x.shape[-1])
