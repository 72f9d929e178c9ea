"""CoOp: learnable context tokens in front of (or around) the class name, frozen CLIP (``docs/method-zoo.md``, section
CoOp).

Prompt of class c: ``[SOT][ctx_1..M][class tokens][.][EOT]`` ("end"), with the class tokens moved to the middle of
the context or to its front by ``class_token_position``. ``ctx`` is shared by all classes, or one per class with
``csc`` (class-specific context, which therefore cannot be evaluated on another class set). Image features come from
the cache; only the text path has a graph. All of CoOp's math is in this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family, check_setting_name
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.prompts import (CLASS_TOKEN_POSITIONS, ClassPrompts, ClassTokenPosition,
                                        ContextPromptMethod, init_phrase, initial_context)
from atlas_fast.clip.text_encoder import PromptTextEncoder
from atlas_fast.vocabulary import RecipeFamily

if TYPE_CHECKING:
    from atlas_fast.vocabulary import Setting

PAPER_CTX_INIT = "a photo of a"
DEFAULT_N_CTX = 16  # the reference's M without an init phrase


@dataclass(frozen=True)
class CoOpConfig(MethodConfig):
    """CoOp's prompt learner (reference defaults: 16 random tokens, shared context, class token at the end).

    With a non-empty ``ctx_init`` the context is initialised with the phrase's token embeddings and has one token
    per word of the phrase, as in the reference; ``n_ctx`` may then be left out (it is set to the word count) or
    must equal it: the reference silently learns the phrase's word count whatever ``n_ctx`` says, and a record
    claiming 8 learned tokens when 4 were learned is refused here. Without a phrase the ``n_ctx`` (default 16)
    tokens are drawn from N(0, 0.02^2).
    """

    n_ctx: int | None = None
    ctx_init: str = ""
    csc: bool = False
    class_token_position: ClassTokenPosition = "end"

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        if self.class_token_position not in CLASS_TOKEN_POSITIONS:
            raise ValueError(f"{owner}.class_token_position must be one of {CLASS_TOKEN_POSITIONS}, "
                             f"got {self.class_token_position!r}")
        words = len(self.init_words.split(" ")) if self.init_words else 0
        if self.n_ctx is None:  # resolved here, so records and checkpoints state the real M
            object.__setattr__(self, "n_ctx", words or DEFAULT_N_CTX)
        elif words and self.n_ctx != words:
            raise ValueError(f"{owner}: n_ctx={self.n_ctx} cannot take effect with ctx_init={self.ctx_init!r}: CoOp "
                             f"learns one token per word of the init phrase, so {words} tokens would be learned "
                             f"while the configuration says {self.n_ctx}. Use ctx_init='' to learn {self.n_ctx} "
                             f"random tokens, give a phrase of {self.n_ctx} words, or leave n_ctx out (or set it to "
                             f"{words}) to learn the phrase's {words} tokens.")
        if self.n_ctx < 1:
            raise ValueError(f"{owner}.n_ctx must be >= 1, got {self.n_ctx}")
        if self.csc and self.init_words:
            raise ValueError(f"{owner}: csc=True needs random init (ctx_init=''); the reference silently drops "
                             f"CSC when an init phrase is given, so we refuse the combination instead")

    @property
    def init_words(self) -> str:
        """The init phrase as CoOp uses it ("_" -> " ", surrounding blanks removed)."""
        return init_phrase(self.ctx_init)

    @property
    def context_length(self) -> int:
        """M, the number of learned context tokens (``n_ctx``, which equals the init phrase's word count)."""
        return self.n_ctx


FEW_SHOT_EPOCHS = {1: 50, 2: 100, 4: 100, 8: 200, 16: 200}


def coop_recipe(family: RecipeFamily, setting: Setting, shots: int, dataset: str) -> tuple[CoOpConfig, OptimRecipe]:
    """CoOp's configuration and optimisation recipe (``docs/method-zoo.md``, section Recipes, ``docs/protocol.md``).

    * epochs: base-to-new 200 (ImageNet 50); few-shot by K: 1 -> 50, 2/4 -> 100, 8/16 -> 200 (ImageNet 50 for
      every K); cross-dataset (trained on ImageNet) 50. Batch 32, lr 0.002, SGD + cosine, 1 warmup epoch at 1e-5.
    * ``paper``: M = 4 initialised from "a photo of a" in every setting (the ATLaS paper's statement).
    * ``original``: the CoOp repository's configs: base-to-new and cross-dataset use ``vit_b16(_ep50)_ctxv1``
      (M = 4 from "a photo of a", as the CoCoOp paper ran CoOp), few-shot uses 16 random tokens at the end, no CSC.
    """
    check_family("CoOp", family)
    imagenet = dataset.lower() == "imagenet"
    if setting == "base2new":
        epochs = 50 if imagenet else 200
    elif setting == "few_shot":
        if shots not in FEW_SHOT_EPOCHS:
            raise ValueError(f"CoOp few-shot recipes exist for K in {sorted(FEW_SHOT_EPOCHS)}, got shots={shots}")
        epochs = 50 if imagenet else FEW_SHOT_EPOCHS[shots]
    elif setting == "cross_dataset":
        epochs = 50
    else:  # a setting of the vocabulary CoOp's references define no recipe for
        check_setting_name("CoOp", setting)
        raise MissingRecipe("CoOp", setting, CoOpConfig(ctx_init=PAPER_CTX_INIT))
    if family == "original" and setting == "few_shot":
        config = CoOpConfig(n_ctx=16, ctx_init="", csc=False, class_token_position="end")
    else:
        config = CoOpConfig(ctx_init=PAPER_CTX_INIT)
    return config, OptimRecipe(epochs=epochs, batch_size=32, lr=0.002)


class CoOp(ContextPromptMethod):
    """CoOp on cached image features. Learned tensor: ``ctx`` (R, M, d), or (R, C, M, d) with CSC."""

    name = "coop"
    printed_name = "CoOp"
    recipe_function = staticmethod(coop_recipe)
    config_class = CoOpConfig
    supports_batched_runs = True  # ctx is (R, M, d) / (R, C, M, d); the text pass is per prompt

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: CoOpConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.text_encoder = PromptTextEncoder(backbone)
        n_ctx = config.context_length
        lead = (self.num_runs, len(classnames)) if config.csc else (self.num_runs,)
        ctx = initial_context(backbone, n_ctx, config.init_words, lead, backbone.model.transformer.get_cast_dtype())
        self.prompt_prefix = config.init_words or " ".join(["X"] * n_ctx)
        self.n_ctx = n_ctx
        self.ctx = nn.Parameter(ctx)
        self.class_prompts = ClassPrompts(backbone, n_ctx, self.prompt_prefix, config.class_token_position,
                                          per_class_context=config.csc)
        self.set_classnames(classnames)

    def set_classnames(self, classnames: Sequence[str]) -> None:
        """Rebuild the SOT / class-token / EOT buffers for ``classnames``; ``ctx`` is kept (CSC needs the same C)."""
        if self.config.csc and len(classnames) != self.ctx.shape[1]:
            raise ValueError(f"CoOp with class-specific context was built for {self.ctx.shape[1]} classes and cannot "
                             f"be used for {len(classnames)}: CSC context does not transfer to another class set")
        super().set_classnames(classnames)

    def prompt_embeddings(self) -> torch.Tensor:
        """The assembled prompts (R, C, n_used, d), truncated after the longest EOT."""
        return self.class_prompts.assemble(self.ctx)

    def raw_text_features(self) -> torch.Tensor:
        """Un-normalised class text features (R, C, D) (DePT's head reads them before normalisation)."""
        return self.class_prompts.encode(self.text_encoder, self.ctx)

    def text_features(self) -> torch.Tensor:
        return F.normalize(self.raw_text_features(), dim=-1)

    def class_text_features(self, image_features: torch.Tensor) -> torch.Tensor:
        """Un-normalised text features of the current classes for a batch of image features (1 or R, B, D):
        (R, C, D) here (CoOp's prompts ignore the image); image-conditioned methods return (R, B, C, D)."""
        return self.raw_text_features()

    def regularizer(self, text_features: torch.Tensor) -> torch.Tensor | None:
        """Non-cross-entropy loss terms on the class text features (None: CoOp has none; KgCoOp overrides)."""
        return None


register_method(CoOp)
