"""The interface every prompt-tuning method implements, its registry, and the optimisation recipe type.

A method owns its *learned* tensors (prompts, meta-nets, heads) and the class-name buffers it builds from the current
class set; the frozen CLIP stays in the :class:`~atlas_fast.clip.backbones.Backbone` and is **not** part of the method's
module tree, so ``.to()``, ``.train()``, ``parameters()`` and checkpoints touch only what the method learns.

``R`` (number of runs trained together, e.g. several seeds of one sweep) is the leading dimension of every learned
tensor and of the text path: ``text_features()`` is (R, C, D) and ``forward()`` gives logits (R, B, C), so runs can
share one batched text-encoder pass. ``R = 1`` is an ordinary single run.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, ClassVar, Iterator, Literal, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.clip.backbones import Backbone
from atlas_fast.vocabulary import OPTIMIZERS, RECIPE_FAMILIES as _RECIPE_FAMILIES, SETTINGS, Optimizer

# Images per chunk when a method evaluates cached test features chunk by chunk.
EVAL_BATCH = 1024


@dataclass(frozen=True)
class OptimRecipe:
    """A method's optimisation recipe (``docs/protocol.md``, section Optimisation). Default: Dassl's SGD + per-epoch
    cosine after a constant warmup.

    The warmup epochs count inside ``epochs``; lr of 0-based epoch e is ``warmup_lr`` for e < warmup_epochs, then
    ``0.5 * lr * (1 + cos(pi * (e - warmup_epochs) / epochs))``.

    ``optimizer``: ``sgd`` (``momentum``, ``weight_decay``), ``adam`` (Dassl's: L2 ``weight_decay`` added to the
    gradient, TCP) or ``adamw`` (decoupled weight decay, CLIP-LoRA), both with ``betas``. ``iterations``: the
    schedule counts optimiser steps instead of epochs (CLIP-LoRA's ``CosineAnnealingLR`` stepped every iteration):
    step t runs at ``min_lr + 0.5 * (lr - min_lr) * (1 + cos(pi * t / iterations))``, there is no warmup, and
    training stops after ``iterations`` steps, inside an epoch if it must. ``epochs`` is then resolved when a run is
    planned, from its training images: ``ceil(iterations / steps per epoch)``.
    """

    epochs: int
    batch_size: int
    lr: float
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup_epochs: int = 1
    warmup_lr: float = 1e-5
    scheduler: Literal["cosine"] = "cosine"
    optimizer: Optimizer = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    iterations: int | None = None
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"OptimRecipe.epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"OptimRecipe.batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"OptimRecipe.lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_epochs < self.epochs + 1:
            raise ValueError(f"OptimRecipe.warmup_epochs must be in [0, epochs={self.epochs}], got {self.warmup_epochs}")
        if self.scheduler != "cosine":
            raise ValueError(f"OptimRecipe.scheduler must be 'cosine' (the only schedule the recipes use), "
                             f"got {self.scheduler!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"OptimRecipe.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"OptimRecipe.betas must be two numbers in [0, 1), got {self.betas}")
        if self.iterations is not None:
            if self.iterations < 1:
                raise ValueError(f"OptimRecipe.iterations must be >= 1 optimiser steps, got {self.iterations}")
            if self.warmup_epochs:
                raise ValueError("OptimRecipe: a schedule over iterations has no warmup epochs (warmup_epochs=0)")
        if not 0.0 <= self.min_lr <= self.lr:
            raise ValueError(f"OptimRecipe.min_lr must be in [0, lr={self.lr}], got {self.min_lr}")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a record stores them; those added after the first records (``ADDED_FIELDS``) only where they
        differ from their defaults, so every earlier run keeps its record name."""
        described = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, default in ADDED_FIELDS.items():
            if described[name] == default:
                del described[name]
        if "betas" in described:
            described["betas"] = list(described["betas"])
        return described

    def lr_at_step(self, step: int) -> float:
        """The lr of 0-based optimiser step ``step`` of a schedule over :attr:`iterations`."""
        if self.iterations is None:
            raise ValueError("lr_at_step needs a recipe with iterations (its schedule counts epochs otherwise)")
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * step / self.iterations))

    def for_training_images(self, images: int, epochs: int | None = None) -> "OptimRecipe":
        """A schedule over iterations with its epochs resolved for ``images`` training images (the last partial
        batch is a step); ``epochs`` (an override) instead trains that many whole epochs, the iterations with them.
        Recipes without iterations are returned unchanged."""
        if self.iterations is None:
            return self
        steps = -(-images // self.batch_size)
        if epochs is not None:
            return replace(self, epochs=epochs, iterations=epochs * steps)
        return replace(self, epochs=-(-self.iterations // steps))


# OptimRecipe's fields added after records were first written, with their defaults (OptimRecipe.to_dict).
ADDED_FIELDS: dict[str, Any] = {"optimizer": "sgd", "betas": (0.9, 0.999), "iterations": None, "min_lr": 0.0}


RecipeFunction = Callable[[str, str, int, str], "tuple[MethodConfig, OptimRecipe]"]


@dataclass(frozen=True)
class MethodConfig:
    """Fields shared by every method's config. ``num_runs`` = R, the runs trained together in one module."""

    num_runs: int = 1

    def __post_init__(self) -> None:
        if self.num_runs < 1:
            raise ValueError(f"{type(self).__name__}.num_runs must be >= 1, got {self.num_runs}")
        check_finite_fields(self)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# The largest weight or scale a method option may take: loss weights and lr scales beyond it are no recipe (the
# references use at most 25) and overflow float32 losses, so a typo is refused here rather than as a divergence.
MAX_OPTION_SCALE = 1e4


def load_teacher(owner: str, model: str, pretrained: str, device: Any, model_option: str = "teacher",
                 weights_option: str = "teacher_pretrained") -> Backbone:
    """A teacher-based method's frozen teacher CLIP (open_clip ``model`` with ``pretrained``: a tag, a checkpoint
    file or ``none``), loaded once per process. Any failure (an unknown model, weights not on this machine, a missing,
    damaged or other architecture's file) raises the loader's error type with a message that starts with
    ``owner``'s teacher and names the teacher's own options (``--method-option teacher=... teacher_pretrained=...``)
    where the loader's would name the student's. The reusable half of a teacher check
    (:meth:`PromptMethod.check_before_work`)."""
    from atlas_fast.clip.backbones import BackboneConfig, shared_backbone
    from atlas_fast.clip.weights_files import in_teacher_words

    weights = None if pretrained.lower() == "none" else pretrained
    try:
        return shared_backbone(BackboneConfig(model, weights), device)
    except (OSError, ValueError, NotImplementedError) as exc:
        text = in_teacher_words(str(exc), model_option, weights_option)
        raise type(exc)(f"{owner}'s teacher {model} ({pretrained}) cannot be loaded: {text} For the teacher "
                        f"itself: --method-option {model_option}=MODEL {weights_option}=TAG|FILE|none (Python: "
                        f"method_options), e.g. {model_option}=ViT-B-16 "
                        f"{weights_option}=~/.cache/clip/ViT-B-16.pt") from None


def teacher_for_views(owner: str, teacher: Backbone, student: Backbone, choose: str) -> Backbone:
    """``teacher`` with ``student``'s image transform: the teacher-based reference trainers feed the student's
    preprocessed images to the teacher, so the feed encodes the student's views with it. A teacher of another image
    size is refused, ``choose`` saying how to pick one."""
    size, own = student.preprocessing.image_size, teacher.preprocessing.image_size
    if size != own:
        raise ValueError(f"{owner}'s teacher {teacher.describe()} takes {own} px images, but the student's views are "
                         f"{size} px (the reference feeds the student's images to the teacher); choose a teacher of "
                         f"the student's image size {choose}")
    return replace(teacher, preprocessing=student.preprocessing)


def check_finite_fields(config: Any) -> None:
    """Refuse a config (a dataclass) holding a float field that is NaN or infinite, naming the field: such a value
    passes every ``>= 0`` check and only fails after the features are encoded."""
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{type(config).__name__}.{f.name} must be a finite number, got {value}")


def check_scale(config: Any, name: str, low: float = 0.0, high: float = MAX_OPTION_SCALE,
                low_open: bool = False) -> None:
    """Refuse ``config.<name>`` outside ``[low, high]`` (``(low, high]`` with ``low_open``), naming the field."""
    value = getattr(config, name)
    inside = (low < value if low_open else low <= value) and value <= high
    if not inside:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{type(config).__name__}.{name} must be in {interval}, got {value}")


#: Every rebuild of a method's class buffers gets the next number (:attr:`PromptMethod.class_version`).
_CLASS_SET_VERSIONS = itertools.count(1)


def _versioned(set_classnames: Callable[..., None]) -> Callable[..., None]:
    """``set_classnames`` that gives the method a new :attr:`PromptMethod.class_version` whenever it returns."""
    import functools

    @functools.wraps(set_classnames)
    def wrapper(self: "PromptMethod", classnames: Sequence[str], *args: Any, **kwargs: Any) -> None:
        try:
            set_classnames(self, classnames, *args, **kwargs)
        finally:  # a half-done rebuild is a rebuild too
            self.class_version = next(_CLASS_SET_VERSIONS)

    wrapper._bumps_class_version = True  # type: ignore[attr-defined]
    return wrapper


class PromptMethod(nn.Module):
    """Base class of the prompt methods (CoOp, CoCoOp, DePT, IVLP, MaPLe, PromptSRC).

    A method class declares what the rest of atlas_fast reads about it (the registry, :data:`METHODS`, holds the
    classes themselves): ``name``, ``printed_name``, ``recipe_function`` and ``config_class``, and where they differ
    from the
    defaults ``reads_pixels``, ``reads_frozen_features``, ``supports_batched_runs``, ``learns`` and
    ``depth_options``. It implements :meth:`set_classnames`, :meth:`text_features` and (with ``reads_pixels``)
    :meth:`forward`.
    """

    #: The registry name (``--methods``, records), e.g. ``dept-coop``.
    name: ClassVar[str]
    #: How the papers print the method (the report's rows), e.g. ``DePT``.
    printed_name: ClassVar[str]
    #: ``recipe_function(recipe_family, setting, shots, dataset) -> (method config, OptimRecipe)``: the training
    #: recipe of a family (a ``staticmethod``); raises :class:`MissingRecipe` where no reference repository defines
    #: one.
    recipe_function: ClassVar[RecipeFunction]
    config_class: ClassVar[type[MethodConfig]] = MethodConfig
    #: True when the method prompts the image tower, so it trains and evaluates on decoded pixels, not cached features.
    reads_pixels: ClassVar[bool] = False
    #: True for pixel methods whose batches also carry the frozen CLIP's cached features of the same views (PromptSRC).
    reads_frozen_features: ClassVar[bool] = False
    #: With ``reads_frozen_features``: True when those features are of a second, independent augmentation of each
    #: image (CoPrompt's consistency on perturbed inputs): epoch e's pixels are view 1 + (e mod V) and its frozen
    #: features view V + 1 + (e mod V), so the cache holds views 1..2V (:meth:`cached_train_views`).
    frozen_second_view: ClassVar[bool] = False
    # True when R runs can train as one module (atlas_fast.engine.pipeline): every learned tensor leads with R, forward()
    # and training_loss() take one batch per run ((R, B, ...) inputs, (R, B) labels), training_loss() returns each
    # run's loss (R,) where it adds terms beyond the criterion, and runs never mix.
    supports_batched_runs: ClassVar[bool] = False
    #: False for methods with no learned tensors (zero-shot CLIP): training them is skipped.
    learns: ClassVar[bool] = True
    #: The config fields that are prompt depths (counted in transformer blocks), which a backbone with shallower
    #: towers needs lowered (``--method-option``; the embedded world's experiments).
    depth_options: ClassVar[tuple[str, ...]] = ()
    #: False for methods that train without labels (KDPL distils a teacher's predictions): a label schedule (ATLaS,
    #: ...) would have nothing to supervise, so planning accepts only the plain one-hot schedule, whose labels such
    #: a method never reads.
    uses_labels: ClassVar[bool] = True
    #: True for methods that train on the domain's unlabeled images (PromptKD): every training image of every class
    #: of the dataset, whatever the shots and the setting's class subset; evaluation is unchanged.
    trains_on_domain: ClassVar[bool] = False
    #: False for methods whose training step never runs the text tower with a gradient path (PromptKD scores its
    #: teacher's fixed text features): the memory planner then counts no text-tower activations for them.
    trains_text_tower: ClassVar[bool] = True

    @classmethod
    def check_before_work(cls, config: MethodConfig, backbone: Backbone) -> None:
        """Called when a run is planned, before anything is encoded: refuse what the run cannot use beyond its config
        (a missing or mismatched teacher, a dictionary that cannot be read), naming the option or file. Default: a
        method that declares a teacher (:meth:`view_teacher`) has it loaded and checked here (once per process; the
        feed reuses it), so a teacher that cannot be had fails before the student's features are encoded; a method
        without one checks nothing. A teacher-based method loads its teacher with :func:`load_teacher`, whose
        errors name the teacher's own options, never the student's ``--model``/``--pretrained``."""
        cls.view_teacher(config, backbone)

    #: The version of the class buffers (token ids, EOT positions, the text layouts cached on them, a method's
    #: class-set caches): a new number whenever :meth:`set_classnames` runs (the wrapper every subclass's override
    #: gets), so a captured CUDA graph that reads them is dropped even when new buffers land at the old addresses
    #: (:class:`atlas_fast.engine.graphs.StepGraphs`).
    class_version: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls).get("set_classnames")
        if own is not None and not getattr(own, "_bumps_class_version", False):
            cls.set_classnames = _versioned(own)

    @classmethod
    def view_teacher(cls, config: MethodConfig, backbone: Backbone) -> Backbone | None:
        """A second frozen image encoder whose features of every training view the method reads beside its own
        inputs (KDPL's teacher): a backbone with the teacher's weights and fingerprint whose transform is
        ``backbone``'s, so it encodes exactly the views the run trains on. None (the default): no teacher.

        The feed caches its features like the run's own (one file keyed by the teacher's fingerprint) and appends
        them to every training batch: cached features arrive as (B, D + D_teacher), pixel batches as a
        :class:`~atlas_fast.engine.feed.PixelBatch` whose ``frozen_features`` end with the D_teacher columns."""
        return None

    @classmethod
    def cached_train_views(cls, views: int) -> int:
        """How many augmented views (1..n) of every training image the feature cache must hold for a run of
        ``views`` views: none for a pixel method that reads no frozen features (view 0 only, for soft labels), 2V
        with :attr:`frozen_second_view`, else V."""
        if cls.reads_pixels and not cls.reads_frozen_features:
            return 0
        return 2 * views if cls.frozen_second_view else views

    @classmethod
    def planned_config(cls, config: MethodConfig, dataset: str, classnames: Sequence[str]) -> MethodConfig:
        """The method config a run on ``dataset`` (registry name) trains with, checked against its training
        classes when the run is planned
        (before any weights are loaded or features encoded): a method that reads files named by its options checks
        them here and may record their checksum in the config (CoPrompt's class descriptions). Default: as is."""
        return config

    @classmethod
    def build(cls, backbone: Backbone, classnames: Sequence[str], config: MethodConfig | None = None
              ) -> "PromptMethod":
        """The method for ``classnames`` (config defaults to the config class's defaults)."""
        return cls(backbone, classnames, config if config is not None else cls.config_class())

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig) -> None:
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.backbone = backbone  # a dataclass, not an nn.Module: the frozen CLIP stays out of the module tree
        self.config = config
        self.classnames: tuple[str, ...] = ()

    @property
    def num_runs(self) -> int:
        return self.config.num_runs

    @property
    def logit_scale(self) -> torch.Tensor:
        """CLIP's frozen temperature, exp(logit_scale) (100 for the released weights)."""
        return self.backbone.model.logit_scale.detach().exp()

    def set_classnames(self, classnames: Sequence[str]) -> None:
        """(Re)build the class-token buffers for a class set; learned tensors are kept."""
        raise NotImplementedError

    def text_features(self) -> torch.Tensor:
        """L2-normalised class text features (R, C, D) for the current class set."""
        raise NotImplementedError

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits (R, B, C) = exp(logit_scale) * f_v f_t^T.

        Without ``reads_pixels`` ``images`` are cached, un-normalised image features (B, D), shared by the R runs,
        or (R, B, D), one batch per run; they are normalised here. With ``reads_pixels`` they are preprocessed pixels
        (B, 3, H, W).
        """
        if self.reads_pixels:
            raise NotImplementedError(f"{type(self).__name__} reads pixels and must implement forward()")
        return self.similarity_logits(self.image_batch(images), self.text_features())

    def image_batch(self, images: torch.Tensor) -> torch.Tensor:
        """Cached image features (B, D) or (R, B, D) as (1 or R, B, D) (a leading 1 is shared by every run)."""
        dim = self.backbone.embed_dim
        if images.dim() == 2 and images.shape[1] == dim:
            return images.unsqueeze(0)
        if images.dim() == 3 and images.shape[0] in (1, self.num_runs) and images.shape[2] == dim:
            return images
        raise ValueError(f"{type(self).__name__} expects cached image features of shape (B, {dim}) or "
                         f"(R={self.num_runs}, B, {dim}), got {tuple(images.shape)}")

    def similarity_logits(self, image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        """CLIP's logits (R, B, C) = exp(logit_scale) * cos(f_v, f_t) (``docs/method-zoo.md``, section Common CLIP
        pieces).

        ``image_features`` (1 or R, B, D) and ``text_features`` (R, C, D), or (R, B, C, D) when every image has
        its own class prompts (CoCoOp); neither needs to be normalised.
        """
        text = F.normalize(text_features, dim=-1)
        image = F.normalize(image_features.to(text.dtype), dim=-1).expand(text.shape[0], -1, -1)
        equation = "rbd,rcd->rbc" if text.dim() == 3 else "rbd,rbcd->rbc"
        return self.logit_scale * torch.einsum(equation, image, text)

    @torch.no_grad()
    def eval_logit_chunks(self, features: torch.Tensor) -> Iterator[torch.Tensor]:
        """Test-time logits (R, n, C) of cached features (N, D), chunk after chunk in the features' order, for the
        current class set: evaluation consumes one chunk at a time, so its memory is O(chunk x C), never the N x C
        logits of a whole test set (ImageNet: 50,000 x 1,000 per run).

        Methods whose class text does not depend on the image (the base ``forward``) encode the prompts once;
        others run their ``forward`` over chunks of :data:`EVAL_BATCH` images. Override for another test-time path
        (CoCoOp bounds its chunks by text sequences, DePT fuses its head on the classes it was trained on)."""
        device = self.device
        if type(self).forward is PromptMethod.forward:
            text = self.text_features().float()
            for x in features.split(EVAL_BATCH):
                yield self.similarity_logits(x.to(device).float().unsqueeze(0), text)
        else:
            for x in features.split(EVAL_BATCH):
                yield self(x.to(device)).float()

    @torch.no_grad()
    def eval_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Test-time logits (R, N, C) of cached features (N, D): :meth:`eval_logit_chunks` joined (for callers that
        need every logit; accuracy streams the chunks)."""
        return torch.cat(list(self.eval_logit_chunks(features)), dim=1)

    @property
    def device(self) -> torch.device:
        """Where the method's tensors live (the backbone's device when it owns none)."""
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            return tensor.device
        return torch.device(self.backbone.device)

    def eval_pixel_logits(self, pixels: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        """Test-time logits (R, B, C) of preprocessed pixels (B, 3, H, W), for methods with ``reads_pixels``;
        ``text_features`` is :meth:`text_features` of the current class set, encoded once per set."""
        raise NotImplementedError(f"{type(self).__name__} does not evaluate pixels")

    def eval_pixel_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """For methods with ``reads_pixels``: the part of the test-time logits that does not depend on the class
        set, (R, B, D) of pixels (B, 3, H, W) seen by every run (the prompted image features), so the images
        evaluated on several class sets go through the image tower once (:meth:`pixel_classifier`)."""
        raise NotImplementedError(f"{type(self).__name__} does not evaluate pixels")

    def pixel_classifier(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """For methods with ``reads_pixels``: the current class set's test-time logits (R, B, C) as a function of
        :meth:`eval_pixel_features`, with the class prompts encoded once, now (a later class set leaves it as is)."""
        raise NotImplementedError(f"{type(self).__name__} does not evaluate pixels")

    def training_loss(self, inputs: torch.Tensor, labels: torch.Tensor,
                      criterion: Callable[..., torch.Tensor]) -> torch.Tensor:
        """The loss of one training batch. ``criterion(logits)`` is the label schedule's cross-entropy of logits
        (R, B, C) against this batch's targets of the epoch (one-hot or soft), summed over the runs, so every CE term a
        method has sees the ATLaS targets (``docs/method-zoo.md``, section ATLaS in every method);
        ``criterion(logits, observe=False)`` for an auxiliary head's logits, since only the class logits may feed a
        schedule's statistics (OLS); ``criterion(logits, per_run=True)`` each run's (R,). ``labels`` (B,), or (R, B)
        for R runs trained together, are the true classes, for terms that select by class. Methods with extra terms
        (KgCoOp, DePT, PromptSRC) override this and, for R runs trained together, return each run's loss (R,) with
        its own terms added, so that each run's loss, gradient, fp16 loss scale and overflow stay its own; a loss
        without such terms may be the criterion's sum."""
        return criterion(self(inputs))

    def param_groups(self) -> list[dict[str, Any]]:
        """The optimiser's parameter groups. A group may carry ``lr_scale``: the loop sets its lr to the epoch's lr
        times that scale (DePT's staged head lr). Default: one group with every trainable tensor."""
        return [{"params": self.trainable_parameters()}]

    def end_epoch(self, epoch: int, num_epochs: int) -> None:
        """Called after the last step of each 0-based ``epoch`` (e.g. to accumulate prompts over epochs)."""

    def carry_runs(self, source: "PromptMethod", keep: Sequence[int]) -> None:
        """Take over the training state beyond the learned tensors (e.g. prompts accumulated over epochs) of the runs
        at positions ``keep`` of ``source``, a module of the same method: this module holds those runs, in that
        order, and goes on training them (runs retired or forked mid-training). Default: no such state."""

    def finish_training(self) -> None:
        """Called once after the last epoch, before evaluation (e.g. to load aggregated prompts)."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The tensors the optimiser updates (everything the method owns that requires grad)."""
        return [p for p in self.parameters() if p.requires_grad]

    def state_for_checkpoint(self) -> dict[str, torch.Tensor]:
        """The learned tensors only (class buffers are rebuilt from class names at load time, as the reference does)."""
        return {name: p.detach().cpu().clone() for name, p in self.named_parameters() if p.requires_grad}

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load tensors saved by :meth:`state_for_checkpoint`; names and shapes must match exactly."""
        own = {name: p for name, p in self.named_parameters() if p.requires_grad}
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise KeyError(f"{type(self).__name__} checkpoint mismatch: missing {missing}, unexpected {unexpected}")
        for name, param in own.items():
            value = state[name]
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"{type(self).__name__} checkpoint tensor {name!r} has shape {tuple(value.shape)}, "
                                 f"expected {tuple(param.shape)} (R, class count or prompt length differ?)")
            with torch.no_grad():
                param.copy_(value.to(device=param.device, dtype=param.dtype))


class MissingRecipe(ValueError):
    """No reference repository defines a recipe for this (method, setting). ``method_config`` is the method's
    configuration to train with when the caller gives epochs, batch size and lr explicitly."""

    def __init__(self, method: str, setting: str, method_config: MethodConfig) -> None:
        super().__init__(
            f"{method} has no {setting!r} recipe in its reference repositories (docs/method-zoo.md, section "
            f"Recipes). Give the schedule yourself, all three of epochs, batch size and lr: "
            f"TrainConfig(epochs=..., batch_size=..., lr=...) or "
            f"`atlas-fast train --epochs E --batch-size B --lr LR` (the method's base-to-new recipe is a starting "
            f"point).")
        self.method_config = method_config


def check_family(method: str, family: str) -> None:
    """Reject a recipe family that is not one of :data:`~atlas_fast.vocabulary.RECIPE_FAMILIES`."""
    if family not in _RECIPE_FAMILIES:
        raise ValueError(f"{method} recipe family must be {' or '.join(map(repr, _RECIPE_FAMILIES))}, got {family!r}")


def check_setting_name(method: str, setting: str) -> None:
    """Reject a setting that is not one of :data:`~atlas_fast.vocabulary.SETTINGS`."""
    if setting not in SETTINGS:
        raise ValueError(f"{method} recipe setting must be one of {', '.join(map(repr, SETTINGS))}, got {setting!r}")


METHODS: dict[str, type[PromptMethod]] = {}
# What a registered class must declare itself (inheriting them would register a second method under its base's
# name, recipe function or printed name).
OWN_DECLARATIONS = ("name", "printed_name", "recipe_function")


def register_method(cls: type[PromptMethod]) -> type[PromptMethod]:
    """Make ``cls`` known under ``cls.name``; every method file calls this once for each method it defines."""
    missing = [attribute for attribute in OWN_DECLARATIONS if attribute not in vars(cls)]
    if missing:
        raise ValueError(f"{cls.__name__} must declare {', '.join(missing)} itself to be registered")
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise ValueError(f"Two prompt methods are registered as {cls.name!r}")
    config_fields = {f.name for f in fields(cls.config_class)}
    unknown = sorted(set(cls.depth_options) - config_fields)
    if unknown:
        raise ValueError(f"{cls.name}: depth options {unknown} are not fields of {cls.config_class.__name__}")
    METHODS[cls.name] = cls
    return cls


def method_class(name: str) -> type[PromptMethod]:
    """The registered method ``name``, with the known names in the error."""
    import atlas_fast.methods  # noqa: F401  (importing the package registers every method)

    if name not in METHODS:
        raise ValueError(f"Unknown prompt method {name!r}; known: {', '.join(sorted(METHODS))}.")
    return METHODS[name]


def build_method(name: str, backbone: Backbone, classnames: Sequence[str],
                 config: MethodConfig | None = None) -> PromptMethod:
    """Build a registered method for ``classnames`` (config defaults to the method's config class defaults)."""
    return method_class(name).build(backbone, classnames, config)
