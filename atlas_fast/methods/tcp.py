"""TCP (Yao et al., CVPR 2024, "Textual-based Class-aware Prompt tuning"): CoOp's context plus class-aware tokens made
from CLIP's own class text, written into the middle of the text tower (``docs/method-zoo.md``, section TCP).

For class c with w_c the normalised frozen-CLIP feature of the dataset's hand-crafted prompt ("a photo of a {}, a
type of pet.", TCP's table :data:`KNOWLEDGE_TEMPLATES`):

    T_c = meta_net(w_c)                                  (M, d_t): Linear(D -> D/4), QuickGELU, Linear(D/4 -> M d_t)
    prompt_c = [SOT][ctx_1..M][rest of TCP's template with class c][EOT]     ("X X X X {}, a type of pet.")
    at the input of text block J - 1:  x[1..M] <- β T_c + (1 - β) x[1..M]     (β = 1: replaced)
    t_c = the tower's output at EOT;  z = s cos(v, t_c)
    L = criterion(z) + W (1 - mean_c cos(t_c, w_c))                           (W = 8, cosine eps 1e-7)

The image features are CLIP's, unchanged, so TCP trains from cached features. Learned tensors (R runs lead each):
``ctx`` (R, M, d_t) and the meta-net's ``meta_weight1`` (R, D/4, D), ``meta_bias1`` (R, D/4), ``meta_weight2``
(R, M d_t, D/4), ``meta_bias2`` (R, M d_t). All of TCP's math is in this file.

Numbers the reference hard-codes are config fields with its values: M class-aware tokens, injection at block 8
(``depth`` J = 9), β = 1 (its ``weights=[1.0]``) and the knowledge weight 8.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone
from atlas_fast.clip.prompted_towers import fused_block, fused_tower_supported, pooled_block
from atlas_fast.clip.text_encoder import PromptTextEncoder, host_positions, tokenize_prompts
from atlas_fast.data.datasets import atlas_template, find_dataset_spec
from atlas_fast.data.templates import check_template, fill_template
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family, check_scale
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.kgcoop import KgCoOp
from atlas_fast.methods.prompts import init_phrase, initial_context

# TCP's prompt per dataset (the reference's CUSTOM_TEMPLATES): its first M words are the context's places (their
# embeddings are replaced by ``ctx``; ImageNet's and UCF101's happen to be words, the others "X"). StanfordCars'
# has no full stop in the reference, kept so that the token ids are the same.
PROMPT_TEMPLATES = {
    "OxfordPets": "X X X X {}, a type of pet.",
    "OxfordFlowers": "X X X X {}, a type of flower.",
    "FGVCAircraft": "X X X X {}, a type of aircraft.",
    "DescribableTextures": "X X X X {} texture.",
    "EuroSAT": "X X X X {}.",
    "StanfordCars": "X X X X {}, a type of car",
    "Food101": "X X X X {}, a type of food.",
    "SUN397": "X X X X {}.",
    "Caltech101": "X X X X {}.",
    "UCF101": "a photo of a person doing {}.",
    **{name: "a photo of a {}." for name in ("ImageNet", "ImageNetSketch", "ImageNetV2", "ImageNetA", "ImageNetR")},
}
# The hand-crafted prompts whose frozen features w_c feed the meta-net and the knowledge term (the reference's
# CUSTOM_TEMPLATES_ori; FGVCAircraft and Food101 differ from KgCoOp's table).
KNOWLEDGE_TEMPLATES = {
    "OxfordPets": "a photo of a {}, a type of pet.",
    "OxfordFlowers": "a photo of a {}, a type of flower.",
    "FGVCAircraft": "a photo of an aircraft {}.",
    "DescribableTextures": "a photo of a {}, a type of texture.",
    "EuroSAT": "a centered satellite photo of {}.",
    "StanfordCars": "a photo of a {}.",
    "Food101": "a photo of a {}, a type of food.",
    "SUN397": "a photo of a {}.",
    "Caltech101": "a photo of a {}.",
    "UCF101": "a photo of a person doing {}.",
    **{name: "a photo of a {}." for name in ("ImageNet", "ImageNetSketch", "ImageNetV2", "ImageNetA", "ImageNetR")},
}
# Datasets the reference trains 25 epochs instead of 50 (its train.py).
SHORT_DATASETS = ("ImageNet", "SUN397")
META_NET_REDUCTION = 4
KNOWLEDGE_COSINE_EPS = 1e-7  # torch.nn.CosineSimilarity(eps=1e-07) in the reference


def registry_name(dataset: str) -> str:
    spec = find_dataset_spec(dataset)
    return spec.name if spec is not None else dataset


def tcp_templates(dataset: str) -> tuple[str, str]:
    """(prompt template, knowledge template) of ``dataset``: TCP's tables, else four placeholders before the class
    name and the dataset's ATLaS/KgCoOp template (the embedded world's "a photo of a {}.")."""
    name = registry_name(dataset)
    return PROMPT_TEMPLATES.get(name, "X X X X {}."), KNOWLEDGE_TEMPLATES.get(name, atlas_template(dataset))


@dataclass(frozen=True)
class TCPConfig(MethodConfig):
    """TCP's prompt learner. ``template``: the class prompt whose words 1..M hold the context (TCP's table);
    ``knowledge_template``: w_c's prompt; ``kg_weight``: W; ``class_token_weight``: β; ``depth``: the class-aware
    tokens enter the input of text block ``depth - 1``. ``ctx_init`` empty: N(0, 0.02^2) context (the reference's
    recipe); a phrase: its first M words' embeddings."""

    n_ctx: int = 4
    ctx_init: str = ""
    template: str = "X X X X {}."
    knowledge_template: str = "a photo of a {}."
    kg_weight: float = 8.0
    class_token_weight: float = 1.0
    depth: int = 9

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        if self.n_ctx < 1:
            raise ValueError(f"{owner}.n_ctx must be >= 1, got {self.n_ctx}")
        words = init_phrase(self.ctx_init).split()
        if words and len(words) < self.n_ctx:
            raise ValueError(f"{owner}: ctx_init {self.ctx_init!r} has {len(words)} words for {self.n_ctx} context "
                             f"tokens; give at least {self.n_ctx} words or ctx_init='' for random init")
        check_template(self.template, owner)
        check_template(self.knowledge_template, f"{owner}.knowledge_template")
        if not self.kg_weight >= 0:
            raise ValueError(f"{owner}.kg_weight (W) must be >= 0, got {self.kg_weight}")
        check_scale(self, "kg_weight")
        if not 0.0 <= self.class_token_weight <= 1.0:
            raise ValueError(f"{owner}.class_token_weight (β) must be in [0, 1], got {self.class_token_weight}")
        if self.depth < 1:
            raise ValueError(f"{owner}.depth must be >= 1 (the class-aware tokens enter block depth - 1), got "
                             f"{self.depth}")


def tcp_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[TCPConfig, OptimRecipe]:
    """TCP's recipe (its ``configs/trainers/TCP/vit_b16_ep100_ctxv1.yaml`` and ``scripts/base2new_train.sh``):
    M = 4, W = 8.0, β = 1, class-aware tokens at block 8 (J = 9), Adam (Dassl's) lr 0.002, weight decay 5e-4, batch
    32, 50 epochs (ImageNet and SUN397: 25), one constant warmup epoch at 1e-5 and a per-epoch cosine. ``original``:
    random context, as the reference; ``paper``: the context initialised from "a photo of a" (the ATLaS paper's
    prompts). The reference scripts only base-to-new: the other settings raise :class:`MissingRecipe`."""
    check_family("TCP", family)
    template, knowledge = tcp_templates(dataset)
    config = TCPConfig(ctx_init="" if family == "original" else "a photo of a", template=template,
                       knowledge_template=knowledge)
    if setting != "base2new":
        raise MissingRecipe("TCP", setting, config)
    epochs = 25 if registry_name(dataset) in SHORT_DATASETS else 50
    return config, OptimRecipe(epochs=epochs, batch_size=32, lr=0.002, optimizer="adam")


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """CLIP's QuickGELU, the meta-net's activation in the reference."""
    return x * torch.sigmoid(1.702 * x)


def encode_with_class_tokens(encoder: PromptTextEncoder, prompts: torch.Tensor, eot_index: torch.Tensor,
                             tokens: torch.Tensor, layer: int, weight: float) -> torch.Tensor:
    """Un-normalised text features (..., C, D) of prompt embeddings (..., C, L, d) pooled at ``eot_index`` (C,),
    with ``tokens`` (..., C, M, d) blended into positions 1..M at the input of block ``layer``:
    ``x <- weight * tokens + (1 - weight) * x``. Only the first max(EOT) + 1 positions run (the causal mask makes
    the rest irrelevant); the blocks run fused where :class:`PromptTextEncoder` would."""
    model = encoder.model
    *lead, length, width = prompts.shape
    blocks = model.transformer.resblocks
    if not 0 <= layer < len(blocks):
        raise ValueError(f"TCP's class-aware tokens enter block {layer}, but the text tower has {len(blocks)} blocks")
    n_used = max(host_positions(eot_index)) + 1 if encoder.causal else length
    if tokens.shape[-2] >= min(host_positions(eot_index)):
        raise ValueError(f"{tokens.shape[-2]} class-aware tokens would overwrite an EOT token")
    dtype = model.transformer.get_cast_dtype()
    x = prompts[..., :n_used, :].reshape(-1, n_used, width).to(dtype) + model.positional_embedding[:n_used].to(dtype)
    tokens = tokens.reshape(-1, *tokens.shape[-2:]).to(dtype)
    rows = eot_index.to(x.device).long().expand(*lead).reshape(-1)
    mask = model.attn_mask[:n_used, :n_used] if encoder.causal else None
    fused = (encoder.fused_attention and (mask is None or encoder.clip_causal_mask)
             and fused_tower_supported(model.transformer))
    batch_first = getattr(model.transformer, "batch_first", True)
    for i, block in enumerate(blocks):
        if i == layer:
            count = tokens.shape[1]
            blended = weight * tokens + (1.0 - weight) * x[:, 1:1 + count]
            x = torch.cat([x[:, :1], blended, x[:, 1 + count:]], dim=1)
        if fused and i == len(blocks) - 1:
            return encoder.project(pooled_block(block, x, rows, causal=mask is not None)).reshape(*lead, -1)
        if fused:
            x = fused_block(block, x, causal=mask is not None)
        elif batch_first:
            x = block(x, attn_mask=mask)
        else:
            x = block(x.transpose(0, 1), attn_mask=mask).transpose(0, 1)
    return encoder.project(x[torch.arange(x.shape[0], device=x.device), rows]).reshape(*lead, -1)


class TCP(PromptMethod):
    """TCP on cached image features. Learned tensors: ``ctx`` and the meta-net (see the module docstring)."""

    name = "tcp"
    printed_name = "TCP"
    recipe_function = staticmethod(tcp_recipe)
    config_class = TCPConfig
    depth_options = ("depth",)
    supports_batched_runs = True  # ctx and the meta-net lead with R; the knowledge term is each run's own

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: TCPConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.text_encoder = PromptTextEncoder(backbone)
        layers = len(backbone.model.transformer.resblocks)
        if config.depth > layers:
            raise ValueError(f"TCP: depth must be in [1, {layers}] (the text tower has {layers} blocks), got "
                             f"{config.depth}")
        width, dim, runs = self.text_encoder.width, backbone.embed_dim, self.num_runs
        self.n_ctx = config.n_ctx
        ctx = initial_context(backbone, config.n_ctx, init_phrase(config.ctx_init), (runs,),
                              backbone.model.transformer.get_cast_dtype())
        self.ctx = nn.Parameter(ctx)
        hidden = dim // META_NET_REDUCTION
        if hidden < 1:
            raise ValueError(f"TCP's meta-net hidden width is embed_dim // {META_NET_REDUCTION}, 0 for {dim}")
        # One torch Linear per layer and run: PyTorch's default init, drawn after ctx (as the reference builds them)
        linears = [(nn.Linear(dim, hidden), nn.Linear(hidden, config.n_ctx * width)) for _ in range(runs)]
        device = self.ctx.device
        self.meta_weight1 = nn.Parameter(torch.stack([a.weight.detach() for a, _ in linears]).to(device))
        self.meta_bias1 = nn.Parameter(torch.stack([a.bias.detach() for a, _ in linears]).to(device))
        self.meta_weight2 = nn.Parameter(torch.stack([b.weight.detach() for _, b in linears]).to(device))
        self.meta_bias2 = nn.Parameter(torch.stack([b.bias.detach() for _, b in linears]).to(device))
        self.set_classnames(classnames)

    def set_classnames(self, classnames: Sequence[str]) -> None:
        """Tokenize TCP's prompt of every class and encode its knowledge prompt (w_c); the learned tensors are kept."""
        if not classnames:
            raise ValueError("TCP needs at least one class name")
        device = self.ctx.device
        tokens = tokenize_prompts(self.backbone, fill_template(self.config.template, classnames), classnames)
        n_used = int(tokens.eot_index.max()) + 1
        if int(tokens.eot_index.min()) <= self.n_ctx:
            raise ValueError(f"TCP's template {self.config.template!r} leaves no room for {self.n_ctx} context "
                             f"tokens before the class name")
        self.classnames = tuple(classnames)
        self.register_buffer("token_ids", tokens.ids.to(device), persistent=False)
        self.register_buffer("token_prefix", tokens.embeddings[:, :1].to(device), persistent=False)
        self.register_buffer("token_suffix", tokens.embeddings[:, 1 + self.n_ctx:n_used].to(device), persistent=False)
        self.register_buffer("eot_index", tokens.eot_index.to(device), persistent=False)
        with torch.no_grad():
            knowledge = self.backbone.encode_text(fill_template(self.config.knowledge_template, classnames))
        self.register_buffer("knowledge", F.normalize(knowledge.float(), dim=-1).to(device), persistent=False)

    def class_tokens(self) -> torch.Tensor:
        """The class-aware tokens (R, C, M, d_t) = meta_net(w_c)."""
        runs, classes = self.num_runs, len(self.classnames)
        w = self.knowledge.to(self.meta_weight1.dtype).expand(runs, -1, -1)
        hidden = quick_gelu(torch.baddbmm(self.meta_bias1.unsqueeze(1), w, self.meta_weight1.transpose(1, 2)))
        out = torch.baddbmm(self.meta_bias2.unsqueeze(1), hidden, self.meta_weight2.transpose(1, 2))
        return out.view(runs, classes, self.n_ctx, -1)

    def prompt_embeddings(self) -> torch.Tensor:
        """The assembled prompts (R, C, n_used, d_t): [SOT][ctx][the template's words after the context]."""
        runs, classes = self.num_runs, len(self.classnames)
        suffix = self.token_suffix
        ctx = self.ctx.to(suffix.dtype).unsqueeze(1).expand(runs, classes, -1, -1)
        return torch.cat([self.token_prefix.expand(runs, -1, -1, -1), ctx, suffix.expand(runs, -1, -1, -1)], dim=-2)

    def raw_text_features(self) -> torch.Tensor:
        """Un-normalised class text features (R, C, D)."""
        return encode_with_class_tokens(self.text_encoder, self.prompt_embeddings(), self.eot_index,
                                        self.class_tokens(), self.config.depth - 1, self.config.class_token_weight)

    def text_features(self) -> torch.Tensor:
        return F.normalize(self.raw_text_features(), dim=-1)

    def regularizer(self, text_features: torch.Tensor) -> torch.Tensor:
        """W * (1 - mean_c cos(t_c, w_c)), each run's (R,)."""
        cosine = F.cosine_similarity(text_features.float(), self.knowledge.expand_as(text_features), dim=-1,
                                     eps=KNOWLEDGE_COSINE_EPS)
        return self.config.kg_weight * (1.0 - cosine.mean(dim=-1))

    # criterion(z) + W * (1 - mean cos(t, w)) from one pass of the text tower, each run's (R,) when R runs train
    # together: KgCoOp's loss, with TCP's text features and knowledge term
    training_loss = KgCoOp.training_loss


register_method(TCP)
