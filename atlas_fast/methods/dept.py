"""DePT (decoupled prompt tuning) on CoOp, CoCoOp, KgCoOp or MaPLe: a channel-transform head beside the base method
(``docs/method-zoo.md``, section DePT). All of DePT's math is in this file; the base method's prompts and forward are
unchanged.

Head (CAT): FiLM on the **un-normalised** text and image features (x -> scale * x + bias, scale 1 and bias 0 at
init, one pair per modality) and a linear classifier over the training classes. Training loss of a batch with
labels y, similarity logits z (the base method's), text features T and image features V:

    (1 - λ) * CE(z, y) + λ * CE(linear([film_text(T[y]); film_image(V)]), [y; y])  (+ KgCoOp's term for DePT-KgCoOp)

with λ = 0.7 (for CoCoOp, T[y_i] is image i's own conditioned text feature); the head trains at 6.5 x the prompt lr
(:meth:`DePT.param_groups`). At test time the classes it was trained on (see docs/method-zoo.md for ImageNet's
variants) get ``(1 - λ) z + λ linear(film_image(V))``, any other class set z alone.

ATLaS: the schedule's targets reach z and the head's image rows; its text rows T[y_i] take image i's target too
with ``head_text_targets = "mirror"`` (default, as the reference's [y; y]), stay on y with ``"onehot"``
(docs/protocol.md).

DePT-MaPLe trains on pixels (MaPLe prompts the image tower): V are MaPLe's prompted image features, and at test time
the fusion runs batch by batch over the test pixels (:meth:`DePTMaPLe.pixel_classifier`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator, Literal, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.atlas.criterion import Criterion
from atlas_fast.clip.backbones import Backbone
from atlas_fast.data.datasets import atlas_template
from atlas_fast.methods.wrapped import WrappedMethod
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family, check_scale
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.cocoop import CoCoOp, CoCoOpConfig
from atlas_fast.methods.coop import PAPER_CTX_INIT, CoOp, CoOpConfig
from atlas_fast.methods.kgcoop import KgCoOp, KgCoOpConfig
from atlas_fast.methods.maple import MaPLe, MaPLeConfig
from atlas_fast.methods.pixel_method import PixelMethod
from atlas_fast.vocabulary import RecipeFamily, Setting

HeadTextTargets = Literal["mirror", "onehot"]
HEAD_TEXT_TARGETS = ("mirror", "onehot")


@dataclass(frozen=True)
class DePTHeadConfig(MethodConfig):
    """The head's settings (DePT's train.py defaults): ``head_lambda`` = λ (TRAINER.LINEAR_PROBE.WEIGHT) weighs the
    head in the loss and at test time, ``head_lr_scale`` = LR_EXP, ``fusion`` = TEST_TIME_FUSION (False: head logits
    alone on its classes), ``head_text_targets`` = what the text rows learn from under soft labels."""

    head_lambda: float = 0.7
    head_lr_scale: float = 6.5
    fusion: bool = True
    head_text_targets: HeadTextTargets = "mirror"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.head_lambda <= 1.0:
            raise ValueError(f"DePT head_lambda (λ) must be in [0, 1], got {self.head_lambda}")
        if not self.head_lr_scale > 0:
            raise ValueError(f"DePT head_lr_scale must be > 0, got {self.head_lr_scale}")
        check_scale(self, "head_lr_scale", low_open=True)
        if self.head_text_targets not in HEAD_TEXT_TARGETS:
            raise ValueError(f"DePT head_text_targets must be one of {HEAD_TEXT_TARGETS}, got "
                             f"{self.head_text_targets!r}")


@dataclass(frozen=True)
class DePTCoOpConfig(CoOpConfig, DePTHeadConfig):
    """DePT on CoOp: CoOp's fields + the head's."""


@dataclass(frozen=True)
class DePTCoCoOpConfig(CoCoOpConfig, DePTHeadConfig):
    """DePT on CoCoOp: CoCoOp's fields + the head's."""


@dataclass(frozen=True)
class DePTKgCoOpConfig(KgCoOpConfig, DePTHeadConfig):
    """DePT on KgCoOp: KgCoOp's fields (W, template) + the head's."""


@dataclass(frozen=True)
class DePTMaPLeConfig(MaPLeConfig, DePTHeadConfig):
    """DePT on MaPLe: MaPLe's fields (M, init, depth J) + the head's."""


def per_run_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, criterion: Criterion | None = None
                          ) -> torch.Tensor:
    """Hard-label CE of logits (R, B, C): the batch mean of each run, summed over runs. With labels (R, B), one
    batch per run (R runs trained together), each run's mean over its own rows (``criterion``'s sizes; the rest is
    padding), as a vector (R,)."""
    runs = logits.shape[0]
    if labels.dim() == 1:
        per_item = F.cross_entropy(logits.float().flatten(0, 1), labels.repeat(runs), reduction="none")
        return per_item.view(runs, -1).mean(dim=1).sum()
    per_item = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none").view(runs, -1)
    mask = criterion.padding_mask(labels.shape[1]) if criterion is not None else None
    if criterion is None or mask is None:
        return per_item.mean(dim=1)
    return (per_item * mask).sum(dim=1) / criterion.rows.clamp(min=1)


def class_rows(text: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The text feature of each image's class (R, B, D): ``text`` (R, C, D) class prototypes, or (R, B, C, D) each
    image's own conditioned prompts (CoCoOp); ``labels`` (B,), or (R, B) one batch per run."""
    if labels.dim() == 1:
        if text.dim() == 3:
            return text[:, labels]
        return text[:, torch.arange(labels.shape[0], device=labels.device), labels]
    width = text.shape[-1]
    if text.dim() == 3:
        return text.gather(1, labels.unsqueeze(-1).expand(-1, -1, width))
    return text.gather(2, labels[:, :, None, None].expand(-1, -1, 1, width)).squeeze(2)


class DePT(WrappedMethod):
    """A base method (``base_class``, held as ``base``: :class:`~atlas_fast.methods.wrapped.WrappedMethod`) + the
    channel-transform head. Learned tensors: the base's (``base.ctx``, ...), ``film_text_scale``/``film_text_bias``/
    ``film_image_scale``/``film_image_bias`` (R, D), ``linear_weight`` (R, C_train, D) and ``linear_bias``
    (R, C_train)."""

    base: CoOp
    base_class: ClassVar[type[CoOp]]

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: DePTHeadConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        device, dim, runs = self.base.ctx.device, backbone.embed_dim, self.num_runs
        self.film_text_scale = nn.Parameter(torch.ones(runs, dim, device=device))
        self.film_text_bias = nn.Parameter(torch.zeros(runs, dim, device=device))
        self.film_image_scale = nn.Parameter(torch.ones(runs, dim, device=device))
        self.film_image_bias = nn.Parameter(torch.zeros(runs, dim, device=device))
        linears = [nn.Linear(dim, len(classnames)) for _ in range(runs)]  # PyTorch's default init, after the base's
        self.linear_weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in linears]).to(device))
        self.linear_bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in linears]).to(device))
        self.head_classnames = tuple(classnames)
        self.set_classnames(classnames)

    # ---- class sets -------------------------------------------------------------------------------------------
    def set_classnames(self, classnames: Sequence[str]) -> None:
        """The base's prompts follow the new class set; the head keeps its training classes (see :meth:`head_rows`)."""
        super().set_classnames(classnames)
        self._head_rows = self.head_rows()

    def head_rows(self) -> torch.Tensor | None:
        """Rows of the head that score the current classes: every row for the training class set, the matching
        rows when the classes are an ordered subset of it (ImageNet-A/-R after ImageNet), else None (no head)."""
        rows, j = [], 0
        for name in self.classnames:
            while j < len(self.head_classnames) and self.head_classnames[j] != name:
                j += 1
            if j == len(self.head_classnames):
                return None
            rows.append(j)
            j += 1
        return torch.tensor(rows, device=self.linear_weight.device)

    # ---- head -------------------------------------------------------------------------------------------------
    def head_logits(self, features: torch.Tensor, modality: Literal["text", "image"]) -> torch.Tensor:
        """Unscaled head logits (R, B, C_train) of un-normalised features (1 or R, B, D) after that modality's FiLM."""
        scale, bias = ((self.film_text_scale, self.film_text_bias) if modality == "text"
                       else (self.film_image_scale, self.film_image_bias))
        filmed = features.to(scale.dtype) * scale.unsqueeze(1) + bias.unsqueeze(1)
        return torch.baddbmm(self.linear_bias.unsqueeze(1), filmed, self.linear_weight.transpose(1, 2))

    def fuse(self, image_features: torch.Tensor, similarity: torch.Tensor) -> torch.Tensor:
        """Test-time logits: ``(1 - λ) z + λ head`` (or the head alone without fusion) on the head's classes, z on
        any other class set."""
        return self.fuse_rows(image_features, similarity, self._head_rows)

    def fuse_rows(self, image_features: torch.Tensor, similarity: torch.Tensor,
                  rows: torch.Tensor | None) -> torch.Tensor:
        """:meth:`fuse` for the class set whose head rows are ``rows`` (:meth:`head_rows`; None: no head)."""
        if rows is None:
            return similarity
        head = self.head_logits(image_features, "image").index_select(-1, rows.to(similarity.device))
        if not self.config.fusion:
            return head
        lam = self.config.head_lambda
        return (1.0 - lam) * similarity + lam * head.to(similarity.dtype)

    # ---- hooks (the others are the base's) ---------------------------------------------------------------------
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Test-time logits (R, B, C) (see :meth:`fuse`); training goes through :meth:`training_loss`."""
        image = self.base.image_batch(images)
        return self.fuse(image, self.base.similarity_logits(image, self.base.class_text_features(image)))

    @torch.no_grad()
    def eval_logit_chunks(self, features: torch.Tensor) -> Iterator[torch.Tensor]:
        """The base's own test path chunk by chunk (CoCoOp's chunking), each chunk fused with the head."""
        start = 0
        for similarity in self.base.eval_logit_chunks(features):
            rows = similarity.shape[1]
            if self._head_rows is None:
                yield similarity
            else:
                yield self.fuse(features[start:start + rows].to(similarity.device).unsqueeze(0), similarity)
            start += rows

    def training_loss(self, inputs: torch.Tensor, labels: torch.Tensor, criterion: Criterion) -> torch.Tensor:
        """(1 - λ) criterion(z) + λ * mean over the 2B head rows + the base's non-CE term (KgCoOp)."""
        if self.classnames != self.head_classnames:
            raise ValueError("DePT trains on the class set its head was built for; call set_classnames with the "
                             "training classes first")
        image = self.base.image_batch(inputs)
        text = self.base.class_text_features(image)
        similarity = self.base.similarity_logits(image, text)
        head_text = self.head_logits(class_rows(text, labels), "text")
        head_image = self.head_logits(image, "image")
        # R runs trained together ((R, B) labels): each run's loss (R,), so each run logs its own
        loss_of = criterion.per_run if labels.dim() == 2 else criterion
        text_term = (loss_of(head_text, observe=False) if self.config.head_text_targets == "mirror"
                     else per_run_cross_entropy(head_text, labels, criterion))
        lam = self.config.head_lambda
        # only the similarity logits are the method's class predictions (what OLS learns its targets from)
        loss = ((1.0 - lam) * loss_of(similarity)
                + lam * 0.5 * (text_term + loss_of(head_image, observe=False)))
        extra = self.base.regularizer(text)
        return loss if extra is None else loss + extra

    def head_parameters(self) -> list[nn.Parameter]:
        return [self.film_text_scale, self.film_text_bias, self.film_image_scale, self.film_image_bias,
                self.linear_weight, self.linear_bias]

    def param_groups(self) -> list[dict]:
        """DePT's staged lr: the prompts (and meta-net) at the recipe's lr, FiLM + linear at ``head_lr_scale`` x it."""
        return [{"params": self.base.trainable_parameters(), "lr_scale": 1.0},
                {"params": self.head_parameters(), "lr_scale": self.config.head_lr_scale}]


def _check(method: str, family: str, setting: str, config: MethodConfig) -> None:
    check_family(method, family)
    if setting not in ("base2new", "cross_dataset"):
        raise MissingRecipe(method, setting, config)


def dept_coop_recipe(family: RecipeFamily, setting: Setting, shots: int,
                     dataset: str) -> tuple[DePTCoOpConfig, OptimRecipe]:
    """DePT-CoOp (``ExtrasLinearProbeCoOp/vit_b16_ep10_bs4_lr35``): 10 epochs, batch 4, lr 0.0035 (head 0.02275),
    λ 0.7, for base-to-new and cross-dataset (no few-shot recipe). ``original``: CoOp's defaults, 16 random tokens;
    ``paper``: M = 4 from "a photo of a"."""
    config = (DePTCoOpConfig(n_ctx=16, ctx_init="") if family == "original"
              else DePTCoOpConfig(ctx_init=PAPER_CTX_INIT))
    _check("DePT-CoOp", family, setting, config)
    return config, OptimRecipe(epochs=10, batch_size=4, lr=0.0035)


def dept_cocoop_recipe(family: RecipeFamily, setting: Setting, shots: int,
                       dataset: str) -> tuple[DePTCoCoOpConfig, OptimRecipe]:
    """DePT-CoCoOp (``ExtrasLinearProbeCoCoOp/vit_b16_c4_ep10_batch1_ctxv1``), both families: M = 4 from
    "a photo of a", 10 epochs, batch 1, lr 0.002 (head 0.013), λ 0.7 (no few-shot recipe)."""
    config = DePTCoCoOpConfig(ctx_init=PAPER_CTX_INIT)
    _check("DePT-CoCoOp", family, setting, config)
    return config, OptimRecipe(epochs=10, batch_size=1, lr=0.002)


def dept_kgcoop_recipe(family: RecipeFamily, setting: Setting, shots: int,
                       dataset: str) -> tuple[DePTKgCoOpConfig, OptimRecipe]:
    """DePT-KgCoOp (``ExtrasLinearProbeKgCoOp/vit_b16_ep10_ctxv1_bs4_lr35``), both families: M = 4 from
    "a photo of a", W = 2.0 with the KgCoOp/DePT template, 10 epochs, batch 4, lr 0.0035 (head 0.02275), λ 0.7."""
    config = DePTKgCoOpConfig(ctx_init=PAPER_CTX_INIT, kg_weight=2.0, template=atlas_template(dataset))
    _check("DePT-KgCoOp", family, setting, config)
    return config, OptimRecipe(epochs=10, batch_size=4, lr=0.0035)


def dept_maple_recipe(family: RecipeFamily, setting: Setting, shots: int,
                      dataset: str) -> tuple[DePTMaPLeConfig, OptimRecipe]:
    """DePT-MaPLe (``ExtrasLinearProbeMaPLe/vit_b16_c2_ep10_batch4_2ctx``): J = 9, 10 epochs, batch 4, lr 0.0035
    (head 0.02275), λ 0.7, for base-to-new and cross-dataset (no few-shot recipe). ``original``: M = 2 (the first two
    words of "a photo of a" learnable); ``paper``: M = 4."""
    config = DePTMaPLeConfig(n_ctx=2 if family == "original" else 4, ctx_init=PAPER_CTX_INIT, depth=9)
    _check("DePT-MaPLe", family, setting, config)
    return config, OptimRecipe(epochs=10, batch_size=4, lr=0.0035)


class DePTCoOp(DePT):
    supports_batched_runs = True  # the head's tensors and the base's lead with R
    name = "dept-coop"
    # the ATLaS paper's "DePT" rows are DePT on CoOp
    printed_name = "DePT"
    recipe_function = staticmethod(dept_coop_recipe)
    config_class = DePTCoOpConfig
    base_class = CoOp


class DePTCoCoOp(DePT):
    supports_batched_runs = True  # the head's tensors and the base's lead with R
    name = "dept-cocoop"
    printed_name = "DePT-CoCoOp"
    recipe_function = staticmethod(dept_cocoop_recipe)
    config_class = DePTCoCoOpConfig
    base_class = CoCoOp


class DePTKgCoOp(DePT):
    supports_batched_runs = True  # the head's tensors and the base's lead with R
    name = "dept-kgcoop"
    printed_name = "DePT-KgCoOp"
    recipe_function = staticmethod(dept_kgcoop_recipe)
    config_class = DePTKgCoOpConfig
    base_class = KgCoOp


class DePTMaPLe(DePT, PixelMethod):
    """DePT's head on MaPLe's prompted features; reads pixels (DePT's forward and loss, MaPLe's image features)."""

    name = "dept-maple"
    printed_name = "DePT-MaPLe"
    recipe_function = staticmethod(dept_maple_recipe)
    # MaPLe's tensors and the head's lead with R; the loss takes (R, B) labels (tests/test_batched.py)
    supports_batched_runs = True
    depth_options = ("depth",)
    config_class = DePTMaPLeConfig
    base_class = MaPLe

    def eval_pixel_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """MaPLe's prompted image features (R, B, D): what the head and the similarity logits both read."""
        return self.base.eval_pixel_features(pixels)

    def pixel_classifier(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """MaPLe's similarity logits of the current class set, fused with the head on its training classes."""
        text, rows = self.base.text_features(), self._head_rows
        return lambda image: self.fuse_rows(image, self.base.similarity_logits(image, text), rows)


register_method(DePTCoOp)
register_method(DePTCoCoOp)
register_method(DePTKgCoOp)
register_method(DePTMaPLe)
