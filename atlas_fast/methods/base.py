"""The interface every prompt-tuning method implements (:class:`PromptMethod`).

A method owns its *learned* tensors (prompts, meta-nets, heads) and the class-name buffers it builds from the current
class set; the frozen CLIP stays in the :class:`~atlas_fast.clip.backbones.Backbone` and is **not** part of the method's
module tree, so ``.to()``, ``.train()``, ``parameters()`` and checkpoints touch only what the method learns.

``R`` (runs trained together) leads every learned tensor and the text path: ``text_features()`` is (R, C, D),
``forward()`` gives logits (R, B, C). Config and recipe types: :mod:`atlas_fast.methods.config`.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, ClassVar, Iterator, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from atlas_fast.atlas.criterion import Criterion
from atlas_fast.clip.backbones import Backbone
from atlas_fast.methods.config import MethodConfig, RecipeFunction

# Images per chunk when a method evaluates cached test features chunk by chunk.
EVAL_BATCH = 1024


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
    """Base class of every method.

    A method class declares what the rest of atlas_fast reads about it (the registry,
    :data:`~atlas_fast.methods.registry.METHODS`, holds the classes themselves): ``name``, ``printed_name``,
    ``recipe_function`` and ``config_class``, and where they differ from the defaults ``reads_frozen_features``,
    ``supports_batched_runs``, ``learns`` and ``depth_options``. It implements :meth:`set_classnames` and
    :meth:`text_features`. A method that reads pixels derives from
    :class:`~atlas_fast.methods.pixel_method.PixelMethod`, which sets ``reads_pixels`` and supplies its forward and
    pixel evaluation.
    """

    #: The registry name (``--methods``, records), e.g. ``dept-coop``.
    name: ClassVar[str]
    #: How the papers print the method (the report's rows), e.g. ``DePT``.
    printed_name: ClassVar[str]
    #: ``recipe_function(recipe_family, setting, shots, dataset) -> (method config, OptimRecipe)``: the training
    #: recipe of a family (a ``staticmethod``); raises :class:`~atlas_fast.methods.config.MissingRecipe` where no
    #: reference repository defines one.
    recipe_function: ClassVar[RecipeFunction]
    config_class: ClassVar[type[MethodConfig]] = MethodConfig
    #: True when the method prompts the image tower, so it trains and evaluates on decoded pixels, not cached features
    #: (set by :class:`~atlas_fast.methods.pixel_method.PixelMethod`, never by hand).
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
    def batches_runs(cls, config: MethodConfig) -> bool:
        """Whether runs of this config may train as one module: ``supports_batched_runs``, unless an option of the
        config rules it out (class-agnostic KDPL: each run keeps its own dictionary classes per step)."""
        return cls.supports_batched_runs

    @classmethod
    def check_before_work(cls, config: MethodConfig, backbone: Backbone) -> None:
        """Called when a run is planned, before anything is encoded: refuse what the run cannot use beyond its config
        (a missing or mismatched teacher, a dictionary that cannot be read), naming the option or file. Default: a
        method that declares a teacher (:meth:`view_teacher`) has it loaded and checked here (once per process; the
        feed reuses it), so a teacher that cannot be had fails before the student's features are encoded; a method
        without one checks nothing. A teacher-based method loads its teacher with
        :func:`~atlas_fast.methods.teachers.load_teacher`, whose errors name the teacher's own options, never the
        student's ``--model``/``--pretrained``."""
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
    def build(cls, backbone: Backbone, classnames: Sequence[str], config: MethodConfig | None = None,
              runs: int = 1) -> "PromptMethod":
        """The method for ``classnames`` holding R = ``runs`` runs (config defaults to the config class's
        defaults). R is how many runs train together (the engine's group), not a hyper-parameter of the method."""
        return cls(backbone, classnames, config if config is not None else cls.config_class(), runs)

    def __init__(self, backbone: Backbone, classnames: Sequence[str], config: MethodConfig, runs: int = 1) -> None:
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ValueError(f"{type(self).__name__} holds runs >= 1, got {runs!r}")
        self.backbone = backbone  # a dataclass, not an nn.Module: the frozen CLIP stays out of the module tree
        self.config = config
        self.num_runs = runs  # R: the leading dimension of every learned tensor
        self.classnames: tuple[str, ...] = ()

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
        """Logits (R, B, C) = exp(logit_scale) * f_v f_t^T of cached, un-normalised image features (B, D), shared by
        the R runs, or (R, B, D), one batch per run; they are normalised here (a pixel method's forward is
        :class:`~atlas_fast.methods.pixel_method.PixelMethod`'s)."""
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

    def training_loss(self, inputs: torch.Tensor, labels: torch.Tensor, criterion: Criterion) -> torch.Tensor:
        """The loss of one training batch. ``criterion`` (:class:`~atlas_fast.atlas.criterion.Criterion`) is the
        label schedule's loss of class logits against this batch's targets of the epoch (one-hot or soft), so every
        CE term a method has sees the ATLaS targets (``docs/method-zoo.md``, section ATLaS in every method):
        ``criterion(logits)`` summed over the runs, ``criterion.per_run(logits)`` each run's (R,), either with
        ``observe=False`` for an auxiliary head's logits (only the class logits may feed a schedule's statistics,
        OLS); ``criterion.sizes`` / ``criterion.rows`` are the runs' batch sizes, past which a run's rows are
        padding. ``labels`` (B,), or (R, B) for R runs trained together, are the true classes, for terms that select
        by class. Methods with extra terms (KgCoOp, DePT, PromptSRC) override this and, for R runs trained
        together, return each run's loss (R,) with its own terms added, so that each run's loss, gradient, fp16 loss
        scale and overflow stay its own; a loss without such terms may be the criterion's sum."""
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
