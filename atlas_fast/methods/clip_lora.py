"""CLIP-LoRA (Zanella & Ben Ayed, CVPR Workshops 2024): low-rank adapters on the attention projections of CLIP's
text and/or image tower, trained with cross-entropy on "a photo of a {}." prompts (``docs/method-zoo.md``, section
CLIP-LoRA; reference MaxZanella/CLIP-LoRA).

    P(h) = W_P h + b_P + (α / sqrt(r)) B_P A_P dropout(h)       A_P (r, w) Kaiming-uniform, B_P (w, r) = 0 at init

for P in ``q``, ``k``, ``v``, ``o`` as targeted (the reference's α / sqrt(r) and input-only dropout); logits
100 cos(v, t). ``clip-lora`` (:class:`CLIPLoRA`) reads pixels; ``clip-lora-text`` (:class:`CLIPLoRAText`) adapts the
text tower only and trains from cached image features. Learned tensors per adapted tower (``text`` / ``vision``):
``<tower>_lora_a`` (R, blocks, targets, r, w) and ``<tower>_lora_b`` (R, blocks, targets, w, r).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone
from atlas_fast.clip.prompted_towers import PromptedVisionEncoder, fused_attention_supported, merge_heads, split_heads
from atlas_fast.clip.text_encoder import PromptTextEncoder, tokenize_prompts
from atlas_fast.data.templates import check_template, fill_template
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import MethodConfig, OptimRecipe, check_family
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.pixel_method import PixelMethod

Encoder = Literal["text", "vision", "both"]
ENCODERS = ("text", "vision", "both")
TARGETS = "qkvo"
# The reference's named block sets (its --position choices) for 12-block towers; "all", "half-up" and
# "half-bottom" are defined for any depth (the reference's ViT-L/14 vision tower uses the halves of 24 blocks).
TWELVE_BLOCK_POSITIONS = {"bottom": range(0, 4), "mid": range(4, 8), "up": range(8, 12), "top3": range(9, 12)}
POSITIONS = ("all", "half-up", "half-bottom", *TWELVE_BLOCK_POSITIONS)


def adapted_blocks(position: str, layers: int) -> list[int]:
    """The indices of the blocks ``position`` adapts in a tower of ``layers`` blocks."""
    if position == "all":
        return list(range(layers))
    if position == "half-up":
        return list(range(layers // 2, layers))
    if position == "half-bottom":
        return list(range(layers // 2))
    if layers != 12:
        raise ValueError(f"CLIP-LoRA position {position!r} names blocks of a 12-block tower; this one has {layers} "
                         f"(use 'all', 'half-up' or 'half-bottom')")
    return list(TWELVE_BLOCK_POSITIONS[position])


@dataclass(frozen=True)
class CLIPLoRAConfig(MethodConfig):
    """CLIP-LoRA's adapters (the reference's defaults): both towers, every block, q/k/v, rank 2, α = 1, dropout
    0.25, the template "a photo of a {}." and the logit scale 100. ``targets``: the adapted projections, letters of
    ``qkvo``."""

    encoder: Encoder = "both"
    position: str = "all"
    targets: str = "qkv"
    rank: int = 2
    alpha: float = 1.0
    dropout: float = 0.25
    template: str = "a photo of a {}."
    logit_scale: float = 100.0

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        if self.encoder not in ENCODERS:
            raise ValueError(f"{owner}.encoder must be one of {ENCODERS}, got {self.encoder!r}")
        if self.position not in POSITIONS:
            raise ValueError(f"{owner}.position must be one of {POSITIONS}, got {self.position!r}")
        if not self.targets or any(t not in TARGETS for t in self.targets) or len(set(self.targets)) != len(
                self.targets):
            raise ValueError(f"{owner}.targets must be distinct letters of {TARGETS!r} (q, k, v and the output "
                             f"projection o), got {self.targets!r}")
        if self.rank < 1:
            raise ValueError(f"{owner}.rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"{owner}.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{owner}.dropout must be in [0, 1), got {self.dropout}")
        if not self.logit_scale > 0:
            raise ValueError(f"{owner}.logit_scale must be > 0, got {self.logit_scale}")
        check_template(self.template, owner)

    @property
    def scaling(self) -> float:
        """α / sqrt(r), the reference's scaling of B A."""
        return self.alpha / math.sqrt(self.rank)

    @property
    def towers(self) -> tuple[str, ...]:
        return ("text", "vision") if self.encoder == "both" else (self.encoder,)


@dataclass(frozen=True)
class CLIPLoRATextConfig(CLIPLoRAConfig):
    """CLIP-LoRA with adapters on the text tower only (trained from cached image features)."""

    encoder: Encoder = "text"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.encoder != "text":
            raise ValueError(f"clip-lora-text adapts the text tower only (encoder='text'), got {self.encoder!r}; "
                             f"use clip-lora (pixels) for the vision tower")


def lora_recipe(config: CLIPLoRAConfig, shots: int) -> tuple[CLIPLoRAConfig, OptimRecipe]:
    """The reference's one recipe for every dataset and shot count: 500 x K iterations of batch 32, AdamW (lr 2e-4,
    weight decay 1e-2, betas 0.9 / 0.999), a cosine over the iterations down to 1e-6, no warmup."""
    return config, OptimRecipe(epochs=1, batch_size=32, lr=2e-4, weight_decay=1e-2, warmup_epochs=0,
                               optimizer="adamw", betas=(0.9, 0.999), iterations=500 * shots, min_lr=1e-6)


def clip_lora_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[CLIPLoRAConfig, OptimRecipe]:
    """CLIP-LoRA's recipe (MaxZanella/CLIP-LoRA's defaults): adapters on both towers, all blocks, q/k/v, r = 2,
    α = 1, dropout 0.25, and :func:`lora_recipe`. The reference fixes it for every task and shot count, so
    base-to-new and cross-dataset train with it too (500 x 16 iterations at 16 shots); both families are the same
    (there is no prompt to initialise)."""
    check_family("CLIP-LoRA", family)
    return lora_recipe(CLIPLoRAConfig(), shots)


def clip_lora_text_recipe(family: str, setting: str, shots: int,
                          dataset: str) -> tuple[CLIPLoRATextConfig, OptimRecipe]:
    """:func:`clip_lora_recipe` with adapters on the text tower only (the reference's ``--encoder text``)."""
    check_family("CLIP-LoRA", family)
    return lora_recipe(CLIPLoRATextConfig(), shots)


def lora_attention_block(block: nn.Module, x: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None,
                         targets: str, scaling: float, dropout: float, training: bool, causal: bool) -> torch.Tensor:
    """An open_clip residual attention block on states (R, N, L, w) with LoRA on the ``targets`` projections:
    ``a`` (R, len(targets), r, w) and ``b`` (R, len(targets), w, r), or None for a block without adapters."""
    attn = block.attn
    runs, n, length, width = x.shape
    heads = attn.num_heads

    def adapted(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, letter: str) -> torch.Tensor:
        out = F.linear(h, weight, bias)
        if a is None or letter not in targets:
            return out
        j = targets.index(letter)
        low = torch.einsum("rnlw,rkw->rnlk", F.dropout(h, dropout, training), a[:, j].to(h.dtype))
        return out + scaling * torch.einsum("rnlk,rwk->rnlw", low, b[:, j].to(h.dtype))

    h = block.ln_1(x)
    weight, bias = attn.in_proj_weight, attn.in_proj_bias
    q, k, v = (adapted(h, weight[i * width:(i + 1) * width], None if bias is None else bias[i * width:(i + 1) * width],
                       letter) for i, letter in enumerate("qkv"))
    qkv = torch.cat([q, k, v], dim=-1).reshape(runs * n, length, 3 * width)
    attended = merge_heads(F.scaled_dot_product_attention(*split_heads(qkv, heads), is_causal=causal))
    out = adapted(attended.view(runs, n, length, width), attn.out_proj.weight, attn.out_proj.bias, "o")
    x = x + block.ls_1(out)
    return x + block.ls_2(block.mlp(block.ln_2(x)))


class LoRATowers(PromptMethod):
    """What both CLIP-LoRA classes are: the adapters on the towers the config names, the class text of the template
    through the (adapted) text tower, and the reference's fixed logit scale (not registered itself)."""

    config_class = CLIPLoRAConfig

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: CLIPLoRAConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        model = backbone.model
        self._logit_scale: torch.Tensor | None = None  # made on first use, on the device (:attr:`logit_scale`)
        self.text_encoder = PromptTextEncoder(backbone)
        self.blocks: dict[str, list[int]] = {}
        device = backbone.device
        for tower in config.towers:  # text first, as the reference adds its adapters
            transformer = model.transformer if tower == "text" else model.visual.transformer
            if not all(fused_attention_supported(block) for block in transformer.resblocks):
                raise ValueError(f"CLIP-LoRA adapts open_clip's standard attention blocks; the {tower} tower of "
                                 f"{backbone.config.model} has others")
            if tower == "text" and not self.text_encoder.clip_causal_mask:
                raise ValueError("CLIP-LoRA's text pass needs CLIP's causal text tower")
            blocks = adapted_blocks(config.position, len(transformer.resblocks))
            width = int(transformer.resblocks[0].attn.embed_dim)
            # A: the reference's kaiming_uniform_(a=sqrt(5)) of each (r, w) matrix, i.e. U(-1/sqrt(w), 1/sqrt(w));
            # B: zeros, so the adapted towers start as CLIP's own
            a = torch.empty(self.num_runs, len(blocks), len(config.targets), config.rank, width, device=device)
            setattr(self, f"{tower}_lora_a", nn.Parameter(nn.init.uniform_(a, -width ** -0.5, width ** -0.5)))
            setattr(self, f"{tower}_lora_b", nn.Parameter(torch.zeros(self.num_runs, len(blocks),
                                                                      len(config.targets), width, config.rank,
                                                                      device=device)))
            self.blocks[tower] = blocks
        self.set_classnames(classnames)

    @property
    def logit_scale(self) -> torch.Tensor:
        """The reference's fixed 100 (``logit_scale``), not the backbone's temperature: a device constant made once
        per device (a tensor made from the host number in every forward would be an upload in every step, which a
        CUDA graph cannot replay)."""
        device = self.device
        scale = self._logit_scale
        if scale is None or scale.device != device:
            scale = self._logit_scale = torch.full((), float(self.config.logit_scale), device=device)
        return scale

    def set_classnames(self, classnames: Sequence[str]) -> None:
        """Tokenize the template for every class (the adapters are kept)."""
        if not classnames:
            raise ValueError("CLIP-LoRA needs at least one class name")
        tokens = tokenize_prompts(self.backbone, fill_template(self.config.template, classnames), classnames)
        n_used = int(tokens.eot_index.max()) + 1
        self.classnames = tuple(classnames)
        device = self.device
        self.register_buffer("token_ids", tokens.ids.to(device), persistent=False)
        self.register_buffer("embeddings", tokens.embeddings[:, :n_used].to(device), persistent=False)
        self.register_buffer("eot_index", tokens.eot_index.to(device), persistent=False)
        self._frozen_text = None

    def run_tower(self, tower: str, transformer: nn.Module, x: torch.Tensor, causal: bool) -> torch.Tensor:
        """``transformer``'s blocks over states (R, N, L, w), the adapted ones with this run's adapters."""
        config = self.config
        a, b = getattr(self, f"{tower}_lora_a", None), getattr(self, f"{tower}_lora_b", None)
        blocks = self.blocks.get(tower, [])
        for i, block in enumerate(transformer.resblocks):
            j = blocks.index(i) if i in blocks else None
            x = lora_attention_block(block, x, a[:, j] if j is not None else None,
                                     b[:, j] if j is not None else None, config.targets, config.scaling,
                                     config.dropout, self.training, causal)
        return x

    def raw_text_features(self) -> torch.Tensor:
        """Un-normalised class text features (R, C, D) of the template through the (adapted) text tower."""
        if "text" not in self.blocks:
            if self._frozen_text is None or self._frozen_text.device != self.device:
                with torch.no_grad():
                    self._frozen_text = self.backbone.model.encode_text(self.token_ids).float()
            return self._frozen_text.unsqueeze(0).expand(self.num_runs, -1, -1)
        model = self.backbone.model
        dtype = model.transformer.get_cast_dtype()
        n_used = self.embeddings.shape[1]
        x = self.embeddings.to(dtype) + model.positional_embedding[:n_used].to(dtype)
        x = self.run_tower("text", model.transformer, x.expand(self.num_runs, -1, -1, -1), causal=True)
        pooled = x[:, torch.arange(x.shape[1], device=x.device), self.eot_index]  # (R, C, w)
        return self.text_encoder.project(pooled.reshape(-1, pooled.shape[-1])).reshape(self.num_runs, pooled.shape[1],
                                                                                       -1)

    def text_features(self) -> torch.Tensor:
        return F.normalize(self.raw_text_features(), dim=-1)


class CLIPLoRA(PixelMethod, LoRATowers):
    """CLIP-LoRA on pixels: adapters on the towers the config names (the paper's: both)."""

    name = "clip-lora"
    printed_name = "CLIP-LoRA"
    recipe_function = staticmethod(clip_lora_recipe)

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: CLIPLoRAConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.image_encoder = PromptedVisionEncoder(backbone)

    def image_batch(self, pixels: torch.Tensor) -> torch.Tensor:
        """Un-normalised image features (R, B, D) of preprocessed pixels (B, 3, H, W) through the (adapted) vision
        tower."""
        self.check_pixels(pixels)
        if "vision" not in self.blocks:
            with torch.no_grad():
                return self.backbone.encode_image(pixels).unsqueeze(0).expand(self.num_runs, -1, -1)
        visual = self.backbone.model.visual
        x = visual.ln_pre(self.image_encoder.embed(pixels))
        x = self.run_tower("vision", visual.transformer, x.expand(self.num_runs, -1, -1, -1), causal=False)
        pooled = visual.ln_post(x[:, :, 0])
        return pooled @ visual.proj if visual.proj is not None else pooled


class CLIPLoRAText(LoRATowers):
    """CLIP-LoRA with adapters on the text tower only, trained from cached image features."""

    name = "clip-lora-text"
    printed_name = "CLIP-LoRA (text)"
    recipe_function = staticmethod(clip_lora_text_recipe)
    config_class = CLIPLoRATextConfig


register_method(CLIPLoRA)
register_method(CLIPLoRAText)
