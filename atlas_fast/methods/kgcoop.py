"""KgCoOp: CoOp plus a pull of the learned class text towards CLIP's hand-crafted one (``docs/method-zoo.md``, section
KgCoOp).

Prompts are CoOp's (class name at the end); the loss adds ``W * (1 - mean_c cos(t_c, w_c))``, w_c the normalised
CLIP feature of the dataset's template with class c (the KgCoOp/DePT table), once per class set. Only ``ctx`` is
learned.

Deviation: the reference replaces any non-empty ``ctx_init`` by the hard-coded "a photo of a"; here ``ctx_init`` is
used as given (the recipes pass "a photo of a", so the recipes' runs are the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from atlas_fast.atlas.criterion import Criterion
from atlas_fast.clip.backbones import Backbone
from atlas_fast.data.datasets import atlas_template
from atlas_fast.data.templates import check_template, fill_template
from atlas_fast.methods.config import MissingRecipe, OptimRecipe, check_family, check_scale
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.coop import PAPER_CTX_INIT, CoOp, CoOpConfig
from atlas_fast.vocabulary import RecipeFamily, Setting

KG_COSINE_EPS = 1e-7  # torch.nn.CosineSimilarity(eps=1e-07) in the reference


@dataclass(frozen=True)
class KgCoOpConfig(CoOpConfig):
    """KgCoOp: CoOp's context (class name at the end) + the knowledge-guided weight ``kg_weight`` (W; the original
    KgCoOp scripts use 8.0, DePT's configs 2.0) and the template that gives w_c."""

    kg_weight: float = 8.0
    template: str = "a photo of a {}."

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.class_token_position != "end":
            raise ValueError(f"KgCoOpConfig: class_token_position must be 'end' (KgCoOp's prompt learner has no "
                             f"other layout), got {self.class_token_position!r}")
        if not self.kg_weight >= 0:
            raise ValueError(f"KgCoOpConfig.kg_weight (W) must be >= 0, got {self.kg_weight}")
        check_scale(self, "kg_weight")
        check_template(self.template, "KgCoOpConfig")


def kgcoop_recipe(family: RecipeFamily, setting: Setting, shots: int, dataset: str) -> tuple[KgCoOpConfig, OptimRecipe]:
    """KgCoOp's recipe (``docs/method-zoo.md``, section KgCoOp), the same in both families: M = 4 from "a photo of a"
    and the KgCoOp/DePT template of ``dataset``.

    * base-to-new: htyao89/KgCoOp ``vit_b16_ep100_ctxv1``, W = 8.0, 100 epochs, batch 128, lr 0.002.
    * cross-dataset: KgCoOp's own script trains every dataset at 4 shots (no clean ImageNet-source recipe), so
      DePT's KgCoOp config is used, the references' only one: W = 2.0, 10 epochs, batch 4, lr 0.0035.
    * few-shot: no reference recipe (:class:`MissingRecipe`).
    """
    check_family("KgCoOp", family)
    template = atlas_template(dataset)  # the KgCoOp/DePT table (DTD: "a photo of a {}, a type of texture.")
    if setting == "base2new":
        return (KgCoOpConfig(ctx_init=PAPER_CTX_INIT, kg_weight=8.0, template=template),
                OptimRecipe(epochs=100, batch_size=128, lr=0.002))
    dept_config = KgCoOpConfig(ctx_init=PAPER_CTX_INIT, kg_weight=2.0, template=template)
    if setting == "cross_dataset":
        return dept_config, OptimRecipe(epochs=10, batch_size=4, lr=0.0035)
    raise MissingRecipe("KgCoOp", setting, dept_config)


class KgCoOp(CoOp):
    """KgCoOp on cached image features. Learned tensor: ``ctx``; fixed targets w_c per class set (not saved)."""

    name = "kgcoop"
    printed_name = "KgCoOp"
    recipe_function = staticmethod(kgcoop_recipe)
    config_class = KgCoOpConfig
    supports_batched_runs = True  # ctx leads with R; the regulariser is each run's own term

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: KgCoOpConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self._targets_of: tuple[str, ...] = ()
        # w of the current class set, computed at its first training step: a buffer, so it moves with the method
        # and a captured step that reads it sees when it is replaced (engine/graphs.py)
        self.register_buffer("hand_crafted", None, persistent=False)

    @torch.no_grad()
    def hand_crafted_features(self) -> torch.Tensor:
        """w (C, D): normalised CLIP text features of the template for the current classes (cached per class set)."""
        if self.hand_crafted is None or self._targets_of != self.classnames:
            prompts = fill_template(self.config.template, self.classnames)
            features = F.normalize(self.backbone.encode_text(prompts).float(), dim=-1)
            self.hand_crafted = features.to(self.ctx.device)
            self._targets_of = self.classnames
        return self.hand_crafted

    def regularizer(self, text_features: torch.Tensor) -> torch.Tensor:
        """W * (1 - mean_c cos(t_c, w_c)) of each run, (R,)."""
        targets = self.hand_crafted_features().to(device=text_features.device)
        cosine = F.cosine_similarity(text_features.float(), targets.expand_as(text_features), dim=-1,
                                     eps=KG_COSINE_EPS)
        return self.config.kg_weight * (1.0 - cosine.mean(dim=-1))

    def training_loss(self, inputs: torch.Tensor, labels: torch.Tensor, criterion: Criterion) -> torch.Tensor:
        """criterion(logits) + W * (1 - mean cos(t, w)), from one pass of the text encoder: each run's (R,) when R
        runs train together ((R, B) labels), so each run's loss, gradient and loss scale stay its own."""
        text = self.raw_text_features()
        logits = self.similarity_logits(self.image_batch(inputs), text)
        if labels.dim() == 1:  # one batch (one run)
            return criterion(logits) + self.regularizer(text).sum()
        return criterion.per_run(logits) + self.regularizer(text)


register_method(KgCoOp)
