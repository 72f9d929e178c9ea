"""KDPL (Mistretta et al., ECCV 2024, "Improving Zero-shot Generalization of Learned Prompts via Unsupervised Knowledge
Distillation") on CoOp, CoCoOp, MaPLe and PromptSRC: a larger frozen CLIP teacher's zero-shot predictions on every
training view supervise the student's prompts, without labels (``docs/method-zoo.md``, section KDPL).

    p_i = softmax(s cos(u_i, g) / T),   q_i = softmax(z_i / T)   (s: the **student's** temperature, as the reference)
    L = 1/2 KL(p || q) + 1/2 KL(q || p)   ("batchmean"; + PromptSRC's terms for KDPL on PromptSRC)

Class-agnostic KDPL (KDPL-CA) keeps, each step, the K = 1000 dictionary class names of highest batch-mean teacher
probability and builds the student's prompts for those. The teacher's image features of exactly the student's views
are cached under its own fingerprint (:meth:`KDPL.view_teacher`); given pixels alone, the teacher encodes them.
Learned tensors are the base method's; a label schedule is refused (``uses_labels = False``).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterator, Sequence

import torch
import torch.nn.functional as F

from atlas_fast.atlas.criterion import Criterion, run_logits
from atlas_fast.clip.backbones import Backbone, BackboneConfig
from atlas_fast.data.datasets import zeroshot_template
from atlas_fast.data.dictionary import read_classnames
from atlas_fast.data.templates import check_template, fill_template
from atlas_fast.methods.pixel_method import PixelMethod
from atlas_fast.methods.config import MethodConfig, MissingRecipe, OptimRecipe, check_family, check_scale
from atlas_fast.methods.registry import register_method
from atlas_fast.methods.teachers import load_teacher, teacher_for_views
from atlas_fast.methods.cocoop import CoCoOp, CoCoOpConfig
from atlas_fast.methods.coop import PAPER_CTX_INIT, CoOp, CoOpConfig
from atlas_fast.methods.maple import MaPLe, MaPLeConfig
from atlas_fast.methods.prompts import ClassPrompts, ContextPromptMethod
from atlas_fast.methods.promptsrc import PromptSRC, PromptSRCConfig, template_text_features
from atlas_fast.methods.wrapped import WrappedMethod

# The reference's teacher: open_clip's ViT-H-14 with QuickGELU and Apple's DFN-5B weights.
DEFAULT_TEACHER = ("ViT-H-14-quickgelu", "dfn5b")
# The class-agnostic teacher's prompt (the dictionary's names have no dataset to name).
AGNOSTIC_TEMPLATE = "a photo of a {}."
# Prompts per teacher text-tower call (the reference encodes its prompts 128 at a time: the same features).
TEACHER_TEXT_CHUNK = 1024


@dataclass(frozen=True)
class KDPLConfig(MethodConfig):
    """The distillation's settings (the reference's): the teacher (``teacher`` an open_clip model name,
    ``teacher_pretrained`` a tag, a checkpoint file or ``none`` for random weights), its prompt, the class-agnostic
    variant (``agnostic_classnames``: a file of class names, one per line or the reference's CSV with a
    ``ClassName`` header; ``k_max`` classes kept per step), the weights of the forward and reverse KL and the
    temperature T."""

    teacher: str = DEFAULT_TEACHER[0]
    teacher_pretrained: str = DEFAULT_TEACHER[1]
    teacher_template: str = "a photo of a {}."
    class_agnostic: bool = False
    agnostic_classnames: str = ""
    k_max: int = 1000
    forward_weight: float = 0.5
    reverse_weight: float = 0.5
    temperature: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_template(self.teacher_template, f"{owner}.teacher_template")
        if self.class_agnostic and not self.agnostic_classnames:
            raise ValueError(f"{owner}: class_agnostic=True needs agnostic_classnames=FILE, the dictionary of class "
                             f"names the teacher scores (the reference's is classnames_dictionay.csv of "
                             f"miccunifi/KDPL, 20,930 names: one name per line, or a CSV with a ClassName header)")
        if self.k_max < 1:
            raise ValueError(f"{owner}.k_max must be >= 1 classes per step, got {self.k_max}")
        for name in ("forward_weight", "reverse_weight"):
            check_scale(self, name)
        if not self.forward_weight + self.reverse_weight > 0:
            raise ValueError(f"{owner}: forward_weight + reverse_weight must be > 0 (nothing would be distilled)")
        check_scale(self, "temperature", low_open=True)

    def teacher_backbone(self) -> BackboneConfig:
        pretrained = None if self.teacher_pretrained.lower() == "none" else self.teacher_pretrained
        return BackboneConfig(self.teacher, pretrained)


@dataclass(frozen=True)
class KDPLCoOpConfig(CoOpConfig, KDPLConfig):
    """KDPL on CoOp: CoOp's fields + the distillation's."""


@dataclass(frozen=True)
class KDPLCoCoOpConfig(CoCoOpConfig, KDPLConfig):
    """KDPL on CoCoOp: CoCoOp's fields + the distillation's."""


@dataclass(frozen=True)
class KDPLMaPLeConfig(MaPLeConfig, KDPLConfig):
    """KDPL on MaPLe: MaPLe's fields + the distillation's."""


@dataclass(frozen=True)
class KDPLPromptSRCConfig(PromptSRCConfig, KDPLConfig):
    """KDPL on PromptSRC: PromptSRC's fields (its self-regulating weights and GPA) + the distillation's."""


# The teacher's normalised text features by (teacher, device, prompts): the same for every run and seed of a sweep
# on those classes, and a ViT-H text tower over a 20,930-name dictionary is not cheap. A few sets are kept.
_TEACHER_TEXT: dict[tuple, torch.Tensor] = {}
_TEACHER_TEXT_KEPT = 4


def teacher_text_features(teacher: Backbone, template: str, classnames: Sequence[str]) -> torch.Tensor:
    """(C, D_teacher): the teacher's normalised text features of ``template`` for ``classnames``, fp32, kept per
    process."""
    key = (teacher.fingerprint, str(teacher.device), template, tuple(classnames))
    if key not in _TEACHER_TEXT:
        prompts = fill_template(template, classnames)
        with torch.no_grad(), torch.autocast(teacher.device.type, enabled=False):
            features = torch.cat([teacher.encode_text(prompts[i:i + TEACHER_TEXT_CHUNK]).float()
                                  for i in range(0, len(prompts), TEACHER_TEXT_CHUNK)])
        if len(_TEACHER_TEXT) >= _TEACHER_TEXT_KEPT:
            _TEACHER_TEXT.pop(next(iter(_TEACHER_TEXT)))
        _TEACHER_TEXT[key] = F.normalize(features, dim=-1)
    return _TEACHER_TEXT[key]


class Distillation(Criterion):
    """KDPL's criterion, in place of the step's cross-entropy: ``forward_weight * KL(p || q) + reverse_weight *
    KL(q || p)`` of each run, q from the student's logits (R, B, C), p from the teacher's (B, C), or (R, B, C) one
    batch per run; each KL summed over classes and averaged over the run's own rows (the step's sizes: a padded
    run's padding is left out, a run that sits the step out gets 0)."""

    def __init__(self, teacher: torch.Tensor, config: KDPLConfig, step: Criterion) -> None:
        super().__init__(step.sizes, step.rows)
        self.teacher, self.config = teacher, config
        self.last: torch.Tensor | None = None  # each run's loss of the last call

    def __call__(self, logits: torch.Tensor, observe: bool = True) -> torch.Tensor:
        self.last = self.per_run(logits, observe)
        return self.last.sum()

    def per_run(self, logits: torch.Tensor, observe: bool = True) -> torch.Tensor:
        config = self.config
        q = F.log_softmax(run_logits(logits).float() / config.temperature, dim=-1)
        p = F.log_softmax(self.teacher.float() / config.temperature, dim=-1).expand_as(q)
        forward = F.kl_div(q, p, log_target=True, reduction="none")  # (R, B, C)
        reverse = F.kl_div(p, q, log_target=True, reduction="none")
        mask = self.padding_mask(q.shape[1])
        if mask is None:  # "batchmean" of each run
            forward, reverse = forward.sum(dim=(1, 2)) / q.shape[1], reverse.sum(dim=(1, 2)) / q.shape[1]
        else:
            rows = self.rows.clamp(min=1)
            forward = (forward.sum(dim=2) * mask).sum(dim=1) / rows
            reverse = (reverse.sum(dim=2) * mask).sum(dim=1) / rows
        return config.forward_weight * forward + config.reverse_weight * reverse


def class_prompts_subset(prompts: ClassPrompts, index: torch.Tensor) -> ClassPrompts:
    """The class prompts of the classes ``index`` of ``prompts`` (no tokenizing: its buffers' rows)."""
    rows = index.tolist()
    subset = ClassPrompts(prompts.backbone, prompts.n_ctx, prompts.prompt_prefix, prompts.class_token_position,
                          prompts.per_class_context)
    subset.classnames = tuple(prompts.classnames[i] for i in rows)
    for name in ("token_prefix", "token_suffix", "eot_index", "layout"):
        value = getattr(prompts, name)
        subset.register_buffer(name, value[index] if value is not None else None, persistent=False)
    subset.shared_words = prompts.shared_words  # words every class shares stay shared in any subset
    return subset


class KDPL(WrappedMethod):
    """The distillation around a base method (a CoOp-family or IVLP-family class, ``base_class``, held as ``base``:
    :class:`~atlas_fast.methods.wrapped.WrappedMethod`): its forward, evaluation and learned tensors are the base's,
    and so is its checkpoint (the base's names, ``ctx``, ...); the loss is the base's with :class:`Distillation` as
    its criterion. R runs train as one module, each run's KL over its own rows; class-agnostic runs, whose kept
    dictionary classes are each run's own per step, train one by one (:meth:`batches_runs`)."""

    base: ContextPromptMethod
    base_class: ClassVar[type[ContextPromptMethod]]
    uses_labels = False
    supports_batched_runs = True

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: KDPLConfig, runs: int = 1) -> None:
        if config.class_agnostic and runs > 1:
            raise ValueError(f"{type(self).__name__}: class-agnostic KDPL keeps each run's own top-{config.k_max} "
                             f"dictionary classes per step, so its runs cannot train as one module; got "
                             f"{runs} runs (train them one by one)")
        super().__init__(backbone, classnames, config, runs)

    @classmethod
    def batches_runs(cls, config: MethodConfig) -> bool:
        """Class-aware KDPL's runs train together; class-agnostic ones one by one (each run's own kept classes)."""
        return not getattr(config, "class_agnostic", False)

    @classmethod
    def view_teacher(cls, config: KDPLConfig, backbone: Backbone) -> Backbone:
        """The teacher (loaded once per process) with ``backbone``'s transform: it encodes the student's views, as
        the reference feeds the student's preprocessed images to the teacher."""
        teacher = load_teacher("KDPL", config.teacher, config.teacher_pretrained, backbone.device)
        return teacher_for_views("KDPL", teacher, backbone, "with --method-option teacher=MODEL")

    @classmethod
    def check_before_work(cls, config: KDPLConfig, backbone: Backbone) -> None:
        """At planning, before any image is encoded: the teacher loads and fits the student's views
        (:meth:`view_teacher`), and a class-agnostic run's dictionary exists, is a file and decodes."""
        super().check_before_work(config, backbone)
        if config.class_agnostic:
            read_classnames(config.agnostic_classnames)

    def state_for_checkpoint(self) -> dict[str, torch.Tensor]:
        """The base's learned tensors under the base's own names: a KDPL model is its base method at test time."""
        return self.base.state_for_checkpoint()

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        self.base.load_checkpoint_state(state)

    @property
    def teacher(self) -> Backbone:
        """The teacher, loaded at the first training step (evaluating a KDPL model never needs it)."""
        if getattr(self, "_teacher", None) is None:
            self._teacher = self.view_teacher(self.config, self.backbone)
        return self._teacher

    def teacher_classes(self) -> tuple[tuple[str, ...], str]:
        """(class names, prompt) the teacher scores: the dictionary (class-agnostic) or the current classes."""
        config = self.config
        if config.class_agnostic:
            if getattr(self, "_dictionary", None) is None:
                self._dictionary = read_classnames(config.agnostic_classnames)
            return self._dictionary, AGNOSTIC_TEMPLATE
        return self.classnames, config.teacher_template

    def teacher_logits(self, features: torch.Tensor) -> torch.Tensor:
        """s cos(u, g): (B, C_teacher) of the teacher's un-normalised image features (B, D_teacher) (or (R, B, ...),
        one batch per run), at the student's temperature s."""
        names, template = self.teacher_classes()
        text = teacher_text_features(self.teacher, template, names).to(features.device)
        return self.logit_scale * F.normalize(features.float(), dim=-1) @ text.t()

    def split_inputs(self, inputs) -> tuple[object, torch.Tensor]:
        """(the base method's inputs, the teacher's image features (B, D_teacher)) of a training batch."""
        width = int(self.teacher.embed_dim)
        if self.reads_pixels:
            pixels, extra = inputs if isinstance(inputs, tuple) else (inputs, None)
            if extra is None:  # pixels alone (B, 3, H, W) or (R, B, 3, H, W): the teacher encodes them
                encoded = self.teacher.encode_image(pixels.flatten(0, -4).to(self.teacher.device))
                return pixels, encoded.view(*pixels.shape[:-3], -1)
            own = extra[..., :-width]
            return ((pixels, own) if own.shape[-1] else pixels), extra[..., -width:]
        if inputs.shape[-1] != self.backbone.embed_dim + width:
            raise ValueError(f"{self.name} trains on cached features with its teacher's appended, (B, "
                             f"{self.backbone.embed_dim} + {width}); got {tuple(inputs.shape)}")
        return inputs[..., :-width], inputs[..., -width:]

    def training_loss(self, inputs, labels: torch.Tensor, criterion: Criterion) -> torch.Tensor:
        """The base method's training loss with the step's criterion replaced by the symmetric KL to the teacher
        (:class:`Distillation`, over the step's runs and sizes; labels unused: KDPL learns from the teacher alone).
        Class-agnostic: the student's classes are, for this step, the dictionary's top K by batch-mean teacher
        probability."""
        student_inputs, teacher_features = self.split_inputs(inputs)
        teacher = self.teacher_logits(teacher_features)
        config = self.config
        classes = nullcontext()
        if config.class_agnostic:
            kept = torch.softmax(teacher.float(), dim=-1).mean(dim=0).topk(min(config.k_max, teacher.shape[1])).indices
            teacher, classes = teacher[:, kept], self.dictionary_classes(kept)
        distillation = Distillation(teacher, config, criterion)
        with classes:
            loss = self.base.training_loss(student_inputs, labels, distillation)
        if loss.dim() == 0 and criterion.runs > 1 and distillation.last is not None:
            return distillation.last  # a base whose loss is the criterion's alone returns their sum: each run's own
        return loss

    @contextmanager
    def dictionary_classes(self, kept: torch.Tensor) -> Iterator[None]:
        """Within the block, the student's classes are the dictionary's classes ``kept`` (class-agnostic KDPL)."""
        base = self.base
        if getattr(self, "_dictionary_prompts", None) is None:
            prompts = ClassPrompts(self.backbone, base.class_prompts.n_ctx, base.class_prompts.prompt_prefix,
                                   base.class_prompts.class_token_position)
            prompts.set_classnames(self.teacher_classes()[0], base.ctx.device)
            self._dictionary_prompts = prompts
        saved = base.class_prompts, base.classnames
        subset = class_prompts_subset(self._dictionary_prompts, kept)
        base.class_prompts, base.classnames = subset, subset.classnames
        try:
            yield
        finally:
            base.class_prompts, base.classnames = saved


def kdpl_recipe(name: str, family: str, setting: str, dataset: str, config: KDPLConfig, epochs: int, batch: int,
                lr: float, settings: Sequence[str] = ("base2new", "cross_dataset")) -> tuple[KDPLConfig, OptimRecipe]:
    """A KDPL recipe (its configs under miccunifi/KDPL ``src/configs/trainers/*_KDPL``; SGD, one constant warmup
    epoch, per-epoch cosine; class-aware with the ViT-H-14 DFN-5B teacher and CoOp's zero-shot template of the
    dataset). The reference scripts base-to-new and cross-dataset (ImageNet source) with the same config; few-shot
    raises :class:`MissingRecipe`."""
    check_family(name, family)
    config = dataclasses.replace(config, teacher_template=zeroshot_template(dataset))
    if setting not in settings:
        raise MissingRecipe(name, setting, config)
    return config, OptimRecipe(epochs=epochs, batch_size=batch, lr=lr)


def kdpl_coop_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[KDPLCoOpConfig, OptimRecipe]:
    """KDPL-CoOp (``CoOp_KDPL/vit_b32_ctxv1``): M = 4 from "a photo of a" in both families, 50 epochs, batch 32,
    lr 0.002."""
    return kdpl_recipe("KDPL-CoOp", family, setting, dataset, KDPLCoOpConfig(ctx_init=PAPER_CTX_INIT), 50, 32, 0.002)


def kdpl_cocoop_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[KDPLCoCoOpConfig, OptimRecipe]:
    """KDPL-CoCoOp (``CoCoOp_KDPL/vit_b32_c4_ep10_batch1_ctxv1``): M = 4 from "a photo of a", 10 epochs, batch 1,
    lr 0.002."""
    return kdpl_recipe("KDPL-CoCoOp", family, setting, dataset, KDPLCoCoOpConfig(ctx_init=PAPER_CTX_INIT), 10, 1,
                       0.002)


def kdpl_maple_recipe(family: str, setting: str, shots: int, dataset: str) -> tuple[KDPLMaPLeConfig, OptimRecipe]:
    """KDPL-MaPLe (``MaPLe_KDPL/vit_b32_c2_ep5_batch4_2ctx``, also its cross-dataset config): J = 9, 5 epochs,
    batch 4, lr 0.0035; ``original`` M = 2, ``paper`` M = 4 (all four words of "a photo of a" learnable)."""
    config = KDPLMaPLeConfig(n_ctx=2 if family == "original" else 4, ctx_init=PAPER_CTX_INIT, depth=9)
    return kdpl_recipe("KDPL-MaPLe", family, setting, dataset, config, 5, 4, 0.0035)


def kdpl_promptsrc_recipe(family: str, setting: str, shots: int,
                          dataset: str) -> tuple[KDPLPromptSRCConfig, OptimRecipe]:
    """KDPL-PromptSRC (``PromptSRC_KDPL/vit_b32_c2_ep20_batch4_4+4ctx``; cross-dataset ``..._cross_datasets``:
    depth 3 / 3, GPA 6, 10): 4 + 4 tokens from "a photo of a", depth 9 / 9, λ_t 25, λ_v 10, GPA 15, 1, 20 epochs,
    batch 4, lr 0.0025, in both families."""
    config = (KDPLPromptSRCConfig(depth_text=3, depth_vision=3, gpa_mean=6.0, gpa_std=10.0)
              if setting == "cross_dataset" else KDPLPromptSRCConfig())
    return kdpl_recipe("KDPL-PromptSRC", family, setting, dataset, config, 20, 4, 0.0025)


class KDPLCoOp(KDPL):
    name = "kdpl-coop"
    printed_name = "KDPL-CoOp"
    recipe_function = staticmethod(kdpl_coop_recipe)
    config_class = KDPLCoOpConfig
    base_class = CoOp


class KDPLCoCoOp(KDPL):
    name = "kdpl-cocoop"
    printed_name = "KDPL-CoCoOp"
    recipe_function = staticmethod(kdpl_cocoop_recipe)
    config_class = KDPLCoCoOpConfig
    base_class = CoCoOp


class KDPLMaPLe(KDPL, PixelMethod):
    name = "kdpl-maple"
    printed_name = "KDPL-MaPLe"
    recipe_function = staticmethod(kdpl_maple_recipe)
    config_class = KDPLMaPLeConfig
    base_class = MaPLe
    depth_options = ("depth",)


class KDPLPromptSRC(KDPL, PixelMethod):
    """KDPL on PromptSRC: the self-regulating terms and GPA stay; in the class-agnostic variant its frozen text
    targets are the kept dictionary classes'."""

    name = "kdpl-promptsrc"
    printed_name = "KDPL-PromptSRC"
    recipe_function = staticmethod(kdpl_promptsrc_recipe)
    config_class = KDPLPromptSRCConfig
    base: PromptSRC
    base_class = PromptSRC
    reads_frozen_features = True
    depth_options = ("depth_text", "depth_vision")

    @contextmanager
    def dictionary_classes(self, kept: torch.Tensor) -> Iterator[None]:
        with super().dictionary_classes(kept):
            base = self.base
            saved = base.fixed_classnames, base.fixed_embeddings
            dictionary = template_text_features(self.backbone, self.teacher_classes()[0])
            base.fixed_classnames = base.classnames
            base.fixed_embeddings = dictionary.to(kept.device)[kept]
            try:
                yield
            finally:
                base.fixed_classnames, base.fixed_embeddings = saved


register_method(KDPLCoOp)
register_method(KDPLCoCoOp)
register_method(KDPLMaPLe)
register_method(KDPLPromptSRC)
