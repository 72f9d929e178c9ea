"""Label schedules: which targets supervise each epoch and the loss they give.

Every schedule has one interface, ``loss(epoch, logits, labels, soft_rows) -> scalar`` for one batch
(``logits`` (B, C), ``labels`` (B,) int, ``soft_rows`` (B, C) per-item soft labels or ``None``), plus
``reset(num_classes)`` before training, ``observe(logits, labels)`` with each step's class logits and
``end_epoch(epoch)`` after each epoch (for schedules with state). ``loss`` is pure, so a method may apply it to
several terms (DePT's head) without the extra terms reaching a schedule's statistics.

The schedules: :class:`OneHot` (the baseline, ``docs/method-zoo.md``, section ATLaS in every method),
:class:`Alternating` (ATLaS, the paper's Algorithm 1), :class:`Joint` (the ablation's "soft + y" rows), and the two
comparisons of the paper's Fig. 1, :class:`OnlineLabelSmoothing` (Zhang et al. 2021, "Delving Deep into Label
Smoothing") and :class:`TeacherFreeKD` (Yuan et al. 2020, "Revisiting Knowledge Distillation via Label Smoothing
Regularization").

The soft labels themselves (LS, CSL, ISL, mixed) come from :mod:`atlas_fast.atlas.softlabels`; schedules only decide when
and how they are used. :mod:`atlas_fast.atlas.variants` pairs them into the variants the paper's tables compare.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Sequence

import torch
import torch.nn.functional as F

from atlas_fast.vocabulary import SOFT_LABEL_KINDS


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CE against a distribution: ``-sum_c q_c log_softmax(z)_c``, averaged over the batch (fp32 for stability)."""
    log_probs = F.log_softmax(logits.float(), dim=-1)
    return -(targets.to(log_probs.dtype) * log_probs).sum(dim=-1).mean()


def hard_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy`` with integer labels and mean reduction, as the reference trainers use."""
    return F.cross_entropy(logits.float(), labels)


def runs_cross_entropy(kinds: Sequence[str], logits: torch.Tensor, labels: torch.Tensor,
                       soft_rows: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Each run's CE (R,) of logits (R, B, C) in one pass over the runs, run r against its labels (R, B) where
    ``kinds[r]`` is "hard" and against its soft rows (B, C) where it is "soft" (:meth:`LabelSchedule.
    cross_entropy_kind`), with the operations of consecutive runs of one kind shared (a handful of operations per
    step, not a handful per run)."""
    log_probs = F.log_softmax(logits.float(), dim=-1)
    parts, start = [], 0
    for kind, members in itertools.groupby(kinds):
        end = start + len(list(members))
        if kind == "hard":
            picked = log_probs[start:end].gather(-1, labels[start:end].unsqueeze(-1)).squeeze(-1)
            parts.append(-picked.mean(dim=-1))
        else:
            rows = torch.stack(list(soft_rows[start:end])).to(log_probs.dtype)
            parts.append(-(rows * log_probs[start:end]).sum(dim=-1).mean(dim=-1))
        start = end
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class LabelSchedule:
    """Base class: the per-batch training loss as a function of the epoch. Subclasses are dataclasses whose fields
    are the hyper-parameters (so a schedule can be written into a result record with :meth:`describe`)."""

    name: ClassVar[str] = ""
    needs_soft_labels: ClassVar[bool] = False
    #: True only for the plain CE(z, y) baseline (a method that learns nothing can train with no other schedule).
    plain: ClassVar[bool] = False
    #: True when the targets are learned from each step's predictions on the host (:meth:`observe`), which a CUDA
    #: graph cannot replay (OLS).
    observes_predictions: ClassVar[bool] = False

    def reset(self, num_classes: int) -> None:
        """Clear any state before a training run over ``num_classes`` classes."""

    def uses_soft_labels(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` (0-based) is supervised by the offline soft labels."""
        return False

    def cross_entropy_kind(self, epoch: int) -> str | None:
        """"hard" when the loss of epoch ``epoch`` is :func:`hard_cross_entropy`, "soft" when it is
        :func:`soft_cross_entropy` against the soft rows, None for any other loss (several runs' losses of one kind
        are then computed together, :func:`runs_cross_entropy`)."""
        return None

    def loss(self, epoch: int, logits: torch.Tensor, labels: torch.Tensor,
             soft_rows: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def observe(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """See the model's predictions (logits (B, C)) of a training batch, for schedules that learn their targets
        from them (OLS). Called once per step with the method's class logits, never with auxiliary heads' logits."""

    def end_epoch(self, epoch: int) -> None:
        """Called once after the last batch of each epoch."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}  # type: ignore[call-overload]

    def _require_soft(self, soft_rows: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor:
        if soft_rows is None:
            raise ValueError(f"The {self.name!r} label schedule needs soft labels (set TrainConfig.soft_labels, "
                             f"e.g. --atlas ls|csl|isl|mix).")
        if soft_rows.shape != logits.shape:
            raise ValueError(f"soft label rows have shape {tuple(soft_rows.shape)} but the logits have "
                             f"{tuple(logits.shape)}; soft labels must be built for the classes being trained.")
        return soft_rows


def check_soft_labels(schedule: LabelSchedule | type[LabelSchedule], soft_kind: str | None) -> None:
    """The one rule pairing a schedule with soft labels (``label_variant`` and every ``TrainConfig`` apply it): one
    that trains on them (``needs_soft_labels``) needs a ``soft_kind``, any other none; said in both APIs' words."""
    kinds = "|".join(SOFT_LABEL_KINDS)
    if schedule.needs_soft_labels and soft_kind is None:
        raise ValueError(f"--schedule {schedule.name} trains on soft labels: choose them with --atlas {kinds} (Python: "
                         f"set soft_labels, e.g. soft_label_preset(setting, kind)).")
    if not schedule.needs_soft_labels and soft_kind is not None:
        raise ValueError(f"--schedule {schedule.name} uses no offline soft labels; drop --atlas {soft_kind} (Python: "
                         f"soft_labels is set but the {schedule.name!r} schedule never uses them; drop it, or use "
                         f"schedule=Alternating(K) or Joint()).")


@dataclass
class OneHot(LabelSchedule):
    """Baseline: CE(z, y) every epoch."""

    name: ClassVar[str] = "onehot"
    plain: ClassVar[bool] = True

    def cross_entropy_kind(self, epoch: int) -> str | None:
        return "hard"

    def loss(self, epoch, logits, labels, soft_rows=None):
        return hard_cross_entropy(logits, labels)


@dataclass
class Alternating(LabelSchedule):
    """ATLaS's schedule: one-hot labels for K - 1 epochs, then soft labels for one epoch, repeated (paper Algorithm
    1: soft iff ``(e + 1) mod K == 0`` for 0-based epoch ``e``). ``period=1`` = soft labels every epoch. Its
    ``name`` is "atlas", as records store it and ``--schedule atlas`` chooses it; ``--atlas KIND`` chooses the soft
    labels it reads (``soft_kind`` in code)."""

    period: int = 2
    name: ClassVar[str] = "atlas"
    needs_soft_labels: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if isinstance(self.period, bool) or not isinstance(self.period, int) or self.period < 1:
            raise ValueError(f"ATLaS period K must be an integer >= 1 (1 = soft labels every epoch), "
                             f"got {self.period!r}.")

    def uses_soft_labels(self, epoch: int) -> bool:
        return (epoch + 1) % self.period == 0

    def cross_entropy_kind(self, epoch: int) -> str | None:
        return "soft" if self.uses_soft_labels(epoch) else "hard"

    def loss(self, epoch, logits, labels, soft_rows=None):
        if self.uses_soft_labels(epoch):
            return soft_cross_entropy(logits, self._require_soft(soft_rows, logits))
        return hard_cross_entropy(logits, labels)


@dataclass
class Joint(LabelSchedule):
    """The ablation's "soft + y" rows: CE(z, y) + CE(z, soft) in every iteration (no alternation)."""

    name: ClassVar[str] = "joint"
    needs_soft_labels: ClassVar[bool] = True

    def uses_soft_labels(self, epoch: int) -> bool:
        return True

    def loss(self, epoch, logits, labels, soft_rows=None):
        return hard_cross_entropy(logits, labels) + soft_cross_entropy(logits, self._require_soft(soft_rows, logits))


@dataclass
class OnlineLabelSmoothing(LabelSchedule):
    """OLS (Zhang et al. 2021): loss = α·CE(z, y) + (1-α)·CE(z, S_y), where row S_c of the class soft-label matrix
    used in epoch t+1 is the mean predicted distribution of the samples of class c that were classified correctly
    during epoch t. As in the authors' code, S starts at zero (the soft term is inactive in epoch 0) and a class with
    no correct sample in an epoch gets a zero row for the next one. ``alpha`` 0.5 is the paper's setting."""

    alpha: float = 0.5
    name: ClassVar[str] = "ols"
    observes_predictions: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"OLS alpha (weight of the one-hot CE) must be in [0, 1], got {self.alpha!r}.")
        self.reset(0)

    def reset(self, num_classes: int) -> None:
        self.matrix = torch.zeros(num_classes, num_classes)
        self._sums = torch.zeros(num_classes, num_classes)
        self._counts = torch.zeros(num_classes)

    def loss(self, epoch, logits, labels, soft_rows=None):
        num_classes = logits.shape[-1]
        if self.matrix.shape[0] != num_classes:
            raise ValueError(f"OLS was reset for {self.matrix.shape[0]} classes but the logits have {num_classes}; "
                             f"call reset(num_classes) before training.")
        targets = self.matrix.to(logits.device)[labels]
        return (self.alpha * hard_cross_entropy(logits, labels)
                + (1.0 - self.alpha) * soft_cross_entropy(logits, targets))

    @torch.no_grad()
    def observe(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        probs = F.softmax(logits.detach().float(), dim=-1).cpu()
        correct = probs.argmax(dim=-1) == labels.cpu()
        self._sums.index_add_(0, labels.cpu()[correct], probs[correct])
        self._counts.index_add_(0, labels.cpu()[correct], torch.ones(int(correct.sum())))

    def end_epoch(self, epoch: int) -> None:
        self.matrix = self._sums / self._counts.clamp(min=1.0).unsqueeze(1)
        self._sums = torch.zeros_like(self._sums)
        self._counts = torch.zeros_like(self._counts)


@dataclass
class TeacherFreeKD(LabelSchedule):
    """TF-KD_reg (Yuan et al. 2020): a hand-designed teacher puts probability ``a`` on the true class and
    ``(1-a)/(C-1)`` on every other; loss = (1-α)·CE(z, y) + α·τ²·KL(teacher_τ ‖ softmax(z/τ)), where teacher_τ is the
    teacher's distribution at temperature τ (softmax of its log-probabilities / τ) and KL is averaged over the batch:
    the paper's formula (the authors' code softens the probabilities directly and averages the KL over all B·C
    elements, which only rescales the term)."""

    a: float = 0.9
    alpha: float = 0.1
    tau: float = 20.0
    name: ClassVar[str] = "tfkd"

    def __post_init__(self) -> None:
        if not 0.0 < self.a < 1.0:
            raise ValueError(f"TF-KD teacher probability a must be in (0, 1), got {self.a!r}.")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"TF-KD alpha (weight of the KL term) must be in [0, 1], got {self.alpha!r}.")
        if not (self.tau > 0 and math.isfinite(self.tau)):
            raise ValueError(f"TF-KD temperature tau must be > 0, got {self.tau!r}.")
        if not 1e-3 <= self.tau <= 1e4:  # logits / tau must stay finite in float32 (the authors use 20-40)
            raise ValueError(f"TF-KD temperature tau must be in [0.001, 10000], got {self.tau!r}.")

    def teacher(self, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
        """The teacher's distribution (B, C) before temperature."""
        if num_classes < 2:
            raise ValueError("TF-KD needs at least 2 classes.")
        rows = torch.full((labels.shape[0], num_classes), (1.0 - self.a) / (num_classes - 1), device=labels.device)
        return rows.scatter(1, labels.unsqueeze(1), self.a)

    def loss(self, epoch, logits, labels, soft_rows=None):
        teacher_tau = F.softmax(self.teacher(labels, logits.shape[-1]).log() / self.tau, dim=-1)
        student_log_tau = F.log_softmax(logits.float() / self.tau, dim=-1)
        kl = F.kl_div(student_log_tau, teacher_tau, reduction="batchmean")
        return (1.0 - self.alpha) * hard_cross_entropy(logits, labels) + self.alpha * self.tau ** 2 * kl

