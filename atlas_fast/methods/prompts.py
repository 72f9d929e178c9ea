"""The text prompts of the CoOp family (CoOp, CoCoOp, KgCoOp, DePT) and the IVLP family (IVLP, MaPLe, PromptSRC).

Prompt of class c: ``[SOT][ctx_1..M][rest of the init phrase][class tokens][.][EOT]``. The M context vectors are
learned; everything else is the frozen token embedding of the string ``"{prompt_prefix} {class name}."``, where
``prompt_prefix`` is the init phrase (or M placeholders "X" with random init). CoOp's phrase has exactly M words;
IVLP-family phrases may be longer, the words after the first M then stay fixed text.

:func:`initial_context` (first M init-token embeddings or N(0, 0.02^2)), :class:`ClassPrompts` (one class set's
frozen buffers, prompt assembly, the text pass) and :class:`ContextPromptMethod` (base of CoOp and IVLP). The learned
tensors stay on the methods; this module owns only buffers, none of them saved.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import nn

from atlas_fast.clip.backbones import Backbone
from atlas_fast.clip.text_encoder import PromptTextEncoder, eot_positions, tokenize_prompts
from atlas_fast.methods.base import PromptMethod

ClassTokenPosition = Literal["end", "middle", "front"]
CLASS_TOKEN_POSITIONS = ("end", "middle", "front")


def init_phrase(ctx_init: str) -> str:
    """The init phrase as the references use it ("_" -> " ", surrounding blanks removed)."""
    return ctx_init.replace("_", " ").strip()


def initial_context(backbone: Backbone, n_ctx: int, init_words: str, lead: tuple[int, ...],
                    dtype: torch.dtype) -> torch.Tensor:
    """The learned context at init, (*lead, M, d): the token embeddings of the first M tokens of ``init_words``
    (repeated over ``lead``), or N(0, 0.02^2) drawn for the whole shape when there is no phrase."""
    width = int(backbone.model.token_embedding.weight.shape[1])
    if init_words:
        init = tokenize_prompts(backbone, [init_words]).embeddings[0, 1:1 + n_ctx].to(dtype)
        return init.expand(*lead, n_ctx, width).clone()
    ctx = torch.empty(*lead, n_ctx, width, dtype=dtype, device=backbone.device)
    return nn.init.normal_(ctx, std=0.02)


class ClassPrompts(nn.Module):
    """The frozen tokens of every class's prompt for one class set, and the text pass over them.

    Buffers (rebuilt by :meth:`set_classnames`, never saved): ``token_prefix`` (C, 1, d) the SOT embedding,
    ``token_suffix`` (C, S, d) every position after the context up to the longest EOT, ``eot_index`` (C,) and, for
    class tokens not at the end, ``layout`` (C, 1 + M + S), the source row of each output position.
    """

    def __init__(self, backbone: Backbone, n_ctx: int, prompt_prefix: str,
                 class_token_position: ClassTokenPosition = "end", per_class_context: bool = False) -> None:
        super().__init__()
        if class_token_position not in CLASS_TOKEN_POSITIONS:
            raise ValueError(f"class_token_position must be one of {CLASS_TOKEN_POSITIONS}, "
                             f"got {class_token_position!r}")
        self.backbone = backbone  # a dataclass, not a module: the frozen CLIP stays out of the module tree
        self.n_ctx = n_ctx
        self.prompt_prefix = prompt_prefix
        self.class_token_position = class_token_position
        self.per_class_context = per_class_context
        self.classnames: tuple[str, ...] = ()

    def set_classnames(self, classnames: Sequence[str], device: torch.device | str) -> None:
        """Tokenize ``"{prompt_prefix} {name}."`` for every class and keep the frozen parts of the prompts."""
        if not classnames:
            raise ValueError("prompts need at least one class name")
        names = [name.replace("_", " ") for name in classnames]
        tokens = tokenize_prompts(self.backbone, [f"{self.prompt_prefix} {name}." for name in names], classnames)
        n_used = int(tokens.eot_index.max()) + 1  # positions after the last EOT never matter (causal mask)
        if int(tokens.eot_index.min()) <= self.n_ctx:
            raise ValueError(f"prompts are truncated inside the context (prefix {self.prompt_prefix!r} is too long "
                             f"for the {self.backbone.context_length}-token context)")
        self.classnames = tuple(classnames)
        self.register_buffer("token_prefix", tokens.embeddings[:, :1].to(device), persistent=False)
        self.register_buffer("token_suffix", tokens.embeddings[:, 1 + self.n_ctx:n_used].to(device),
                             persistent=False)
        self.register_buffer("eot_index", tokens.eot_index.to(device), persistent=False)
        # Leading positions after the context with the same token in every class (the fixed words of an IVLP
        # phrase, ...): they join the shared prefix. Each class keeps at least its EOT position.
        after = tokens.ids[:, 1 + self.n_ctx:int(tokens.eot_index.min())]
        same = (after == after[:1]).all(dim=0).tolist() + [False]
        self.shared_words = same.index(False)
        layout = None
        if self.class_token_position != "end":
            # class-name token counts: EOT position minus SOT, from the name tokenized on its own
            name_lengths = eot_positions(self.backbone.model, self.backbone.tokenizer(names)) - 1
            layout = self._layout(name_lengths.tolist(), n_used).to(device)
        self.register_buffer("layout", layout, persistent=False)

    def _layout(self, name_lengths: list[int], n_used: int) -> torch.Tensor:
        """Per class, which row of [SOT, ctx_1..M, class tokens, '.', EOT, ...] fills each output position:
        "front" and "middle" move each class's name tokens before / into the context. One (C, n_used) index lets
        :meth:`assemble` build every prompt with a single gather."""
        m, half = self.n_ctx, self.n_ctx // 2
        rows = torch.arange(n_used).repeat(len(name_lengths), 1)
        for c, n in enumerate(name_lengths):
            name_rows = torch.arange(1 + m, 1 + m + n)
            if self.class_token_position == "front":  # [SOT][name][ctx_1..M][.][EOT]
                rows[c, 1:1 + n] = name_rows
                rows[c, 1 + n:1 + n + m] = torch.arange(1, 1 + m)
            else:  # middle: [SOT][ctx_1..M/2][name][ctx_M/2+1..M][.][EOT]
                rows[c, 1 + half:1 + half + n] = name_rows
                rows[c, 1 + half + n:1 + m + n] = torch.arange(1 + half, 1 + m)
        return rows

    def assemble(self, ctx: torch.Tensor) -> torch.Tensor:
        """Full prompts (*lead, C, n_used, d) from the context: (*lead, M, d) shared by the classes, or
        (*lead, C, M, d) with per-class context."""
        classes = len(self.classnames)
        if not self.per_class_context:
            ctx = ctx.unsqueeze(-3).expand(*ctx.shape[:-2], classes, *ctx.shape[-2:])
        lead = ctx.shape[:-3]
        prefix = self.token_prefix.expand(*lead, *self.token_prefix.shape)
        suffix = self.token_suffix.expand(*lead, *self.token_suffix.shape)
        prompts = torch.cat([prefix, ctx.to(suffix.dtype), suffix], dim=-2)
        if self.layout is None:
            return prompts
        index = self.layout.view(*(1,) * len(lead), classes, -1, 1).expand(*lead, -1, -1, prompts.shape[-1])
        return prompts.gather(-2, index)

    def encode(self, encoder: PromptTextEncoder, ctx: torch.Tensor,
               deep_prompts: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Un-normalised text features (*lead, C, D) of the prompts built from ``ctx`` (see :meth:`assemble`);
        ``deep_prompts``: one (R, M, d) tensor per text block 1..J-1.

        With one context for every class and the class tokens at the end, all prompts start with the same
        ``[SOT][ctx][fixed words]``: the encoder computes that prefix once (``encode_classes``). Class-specific
        context and the "middle"/"front" layouts run the assembled prompts."""
        if self.per_class_context or self.layout is not None:
            return encoder(self.assemble(ctx), self.eot_index, deep_prompts)
        lead, width, shared = ctx.shape[:-2], ctx.shape[-1], self.shared_words
        dtype = self.token_suffix.dtype
        prefix = torch.cat([self.token_prefix[0].expand(*lead, 1, width), ctx.to(dtype),
                            self.token_suffix[0, :shared].expand(*lead, shared, width)], dim=-2)
        return encoder.encode_classes(prefix, self.token_suffix[:, shared:], self.eot_index, deep_prompts)


class ContextPromptMethod(PromptMethod):
    """A method whose class text is :class:`ClassPrompts` around a learned context ``ctx`` (CoOp, IVLP and their
    families): it sets ``class_prompts`` and ``ctx`` in ``__init__``; a class set rebuilds only the frozen buffers."""

    class_prompts: ClassPrompts
    ctx: nn.Parameter

    def set_classnames(self, classnames: Sequence[str]) -> None:
        """Rebuild the SOT / class-token / EOT buffers for ``classnames``; the learned tensors are kept."""
        if not classnames:
            raise ValueError(f"{type(self).__name__} needs at least one class name")
        self.class_prompts.set_classnames(classnames, self.ctx.device)
        self.classnames = self.class_prompts.classnames

    @property
    def eot_index(self) -> torch.Tensor:
        """EOT position of every class's prompt (C,)."""
        return self.class_prompts.eot_index
