"""PromptSRC: IVLP prompts regularised towards the frozen CLIP, with Gaussian prompt aggregation
(``docs/method-zoo.md``, section PromptSRC).

Architecture and learned tensors are IVLP's (:mod:`atlas_fast.methods.ivlp`) with 4 + 4 tokens, depth 9 / 9 and all
four words of "a photo of a" learnable. Training loss of a batch (t, v normalised prompted text / image features,
z = s v t^T with s = exp(logit_scale)):

    L = CE(z, y) + lambda_t * mean|t - t0| + lambda_v * mean|v - v0| + KL_sum(p0 || p) / (B * C)

* t0 = normalize(mean over the 60 ``IMAGENET_TEMPLATES`` of the frozen CLIP's **un-normalised** text features),
  computed once for the training classes;
* v0 = normalize(frozen CLIP image features of the **same augmented view**): the cached features of that seeded
  view (given only pixels, they are computed, as the reference does);
* z0 = s v0 t0^T; the KL is summed and divided by ``z.numel()`` = B * C (not by B); the L1 terms are element means.
  lambda_t = 25, lambda_v = 10 in every reference config.

With ATLaS the CE term is the label schedule's (one-hot or soft targets per epoch); the regularisers are unchanged.

GPA: after each epoch e (1-based) the learned tensors are scaled by g_e = N(e; mu, sigma) / sum_e' N(e'; mu, sigma)
and accumulated; the aggregate replaces them after the last epoch (evaluated and saved). Only the learned tensors
are aggregated (the reference's whole fp16 state dict re-rounds the frozen weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from atlas_fast.atlas.criterion import Criterion
from atlas_fast.clip.backbones import Backbone, encode_class_prompts
from atlas_fast.data.templates import IMAGENET_TEMPLATES
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.ivlp import IVLP, PAPER_CTX_INIT, IVLPConfig

# Few-shot datasets whose GPA is mean 45, std 5 (the others: 30 / 30)
# (SRC: configs/trainers/PromptSRC/vit_b16_c2_ep50_batch4_4+4ctx_few_shot.yaml and its scripts)
FEW_SHOT_GPA_LATE = ("StanfordCars", "OxfordFlowers", "FGVCAircraft", "DescribableTextures", "EuroSAT")


def gpa_weights(mean: float, std: float, epochs: int) -> torch.Tensor:
    """Normalised Gaussian weights (float64) of epochs 1..E: ``g_e ∝ exp(-(e - mean)^2 / (2 std^2))``."""
    if std <= 0:
        raise ValueError(f"GPA std must be > 0, got {std}")
    e = torch.arange(1, epochs + 1, dtype=torch.float64)
    density = torch.exp(-0.5 * ((e - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))
    if not density.sum() > 0:
        raise ValueError(f"GPA weights N(e; {mean}, {std}) underflow to 0 for every epoch 1..{epochs}")
    return density / density.sum()


# The teacher's text features by (backbone, device, class names): 60 templates x C prompts through the full-length
# text tower (ImageNet: 60,000 sequences), the same for every run of a sweep on those classes, so computed once per
# process rather than once per run (PromptSRC's runs train one by one). A few class sets are kept (C x D floats each).
_TEMPLATE_FEATURES: dict[tuple, torch.Tensor] = {}
_TEMPLATE_FEATURES_KEPT = 8


def template_text_features(backbone: Backbone, classnames: tuple[str, ...]) -> torch.Tensor:
    """(C, D): the frozen CLIP's un-normalised text features of ``classnames`` averaged over the 60
    ``IMAGENET_TEMPLATES``, in fp32 (autocast off); computed once per process for a backbone, device and class set."""
    key = (backbone.fingerprint, str(backbone.device), classnames)
    if key not in _TEMPLATE_FEATURES:
        names = [name.replace("_", " ") for name in classnames]
        total = None
        with torch.no_grad(), torch.autocast(backbone.device.type, enabled=False):
            for template in IMAGENET_TEMPLATES:
                features = encode_class_prompts(backbone, [template.format(name) for name in names])
                total = features if total is None else total + features
        if len(_TEMPLATE_FEATURES) >= _TEMPLATE_FEATURES_KEPT:
            _TEMPLATE_FEATURES.pop(next(iter(_TEMPLATE_FEATURES)))
        _TEMPLATE_FEATURES[key] = total / len(IMAGENET_TEMPLATES)
    return _TEMPLATE_FEATURES[key]


@dataclass(frozen=True)
class PromptSRCConfig(IVLPConfig):
    """PromptSRC = IVLP 4 + 4 at depth 9 / 9 + the self-regulating losses and GPA (base-to-new defaults)."""

    n_ctx_text: int = 4
    n_ctx_vision: int = 4
    ctx_init: str = PAPER_CTX_INIT
    depth_text: int = 9
    depth_vision: int = 9
    text_loss_weight: float = 25.0
    image_loss_weight: float = 10.0
    gpa_mean: float = 15.0
    gpa_std: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("text_loss_weight", "image_loss_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"PromptSRCConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.gpa_std <= 0:
            raise ValueError(f"PromptSRCConfig.gpa_std must be > 0, got {self.gpa_std}")


def promptsrc_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[PromptSRCConfig, OptimRecipe]:
    """PromptSRC's recipe (``docs/method-zoo.md``, section Recipes; the PromptSRC repository's configs). Both families
    are the same (its prompts are already 4 tokens from "a photo of a"). Batch 4, lr 0.0025, lambda_t 25, lambda_v 10.

    * base-to-new: 20 epochs, depth 9 / 9, GPA mean 15, std 1.
    * cross-dataset: 20 epochs, depth 3 / 3, GPA mean 6, std 10.
    * few-shot: 50 epochs, depth 9 / 9; GPA mean 30, std 30 on ImageNet, Caltech101, OxfordPets, Food101, UCF101,
      SUN397 and mean 45, std 5 on StanfordCars, OxfordFlowers, FGVCAircraft, DTD, EuroSAT. Other datasets get the
      flat 30 / 30 weighting (the references define none for them).
    """
    check_family("PromptSRC", family)
    if setting == "base2new":
        return PromptSRCConfig(), OptimRecipe(epochs=20, batch_size=4, lr=0.0025)
    if setting == "cross_dataset":
        return (PromptSRCConfig(depth_text=3, depth_vision=3, gpa_mean=6.0, gpa_std=10.0),
                OptimRecipe(epochs=20, batch_size=4, lr=0.0025))
    if setting == "few_shot":
        mean, std = (45.0, 5.0) if dataset in FEW_SHOT_GPA_LATE else (30.0, 30.0)
        return PromptSRCConfig(gpa_mean=mean, gpa_std=std), OptimRecipe(epochs=50, batch_size=4, lr=0.0025)
    raise MissingRecipe("PromptSRC", setting, PromptSRCConfig())  # a setting its references define no recipe for


class PromptSRC(IVLP):
    """IVLP + self-regulating constraints + Gaussian prompt aggregation; reads pixels and, when the input path
    has them, the frozen CLIP's cached features of the same views (``reads_frozen_features``)."""

    name = "promptsrc"
    printed_name = "PromptSRC"
    recipe_function = staticmethod(promptsrc_recipe)
    config_class = PromptSRCConfig
    reads_frozen_features = True

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.fixed_classnames = tuple(classnames)  # targets are for the classes it is built (trained) for
        self.fixed_embeddings: torch.Tensor | None = None  # computed at the first training step (not needed at test)
        self._gpa_sum: dict[str, torch.Tensor] | None = None

    def template_text_features(self, classnames: Sequence[str]) -> torch.Tensor:
        """(C, D): the frozen CLIP's un-normalised text features averaged over the 60 templates, in fp32 (the
        reference encodes them with an fp32 copy of CLIP). Kept per process (:func:`template_text_features`)."""
        return template_text_features(self.backbone, tuple(classnames))

    @torch.no_grad()
    def frozen_image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The unprompted CLIP's image features (B, D), or (R, B, D) of one batch per run: what the cache holds for
        these views."""
        if pixels.dim() == 5:
            return self.backbone.encode_image(pixels.flatten(0, 1)).view(*pixels.shape[:2], -1)
        return self.backbone.encode_image(pixels)

    def self_regulating_loss(self, text: torch.Tensor, image: torch.Tensor, logits: torch.Tensor,
                             frozen_image: torch.Tensor, criterion: Criterion | None = None) -> torch.Tensor:
        """L_SCL of each run (R,): text (R, C, D) and image (R, B, D) normalised, logits (R, B, C), frozen image
        features (B, D) or (R, B, D) un-normalised. ``criterion``: the step's, whose sizes say each run's rows when the
        batches of R runs trained together are zero-padded to B (the image terms average over a run's own rows
        only; its ``rows`` are on the device, so the step uploads nothing)."""
        if tuple(self.classnames) != self.fixed_classnames:
            raise RuntimeError("PromptSRC trains on the class set it was built for (its frozen text targets)")
        if self.fixed_embeddings is None or self.fixed_embeddings.device != text.device:
            self.fixed_embeddings = self.template_text_features(self.fixed_classnames).to(text.device)
        config = self.config
        fixed_text = F.normalize(self.fixed_embeddings.float(), dim=-1)
        fixed_image = F.normalize(frozen_image.float().to(fixed_text.device), dim=-1)
        fixed_logits = self.logit_scale * fixed_image @ fixed_text.t()
        text_l1 = (text.float() - fixed_text).abs().mean(dim=(1, 2))
        image_gap = (image.float() - fixed_image).abs()
        kl = F.kl_div(F.log_softmax(logits.float(), dim=-1), F.log_softmax(fixed_logits, dim=-1).expand_as(logits),
                      reduction="none", log_target=True)
        mask = criterion.padding_mask(logits.shape[1]) if criterion is not None else None
        if criterion is None or mask is None:  # every row is a run's own
            image_l1 = image_gap.mean(dim=(1, 2))
            kl = kl.sum(dim=(1, 2)) / logits[0].numel()
        else:  # only the first sizes[r] rows of run r (a run that sits out the step gets 0)
            count = criterion.rows.clamp(min=1).float()
            image_l1 = (image_gap.mean(dim=2) * mask).sum(dim=1) / count
            kl = (kl.sum(dim=2) * mask).sum(dim=1) / (count * logits.shape[2])
        return config.text_loss_weight * text_l1 + config.image_loss_weight * image_l1 + kl

    def training_loss(self, inputs, labels: torch.Tensor, criterion: Criterion) -> torch.Tensor:
        """criterion(z) + L_SCL (each run's (R,) when R runs train together). ``inputs``: pixels (B, 3, H, W) or
        (R, B, 3, H, W), or (pixels, cached frozen features (B, D) or (R, B, D)) (an
        :class:`atlas_fast.engine.feed.PixelBatch`)."""
        pixels, frozen = inputs if isinstance(inputs, tuple) else (inputs, None)
        if frozen is None:
            frozen = self.frozen_image_features(pixels)
        text = self.text_features()
        image = F.normalize(self.image_batch(pixels), dim=-1)
        logits = self.similarity_logits(image, text)
        if labels.dim() == 1:  # one batch (seen by every run)
            return criterion(logits) + self.self_regulating_loss(text, image, logits, frozen).sum()
        # R runs trained together, one batch per run: each run's loss (R,), so each run logs its own
        return criterion.per_run(logits) + self.self_regulating_loss(text, image, logits, frozen, criterion)

    def end_epoch(self, epoch: int, num_epochs: int) -> None:
        """Add this epoch's learned tensors, weighted by g_{epoch + 1}, to the GPA aggregate."""
        if epoch == 0:
            self._gpa_sum = None
        weight = float(gpa_weights(self.config.gpa_mean, self.config.gpa_std, num_epochs)[epoch])
        current = {name: p.detach().float() * weight for name, p in self.named_parameters() if p.requires_grad}
        if self._gpa_sum is None:
            self._gpa_sum = current
        else:
            for name, value in current.items():
                self._gpa_sum[name] += value

    def carry_runs(self, source: "PromptSRC", keep: Sequence[int]) -> None:
        """The GPA aggregate so far of ``source``'s runs ``keep``."""
        index = torch.tensor(list(keep))
        self._gpa_sum = None if source._gpa_sum is None else {
            name: value.index_select(0, index.to(value.device)) for name, value in source._gpa_sum.items()}

    def finish_training(self) -> None:
        """Replace the learned tensors by their Gaussian aggregate over epochs."""
        if self._gpa_sum is None:
            return
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name in self._gpa_sum:
                    p.copy_(self._gpa_sum[name].to(p.dtype))
        self._gpa_sum = None


register_method(PromptSRC)
