"""Zero-shot CLIP (``ZeroshotCLIP``, ``docs/method-zoo.md``, section Zero-shot CLIP): one hand-crafted prompt per class,
nothing learned.

A method like the others, so every zero-shot row goes through the same evaluation path. Text features of
``template.format(class name with "_" -> " ")``, once per class set, CLIP's ``encode_text``, L2-normalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone
from atlas_fast.data.datasets import zeroshot_template
from atlas_fast.data.templates import check_template, fill_template
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import MethodConfig, OptimRecipe, check_family
from atlas_fast.methods.registry import register_method
from atlas_fast.vocabulary import RecipeFamily, Setting


@dataclass(frozen=True)
class ZeroShotConfig(MethodConfig):
    """The prompt template (``{}`` = the class name); recipes pass the dataset's CoOp zero-shot template."""

    template: str = "a photo of a {}."

    def __post_init__(self) -> None:
        super().__post_init__()
        check_template(self.template, "ZeroShotConfig")


_PROMPT_FEATURES: dict[tuple, torch.Tensor] = {}


@torch.no_grad()
def prompt_features(backbone: Backbone, prompts: tuple[str, ...]) -> torch.Tensor:
    """Normalised text features (C, D) of hand-crafted prompts, kept per process (64 class sets): every run of a sweep
    evaluates the same zero-shot references, and the full-length text tower is the costliest part of that on a CPU."""
    key = (backbone.fingerprint, str(backbone.device), prompts)
    if key not in _PROMPT_FEATURES:
        if len(_PROMPT_FEATURES) >= 64:
            _PROMPT_FEATURES.pop(next(iter(_PROMPT_FEATURES)))
        _PROMPT_FEATURES[key] = F.normalize(backbone.encode_text(list(prompts)).float(), dim=-1)
    return _PROMPT_FEATURES[key]


def zsclip_recipe(family: RecipeFamily, setting: Setting, shots: int,
                  dataset: str) -> tuple[ZeroShotConfig, OptimRecipe]:
    """Zero-shot CLIP with CoOp's per-dataset template (``trainers/zsclip.py``; DTD "{} texture.") in every setting
    and family. The optimisation recipe is a placeholder of one epoch: there is nothing to train."""
    check_family("Zero-shot CLIP", family)
    return ZeroShotConfig(template=zeroshot_template(dataset)), OptimRecipe(epochs=1, batch_size=32, lr=0.002)


class ZeroShotCLIP(PromptMethod):
    """Zero-shot CLIP on cached image features; ``text_features()`` is a fixed (R, C, D) buffer."""

    name = "zsclip"
    printed_name = "CLIP (zero-shot)"
    recipe_function = staticmethod(zsclip_recipe)
    config_class = ZeroShotConfig
    learns = False

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: ZeroShotConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.set_classnames(classnames)

    @torch.no_grad()
    def set_classnames(self, classnames: Sequence[str]) -> None:
        if not classnames:
            raise ValueError("Zero-shot CLIP needs at least one class name")
        features = prompt_features(self.backbone, tuple(fill_template(self.config.template, classnames)))
        self.classnames = tuple(classnames)
        self.register_buffer("class_features", features, persistent=False)

    def text_features(self) -> torch.Tensor:
        return self.class_features.unsqueeze(0).expand(self.num_runs, -1, -1)


register_method(ZeroShotCLIP)
