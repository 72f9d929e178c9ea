"""PromptKD (Li et al., CVPR 2024, "PromptKD: Unsupervised Prompt Distillation for Vision-Language Models"): a
PromptSRC teacher on a larger CLIP distils into a student with visual prompts and a projector into the teacher's
feature space, scored against the teacher's prompted text features, without labels (``docs/method-zoo.md``, section
PromptKD; reference zhengli97/PromptKD).

    z_T = s_T u g^T,   z_S = s normalize(P(x)) g^T
    L = w * T^2 * sum_{i,c} KL(softmax(z_T,i / T) || softmax(z_S,i / T)) / (B * C)

The teacher's prompted image features of every training view are cached, keyed by a fingerprint of its weights
*and* prompts (:meth:`PromptKD.view_teacher`); given pixels alone the teacher runs on them. The teacher itself is
:mod:`atlas_fast.methods.promptkd_teacher`.

Learned tensors (R runs lead every one): ``vision_ctx`` (R, M_v, w), ``deep_vision`` (R, J_v - 1, M_v, w),
N(0, 0.02^2) as IVLP's; the projector ``proj_w1`` (R, D_t, D_s), ``proj_b1``, ``proj_gamma``, ``proj_beta``,
``proj_w2`` (R, D_t, D_t), ``proj_b2`` (PyTorch's Conv2d / BatchNorm2d init); the BatchNorm's running statistics are
saved with them. A label schedule is refused (``uses_labels = False``); it trains on every training image of the
domain (``trains_on_domain``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.atlas.criterion import Criterion
from atlas_fast.clip.backbones import Backbone, BackboneConfig
from atlas_fast.clip.prompted_towers import PromptedVisionEncoder
from atlas_fast.methods.base import PromptMethod
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family, check_scale
from atlas_fast.methods.pixel_method import PixelMethod
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.teachers import teacher_for_views
from atlas_fast.methods.ivlp import PAPER_CTX_INIT, check_depth, normal_prompts
from atlas_fast.methods.promptkd_teacher import (TEACHER_OPTIONS, check_teacher_record, load_teacher,
                                                 teacher_shape_error, teacher_text_features)
from atlas_fast.methods.promptsrc import PromptSRC, PromptSRCConfig

# The official teacher: a PromptSRC (4 + 4 tokens, depth 9 / 9) on OpenAI's ViT-L/14.
DEFAULT_TEACHER = ("ViT-L-14", "openai")
# PyTorch's BatchNorm defaults (the official projector's BatchNorm2d).
BN_EPS, BN_MOMENTUM = 1e-5, 0.1
# Datasets whose KD weight is 200 in the official base-to-new script's note (1000 elsewhere).
KD_WEIGHT_200 = ("FGVCAircraft", "OxfordFlowers", "DescribableTextures")
@dataclass(frozen=True)
class PromptKDConfig(MethodConfig):
    """The student's visual prompts (M_v tokens, depth J_v), the distillation (KD weight w, temperature T) and the
    teacher: ``teacher`` an open_clip model, ``teacher_pretrained`` a tag, a checkpoint file or ``none``,
    ``teacher_prompts`` its learned prompts (an atlas_fast PromptSRC or IVLP record, the official Dassl checkpoint of
    the prompt learner, or ``none``: the prompts at their initialisation, drawn with seed 0, shaped by the
    ``teacher_*`` fields below). A record or a Dassl file decides its own prompt shapes."""

    n_ctx_vision: int = 4
    depth_vision: int = 9
    kd_weight: float = 1000.0
    temperature: float = 1.0
    teacher: str = DEFAULT_TEACHER[0]
    teacher_pretrained: str = DEFAULT_TEACHER[1]
    teacher_prompts: str = ""
    teacher_ctx_init: str = PAPER_CTX_INIT
    teacher_n_ctx_text: int = 4
    teacher_n_ctx_vision: int = 4
    teacher_depth_text: int = 9
    teacher_depth_vision: int = 9

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        if self.n_ctx_vision < 1:
            raise ValueError(f"{owner}.n_ctx_vision must be >= 1, got {self.n_ctx_vision}")
        if self.depth_vision < 0:
            raise ValueError(f"{owner}.depth_vision must be >= 0, got {self.depth_vision}")
        check_scale(self, "kd_weight")
        check_scale(self, "temperature", low_open=True)
        if self.teacher_prompts and self.teacher_prompts.lower() != "none":
            path = Path(self.teacher_prompts).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"PromptKD's teacher_prompts {path} is not a file (an atlas_fast record "
                                        f"JSON or an official Dassl checkpoint; {TEACHER_OPTIONS})")
            if path.suffix == ".json":
                check_teacher_record(self, path)
        # the teacher's own shape fields, for teacher_prompts=none (a record or a file brings its own)
        try:
            PromptSRCConfig(n_ctx_text=self.teacher_n_ctx_text, n_ctx_vision=self.teacher_n_ctx_vision,
                            ctx_init=self.teacher_ctx_init, depth_text=self.teacher_depth_text,
                            depth_vision=self.teacher_depth_vision)
        except ValueError as exc:
            raise ValueError(teacher_shape_error(exc)) from None

    def teacher_backbone(self) -> BackboneConfig:
        pretrained = None if self.teacher_pretrained.lower() == "none" else self.teacher_pretrained
        return BackboneConfig(self.teacher, pretrained)


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, weight: float, temperature: float
                      ) -> torch.Tensor:
    """``w T^2 sum KL(softmax(teacher / T) || softmax(student / T)) / (B C)`` of student logits (B, C) (the official
    ``F.kl_div(..., reduction="sum") * T * T / numel``)."""
    kl = F.kl_div(F.log_softmax(student.float() / temperature, dim=-1),
                  F.log_softmax(teacher.float() / temperature, dim=-1), reduction="sum", log_target=True)
    return weight * kl * temperature * temperature / student.numel()


def promptkd_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[PromptKDConfig, OptimRecipe]:
    """PromptKD's recipe (zhengli97/PromptKD ``configs/trainers/PromptKD`` and ``scripts/promptkd``; both families
    the same): 4 visual tokens, SGD lr 0.005, batch 8, 20 epochs (one constant warmup epoch at 1e-5, cosine), T = 1,
    the ViT-L/14 teacher.

    * base-to-new (``vit_b16_c2_ep20_batch8_4+4ctx``): depth 9; KD weight 1000, 200 on FGVC-Aircraft, Flowers102 and
      DTD (the script's note).
    * cross-dataset (``..._cross_datasets``, ImageNet source): depth 3, KD weight 1000.
    * few-shot: none (:class:`MissingRecipe`).
    """
    check_family("PromptKD", family)
    config = PromptKDConfig()
    optim = OptimRecipe(epochs=20, batch_size=8, lr=0.005)
    if setting == "base2new":
        weight = 200.0 if dataset in KD_WEIGHT_200 else 1000.0
        return dataclasses.replace(config, kd_weight=weight), optim
    if setting == "cross_dataset":
        return dataclasses.replace(config, depth_vision=3), optim
    raise MissingRecipe("PromptKD", setting, config)


class PromptKD(PixelMethod):
    """The PromptKD student: IVLP's visual prompts in the student's image tower, the projector into the teacher's
    feature space, the teacher's text features as its classifier."""

    name = "promptkd"
    printed_name = "PromptKD"
    recipe_function = staticmethod(promptkd_recipe)
    config_class = PromptKDConfig
    uses_labels = False
    trains_text_tower = False  # its classifier is the teacher's text features, computed once per class set
    #: trains on every training image of the dataset, all classes, unlabeled (the official base-to-novel and
    #: cross-dataset data: DATASET.NUM_SHOTS 0, SUBSAMPLE_CLASSES all); the engine hands it that list
    trains_on_domain = True
    # R runs train as one module: each run's BatchNorm statistics and loss over its own rows only
    supports_batched_runs = True
    #: the labelled method to compare with ATLaS (beyond_base_to_new): PromptSRC on the student's CLIP
    base_class: ClassVar[type[PromptMethod]] = PromptSRC
    # the student's only: the teacher's depths count its own towers (checked when it loads)
    depth_options = ("depth_vision",)

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig, runs: int = 1) -> None:
        super().__init__(backbone, classnames, config, runs)
        self.image_encoder = PromptedVisionEncoder(backbone)
        runs, device, width = self.num_runs, backbone.device, self.image_encoder.width
        check_depth(type(self).__name__, "depth_vision", config.depth_vision, self.image_encoder.layers, 0)
        self.vision_ctx = (nn.Parameter(normal_prompts((runs, config.n_ctx_vision, width), device))
                           if config.depth_vision > 0 else None)
        self.deep_vision = (nn.Parameter(normal_prompts((runs, config.depth_vision - 1, config.n_ctx_vision, width),
                                                        device)) if config.depth_vision > 1 else None)
        source = backbone.embed_dim
        target = self.teacher_dim(config, backbone)

        def conv_init(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:  # Conv2d's kaiming_uniform(a=sqrt 5)
            bound = 1.0 / math.sqrt(fan_in)
            return nn.Parameter(torch.empty((runs, *shape), device=device).uniform_(-bound, bound))

        self.proj_w1 = conv_init((target, source), source)
        self.proj_b1 = conv_init((target,), source)
        self.proj_gamma = nn.Parameter(torch.ones(runs, target, device=device))
        self.proj_beta = nn.Parameter(torch.zeros(runs, target, device=device))
        self.proj_w2 = conv_init((target, target), target)
        self.proj_b2 = conv_init((target,), target)
        self.register_buffer("proj_running_mean", torch.zeros(runs, target, device=device))
        self.register_buffer("proj_running_var", torch.ones(runs, target, device=device))
        self.set_classnames(classnames)

    # --- the teacher ------------------------------------------------------------------------------------------------
    @staticmethod
    def teacher_dim(config: PromptKDConfig, backbone: Backbone) -> int:
        """D_t, the teacher's feature width (the projector's output), read from its open_clip config without loading
        its weights where that is possible."""
        try:
            import open_clip

            return int(open_clip.get_model_config(config.teacher)["embed_dim"])
        except (TypeError, KeyError):
            return int(load_teacher(config, backbone.device).embed_dim)

    @classmethod
    def view_teacher(cls, config: PromptKDConfig, backbone: Backbone) -> Backbone:
        """The prompted teacher with ``backbone``'s transform: the feed caches its prompted image features of every
        training view in a file of its fingerprint (weights and prompts)."""
        return teacher_for_views("PromptKD", load_teacher(config, backbone.device), backbone, f"({TEACHER_OPTIONS})")

    @classmethod
    def check_before_work(cls, config: PromptKDConfig, backbone: Backbone) -> None:
        """At planning: the teacher, its weights and its prompts load and fit the student's views."""
        cls.view_teacher(config, backbone)

    @property
    def teacher(self) -> Backbone:
        """The prompted teacher, loaded at first use (training, or the text features of a class set)."""
        if getattr(self, "_teacher", None) is None:
            self._teacher = self.view_teacher(self.config, self.backbone)
        return self._teacher

    def teacher_text(self) -> torch.Tensor:
        """(C, D_t) normalised teacher text features of the current classes."""
        return teacher_text_features(self.teacher, self.classnames).to(self.device)

    def teacher_logits(self, features: torch.Tensor) -> torch.Tensor:
        """s_T cos(u, g): (B, C) of the teacher's un-normalised prompted image features (B, D_t), at the teacher's
        own temperature (as the official teacher scores)."""
        scale = self.teacher.model.logit_scale.detach().exp().to(features.device)
        return scale * F.normalize(features.float(), dim=-1) @ self.teacher_text().t()

    # --- the student ------------------------------------------------------------------------------------------------
    def set_classnames(self, classnames: Sequence[str]) -> None:
        if not classnames:
            raise ValueError("PromptKD needs at least one class name")
        self.classnames = tuple(classnames)

    def vision_prompts(self) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        return self.vision_ctx, list(self.deep_vision.unbind(1)) if self.deep_vision is not None else []

    def project(self, features: torch.Tensor, criterion: Criterion | None = None) -> torch.Tensor:
        """The projector on (R, B, D_s): linear, BatchNorm over the batch (training: the batch's statistics, the
        running ones updated with momentum 0.1 and the unbiased variance; evaluation: the running ones), ReLU,
        linear. ``criterion``: the step's, whose sizes say each run's own rows when R runs' batches are zero-padded
        to B (its statistics are over those rows only; a run with none leaves its running statistics); its row
        counts are already on the device, so a padded step uploads nothing."""
        h = torch.baddbmm(self.proj_b1.unsqueeze(1).to(features.dtype), features,
                          self.proj_w1.transpose(1, 2).to(features.dtype))
        if self.training:
            h32 = h.float()
            sizes = criterion.sizes if criterion is not None else None
            if sizes is None or min(sizes) == h.shape[1]:  # every row is a run's own
                mean = h32.mean(dim=1)
                var = h32.var(dim=1, unbiased=False)
                counts = torch.full((h.shape[0],), float(h.shape[1]), device=h.device)
            else:  # each run's statistics over its own rows, as training it alone computes them
                counts = criterion.rows.float()
                zeros = h32.new_zeros(h32.shape[-1])
                mean = torch.stack([h32[r, :n].mean(dim=0) if n else zeros for r, n in enumerate(sizes)])
                var = torch.stack([h32[r, :n].var(dim=0, unbiased=False) if n else zeros
                                   for r, n in enumerate(sizes)])
            with torch.no_grad():
                # a run with one row has no unbiased variance (the official loader drops such a batch), with none
                # nothing to add
                seen, spread = (counts > 0).unsqueeze(1), (counts > 1).unsqueeze(1)
                unbiased = var.detach() * (counts / (counts - 1).clamp(min=1)).unsqueeze(1)
                self.proj_running_mean.copy_(torch.where(
                    seen, (1 - BN_MOMENTUM) * self.proj_running_mean + BN_MOMENTUM * mean.detach(),
                    self.proj_running_mean))
                self.proj_running_var.copy_(torch.where(
                    spread, (1 - BN_MOMENTUM) * self.proj_running_var + BN_MOMENTUM * unbiased,
                    self.proj_running_var))
        else:
            mean, var = self.proj_running_mean, self.proj_running_var
        normed = (h.float() - mean.unsqueeze(1)) * torch.rsqrt(var.unsqueeze(1) + BN_EPS)
        normed = (normed * self.proj_gamma.unsqueeze(1) + self.proj_beta.unsqueeze(1)).to(h.dtype)
        return torch.baddbmm(self.proj_b2.unsqueeze(1).to(h.dtype), F.relu(normed),
                             self.proj_w2.transpose(1, 2).to(h.dtype))

    def image_batch(self, pixels: torch.Tensor, criterion: Criterion | None = None) -> torch.Tensor:
        """Projected student image features (R, B, D_t), un-normalised, of pixels (B, 3, H, W) seen by every run, or
        (R, B, 3, H, W), one batch per run (``criterion``: the step's, for each run's own rows of a padded batch)."""
        self.check_pixels(pixels)
        prompts, deep = self.vision_prompts()
        features = self.image_encoder(pixels, prompts, deep)
        if features.shape[0] != self.num_runs:
            features = features.expand(self.num_runs, -1, -1)
        return self.project(features, criterion)

    def raw_text_features(self) -> torch.Tensor:
        """(R, C, D_t): the teacher's text features of the current classes, the student's classifier (normalised
        already)."""
        return self.teacher_text().unsqueeze(0).expand(self.num_runs, -1, -1)

    def text_features(self) -> torch.Tensor:
        return self.raw_text_features()

    def split_inputs(self, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixels, the teacher's prompted image features (B, D_t)) of a training batch: served from the teacher's
        cache file, or (pixels alone) encoded by the teacher now."""
        pixels, cached = inputs if isinstance(inputs, tuple) else (inputs, None)
        if cached is None:
            teacher = self.teacher
            with torch.no_grad():
                cached = teacher.encode_image(pixels.to(teacher.device))
        return pixels, cached[..., -self.teacher.embed_dim:]

    def training_loss(self, inputs, labels: torch.Tensor | None, criterion: Criterion) -> torch.Tensor:
        """The distillation loss (labels only read for their shape and the criterion only for the runs' sizes:
        PromptKD learns from its teacher alone): summed over the runs for one batch seen by every run; each run's
        (R,) for R runs trained together on one batch each ((R, B) labels), over its own rows when padded."""
        pixels, teacher_features = self.split_inputs(inputs)
        teacher = self.teacher_logits(teacher_features)
        config = self.config
        if labels is None or labels.dim() == 1:  # one batch, seen by every run
            student = self.forward(pixels)
            return sum(distillation_loss(student[r], teacher, config.kd_weight, config.temperature)
                       for r in range(student.shape[0]))
        student = self.similarity_logits(self.image_batch(pixels, criterion), self.text_features())
        T = config.temperature
        kl = F.kl_div(F.log_softmax(student.float() / T, dim=-1), F.log_softmax(teacher.float() / T, dim=-1),
                      reduction="none", log_target=True).sum(dim=-1)  # (R, B)
        mask = criterion.padding_mask(student.shape[1])
        if mask is None:
            counts = torch.full((student.shape[0],), float(student.shape[1]), device=kl.device)
        else:  # the sizes on the device: no upload
            counts = criterion.rows.float()
            kl = kl * mask
        return config.kd_weight * T * T * kl.sum(dim=1) / (counts.clamp(min=1) * student.shape[2])

    # --- state --------------------------------------------------------------------------------------------------
    def state_for_checkpoint(self) -> dict[str, torch.Tensor]:
        """The learned tensors and the BatchNorm's running statistics (the test-time projector's)."""
        state = super().state_for_checkpoint()
        for name in ("proj_running_mean", "proj_running_var"):
            state[name] = getattr(self, name).detach().cpu().clone()
        return state

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        state = dict(state)
        running = {name: state.pop(name) for name in ("proj_running_mean", "proj_running_var") if name in state}
        super().load_checkpoint_state(state)
        missing = sorted({"proj_running_mean", "proj_running_var"} - set(running))
        if missing:
            raise KeyError(f"PromptKD checkpoint mismatch: missing {missing}")
        for name, value in running.items():
            buffer = getattr(self, name)
            if tuple(value.shape) != tuple(buffer.shape):
                raise ValueError(f"PromptKD checkpoint tensor {name!r} has shape {tuple(value.shape)}, expected "
                                 f"{tuple(buffer.shape)}")
            buffer.copy_(value.to(buffer))


register_method(PromptKD)
