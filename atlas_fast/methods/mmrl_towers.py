"""The towers MMRL and MMRL++ share (:mod:`atlas_fast.methods.mmrl`, where their tensors, logits and loss are):
CLIP's frozen text and image towers with the representation tokens entering their top J blocks, as the base class
:class:`RepresentationTowers` (not registered).

At the input of the first prompted block the K mapped tokens of that block are inserted right after the first token
(SOT / class token), lengthening the sequence by K; each later prompted block is entered through
:meth:`RepresentationTowers.enter_block` with its own tokens (MMRL replaces positions 1..K). They get no positional
embedding and (vision) no ``ln_pre``; text stays causal and pools at EOT + K. Blocks below the first prompted one
are computed once per class set (text) or without a graph (image).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone
from atlas_fast.clip.prompted_towers import PromptedVisionEncoder, replace_slot, run_blocks
from atlas_fast.clip.text_encoder import PromptTextEncoder, tokenize_prompts
from atlas_fast.data.templates import fill_template
from atlas_fast.methods.config import MethodConfig
from atlas_fast.methods.pixel_method import PixelMethod


def tower_slice(transformer: nn.Module, start: int, stop: int | None = None) -> SimpleNamespace:
    """Blocks ``start:stop`` of an open_clip transformer as something :func:`run_blocks` runs (a plain object, so
    the frozen blocks never join a method's module tree)."""
    return SimpleNamespace(resblocks=list(transformer.resblocks)[start:stop],
                           batch_first=getattr(transformer, "batch_first", True),
                           grad_checkpointing=getattr(transformer, "grad_checkpointing", False))


class RepresentationTowers(PixelMethod):
    """The frozen towers with representation tokens in their top ``config.depth`` blocks (config fields ``depth``,
    ``n_rep_tokens``, ``template``). A subclass holds ``rep_tokens`` (R, K, r) and gives each block's tokens
    (:meth:`mapped_tokens`) and the projection of the pooled representation tokens
    (:meth:`representation_projection`); its ``__init__`` makes its tensors after this one's, then sets its class
    set."""

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        config = self.config
        model = backbone.model
        self.text_encoder = PromptTextEncoder(backbone)
        self.image_encoder = PromptedVisionEncoder(backbone)
        self.text_layers = len(model.transformer.resblocks)
        self.vision_layers = self.image_encoder.layers
        deepest = min(self.text_layers, self.vision_layers)
        if config.depth > deepest:
            raise ValueError(f"{self.printed_name}: depth must be in [1, {deepest}] (the towers have "
                             f"{self.text_layers} text / {self.vision_layers} vision blocks), got {config.depth}")
        self._lower_text: tuple | None = None

    def set_classnames(self, classnames: Sequence[str]) -> None:
        """Tokenize ``template.format(name)`` for every class; the frozen lower text blocks are rerun lazily."""
        if not classnames:
            raise ValueError("MMRL needs at least one class name")
        tokens = tokenize_prompts(self.backbone, fill_template(self.config.template, classnames), classnames)
        n_used = int(tokens.eot_index.max()) + 1
        self.classnames = tuple(classnames)
        self.token_ids = tokens.ids[:, :n_used]
        self.prompt_embeddings = tokens.embeddings[:, :n_used]
        self.eot_index = tokens.eot_index
        self._lower_text = None

    def mapped_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(text (R, J, K, d_t), vision (R, J, K, d_v)): each prompted block's tokens."""
        raise NotImplementedError

    def representation_projection(self) -> torch.Tensor:
        """(R, d_v, D): the projection of the representation tokens' pooled output."""
        raise NotImplementedError

    def enter_block(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The states (N, L, w) at the input of a prompted block after the first, given that block's mapped tokens
        (N, K, w): MMRL replaces positions 1..K by them (MMRL++ blends)."""
        return replace_slot(x, tokens, "text")

    def top_blocks(self, transformer: nn.Module, start: int, x: torch.Tensor, deep: Sequence[torch.Tensor],
                   mask: torch.Tensor | None, pooled_rows: torch.Tensor | None = None,
                   fused: bool = True) -> torch.Tensor:
        """Blocks ``start..`` of a tower over states that already hold the first block's tokens, each later block
        entered through :meth:`enter_block` with its tokens ``deep[j - 1]``; ``pooled_rows``: only those rows of
        the last block (the EOT of each prompt)."""
        blocks = len(transformer.resblocks)
        for j, index in enumerate(range(start, blocks)):
            if j:
                x = self.enter_block(x, deep[j - 1])
            last = index == blocks - 1
            x = run_blocks(tower_slice(transformer, index, index + 1), x, mask, [], "text", fused=fused,
                           pooled_rows=pooled_rows if last else None, causal=mask is not None)
        return x

    @torch.no_grad()
    def lower_text_states(self) -> torch.Tensor:
        """(C, n_used, d_t): the text states at the input of the first prompted block. No learned tensor reaches
        the blocks below it, so they run once per class set (fp32, outside autocast)."""
        device = self.rep_tokens.device
        if self._lower_text is None or self._lower_text[0].device != device:
            model = self.backbone.model
            start = self.text_layers - self.config.depth
            embeddings = self.prompt_embeddings.to(device)
            n_used = embeddings.shape[1]
            with torch.autocast(device.type, enabled=False):
                x = embeddings.to(model.transformer.get_cast_dtype()) + model.positional_embedding[:n_used]
                if start:
                    x = run_blocks(tower_slice(model.transformer, 0, start), x, model.attn_mask[:n_used, :n_used],
                                   [], "text", causal=True)
            self._lower_text = (x, self.eot_index.to(device))
        return self._lower_text[0]

    def raw_text_features(self, text_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Un-normalised class text features (R, C, D) of the prompted text tower."""
        if text_tokens is None:
            text_tokens = self.mapped_tokens()[0]
        lower = self.lower_text_states()
        model = self.backbone.model
        runs, classes, k = text_tokens.shape[0], lower.shape[0], self.config.n_rep_tokens
        dtype = model.transformer.get_cast_dtype()
        lower = lower.to(dtype)
        inserted = text_tokens[:, 0].to(dtype).unsqueeze(1).expand(runs, classes, k, lower.shape[-1])
        x = torch.cat([lower[:, :1].expand(runs, -1, -1, -1), inserted, lower[:, 1:].expand(runs, -1, -1, -1)],
                      dim=2).reshape(runs * classes, lower.shape[1] + k, -1)
        deep = [text_tokens[:, j].unsqueeze(1).expand(runs, classes, k, x.shape[-1]).reshape(runs * classes, k, -1)
                for j in range(1, text_tokens.shape[1])]
        length = x.shape[1]
        mask = torch.full((length, length), float("-inf"), device=x.device).triu_(1)
        eot = self._lower_text[1] + k
        start = self.text_layers - self.config.depth
        pooled = self.top_blocks(model.transformer, start, x, deep, mask, pooled_rows=eot.repeat(runs))
        return self.text_encoder.project(pooled).reshape(runs, classes, -1)

    def text_features(self) -> torch.Tensor:
        return F.normalize(self.raw_text_features(), dim=-1)

    def image_pair(self, pixels: torch.Tensor, vision_tokens: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Un-normalised (class-token features v, representation features v_r), each (R, B, D), of pixels
        (B, 3, H, W) seen by every run or (R, B, 3, H, W), one batch per run."""
        runs = self.num_runs
        self.check_pixels(pixels)
        if vision_tokens is None:
            vision_tokens = self.mapped_tokens()[1]
        visual = self.image_encoder.visual
        per_run = pixels.dim() == 5
        batch = pixels.shape[1] if per_run else pixels.shape[0]
        start = self.vision_layers - self.config.depth
        k = self.config.n_rep_tokens
        with torch.no_grad():  # nothing learned reaches the blocks below the first prompted one
            x = visual.ln_pre(self.image_encoder.embed(pixels.flatten(0, 1) if per_run else pixels))
            if start:
                x = run_blocks(tower_slice(visual.transformer, 0, start), x, None, [], "vision")
        if not per_run and runs > 1:
            x = x.unsqueeze(0).expand(runs, *x.shape).reshape(runs * batch, *x.shape[1:])
        width = x.shape[-1]
        inserted = vision_tokens[:, 0].to(x.dtype).unsqueeze(1).expand(runs, batch, k, width).reshape(-1, k, width)
        x = torch.cat([x[:, :1], inserted, x[:, 1:]], dim=1)
        deep = [vision_tokens[:, j].unsqueeze(1).expand(runs, batch, k, width).reshape(-1, k, width)
                for j in range(1, vision_tokens.shape[1])]
        x = self.top_blocks(visual.transformer, start, x, deep, None, fused=self.image_encoder.fused_attention)
        pooled = visual.ln_post(x[:, :1 + k])
        image = pooled[:, 0] @ visual.proj
        rep = pooled[:, 1:].mean(dim=1).view(runs, batch, width)
        rep = torch.einsum("rbw,rwd->rbd", rep, self.representation_projection().to(rep.dtype))
        return image.view(runs, batch, -1), rep
