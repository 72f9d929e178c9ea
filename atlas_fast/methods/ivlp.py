"""IVLP: independent deep prompts in the text and the vision tower of a frozen CLIP (``docs/method-zoo.md``, section
IVLP).

Learned tensors (R runs lead every one of them):

* ``ctx`` (R, M, d_t): the text input context. With ``ctx_init`` its **first M words** are learnable and the rest of
  the phrase stays as fixed text (M = 2 and "a photo of a" gives [SOT][ctx("a"), ctx("photo")][of][a][class][.][EOT]);
  without it, N(0, 0.02^2) with "X" placeholders.
* ``deep_text`` (R, J_t - 1, M, d_t): one set per text block 1..J_t-1, N(0, 0.02^2).
* ``vision_ctx`` (R, M_v, d_v) and ``deep_vision`` (R, J_v - 1, M_v, d_v), N(0, 0.02^2), present iff J_v > 0.

The injection is in :mod:`atlas_fast.clip.prompted_towers`. Logits and loss are CoOp's, but IVLP trains on pixels
(both feature sets have a graph). MaPLe and PromptSRC subclass this class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family
from atlas_fast.methods.pixel_method import PixelMethod
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.prompts import ClassPrompts, ContextPromptMethod, init_phrase, initial_context
from atlas_fast.clip.prompted_towers import PromptedVisionEncoder
from atlas_fast.clip.text_encoder import PromptTextEncoder

PAPER_CTX_INIT = "a photo of a"


def check_context_init(owner: str, n_ctx: int, ctx_init: str) -> None:
    """The references make the first M words of ``ctx_init`` learnable; with M larger than the phrase (their
    hard-coded test is M <= 4) they silently fall back to random init. We refuse that combination instead."""
    if n_ctx < 1:
        raise ValueError(f"{owner}: the number of text context tokens must be >= 1, got {n_ctx}")
    words = ctx_init.replace("_", " ").split()
    if words and n_ctx > len(words):
        raise ValueError(f"{owner}: {n_ctx} learnable tokens but ctx_init {ctx_init!r} has only {len(words)} "
                         f"words; use at most {len(words)} tokens, or ctx_init='' for random init")


def check_depth(owner: str, name: str, depth: int, layers: int, minimum: int) -> None:
    if not minimum <= depth <= layers:
        raise ValueError(f"{owner}: {name} must be in [{minimum}, {layers}] (the tower has {layers} blocks), "
                         f"got {depth}")


def normal_prompts(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """N(0, 0.02^2) prompts, fp32 (learned tensors stay fp32; autocast handles the activations)."""
    return nn.init.normal_(torch.empty(shape, device=device), std=0.02)


@dataclass(frozen=True)
class IVLPConfig(MethodConfig):
    """IVLP's prompt learner. Defaults: the MaPLe repository's base-to-new IVLP (2 + 2 tokens, depth 12 / 12,
    first 2 words of "a photo of a" learnable). Depth J counts the input prompt, so J - 1 deep sets."""

    n_ctx_text: int = 2
    n_ctx_vision: int = 2
    ctx_init: str = PAPER_CTX_INIT
    depth_text: int = 12
    depth_vision: int = 12

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_context_init(owner, self.n_ctx_text, self.ctx_init)
        if self.depth_text < 1:
            raise ValueError(f"{owner}.depth_text must be >= 1 (the text input prompt), got {self.depth_text}")
        if self.depth_vision < 0:
            raise ValueError(f"{owner}.depth_vision must be >= 0, got {self.depth_vision}")
        if self.depth_vision > 0 and self.n_ctx_vision < 1:
            raise ValueError(f"{owner}.n_ctx_vision must be >= 1 when depth_vision > 0, got {self.n_ctx_vision}")


def check_setting(method: str, family: str, setting: str, config: MethodConfig, settings: Sequence[str]) -> None:
    """Reject an unknown recipe family; a setting the references define no recipe for raises
    :class:`~atlas_fast.methods.config.MissingRecipe` (the run then needs explicit epochs, batch size and lr)."""
    check_family(method, family)
    if setting not in settings:
        raise MissingRecipe(method, setting, config)


def ivlp_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[IVLPConfig, OptimRecipe]:
    """IVLP's recipe (``docs/method-zoo.md``, section Recipes; the MaPLe repository's IVLP configs).

    * base-to-new and cross-dataset: 5 epochs, batch 4, lr 0.0035, depth 12 / 12 (the cross-dataset scripts reuse
      the base-to-new config). ``original``: 2 + 2 tokens, first 2 words of "a photo of a" learnable; ``paper``:
      4 + 4 tokens with all four words learnable (the ATLaS paper's prompt length 4).
    * few-shot: the references define none (:class:`~atlas_fast.methods.config.MissingRecipe`).
    """
    n_ctx = 2 if family == "original" else 4
    config = IVLPConfig(n_ctx_text=n_ctx, n_ctx_vision=n_ctx, ctx_init=PAPER_CTX_INIT, depth_text=12,
                        depth_vision=12)
    check_setting("IVLP", family, setting, config, ("base2new", "cross_dataset"))
    return config, OptimRecipe(epochs=5, batch_size=4, lr=0.0035)


class IVLP(PixelMethod, ContextPromptMethod):
    """Independent vision-language prompts; reads pixels (its image tower is prompted)."""

    name = "ivlp"
    printed_name = "IVLP"
    recipe_function = staticmethod(ivlp_recipe)
    # every learned tensor leads with R and the prompted towers take one batch per run (tests/test_batched.py)
    supports_batched_runs = True
    depth_options = ("depth_text", "depth_vision")
    config_class = IVLPConfig

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.text_encoder = PromptTextEncoder(backbone)
        self.image_encoder = PromptedVisionEncoder(backbone)
        self.text_layers = len(backbone.model.transformer.resblocks)
        self.text_width = self.text_encoder.width
        self.vision_width = self.image_encoder.width
        self.n_ctx, init_words = self.text_context_shape()
        self.ctx = nn.Parameter(initial_context(backbone, self.n_ctx, init_words, (self.num_runs,), torch.float32))
        self.prompt_prefix = init_words or " ".join(["X"] * self.n_ctx)
        self.class_prompts = ClassPrompts(backbone, self.n_ctx, self.prompt_prefix)
        self.create_prompts()
        self.set_classnames(classnames)

    # --- the parts MaPLe and PromptSRC change -------------------------------------------------------------------
    def text_context_shape(self) -> tuple[int, str]:
        """(M, init phrase) of the text input context."""
        return self.config.n_ctx_text, init_phrase(self.config.ctx_init)

    def create_prompts(self) -> None:
        """The deep text prompts and the visual prompts (input + deep)."""
        config, runs, device = self.config, self.num_runs, self.ctx.device
        owner = type(self).__name__
        check_depth(owner, "depth_text", config.depth_text, self.text_layers, 1)
        check_depth(owner, "depth_vision", config.depth_vision, self.image_encoder.layers, 0)
        self.deep_text = (nn.Parameter(normal_prompts((runs, config.depth_text - 1, self.n_ctx, self.text_width),
                                                      device)) if config.depth_text > 1 else None)
        if config.depth_vision > 0:
            self.vision_ctx = nn.Parameter(normal_prompts((runs, config.n_ctx_vision, self.vision_width), device))
        else:
            self.vision_ctx = None
        self.deep_vision = (nn.Parameter(normal_prompts(
            (runs, config.depth_vision - 1, config.n_ctx_vision, self.vision_width), device))
            if config.depth_vision > 1 else None)

    def text_prompts(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Input context (R, M, d_t) and the deep text prompts, one (R, M, d_t) per block 1..J_t-1."""
        return self.ctx, list(self.deep_text.unbind(1)) if self.deep_text is not None else []

    def vision_prompts(self) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """Input visual prompts (R, M_v, d_v) or None, and one (R, M_v, d_v) per vision block 1..J_v-1."""
        return self.vision_ctx, list(self.deep_vision.unbind(1)) if self.deep_vision is not None else []

    # --- shared by IVLP, MaPLe and PromptSRC --------------------------------------------------------------------
    def prompt_embeddings(self) -> torch.Tensor:
        """The assembled text input (R, C, n_used, d_t): [SOT][ctx][fixed words, class tokens, '.', EOT]."""
        return self.class_prompts.assemble(self.text_prompts()[0])

    def raw_text_features(self) -> torch.Tensor:
        """Un-normalised class text features (R, C, D) of the prompted text tower."""
        ctx, deep = self.text_prompts()
        return self.class_prompts.encode(self.text_encoder, ctx, deep)

    def text_features(self) -> torch.Tensor:
        return F.normalize(self.raw_text_features(), dim=-1)

    def class_text_features(self, image_features: torch.Tensor) -> torch.Tensor:
        """(R, C, D) un-normalised: the prompts do not depend on the image (the interface DePT's head uses)."""
        return self.raw_text_features()

    def regularizer(self, text_features: torch.Tensor) -> torch.Tensor | None:
        """No non-CE term on the text features (PromptSRC adds its terms in :meth:`training_loss`)."""
        return None

    def image_batch(self, pixels: torch.Tensor) -> torch.Tensor:
        """Un-normalised prompted image features (R, B, D) of preprocessed pixels: (B, 3, H, W) seen by every run
        (evaluation), or (R, B, 3, H, W), one batch per run (R runs trained together: each image carries its own
        run's prompts through the one frozen tower)."""
        self.check_pixels(pixels)
        prompts, deep = self.vision_prompts()
        return self.image_encoder(pixels, prompts, deep)


register_method(IVLP)
