"""Every label variant a run can train with, and the names it is printed under.

A variant is a label schedule (:mod:`atlas_fast.atlas.schedules`) with the soft labels it reads
(:class:`LabelVariant`). :func:`label_variant` builds one from a setting's paper presets (K here, the soft-label
hyper-parameters in :func:`atlas_fast.atlas.softlabels.soft_label_preset`); every variant and printed name comes from
this module.

The naming functions read a run's *described* schedule (``LabelSchedule.describe()``, as a record stores it) and
soft-label kind, so a live config and a record read back from disk are named alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from atlas_fast.atlas.schedules import (Alternating, Joint, LabelSchedule, OneHot, OnlineLabelSmoothing, TeacherFreeKD,
                                        check_soft_labels)
from atlas_fast.atlas.softlabels import SoftLabelConfig, soft_label_preset
from atlas_fast.vocabulary import (NO_SOFT_LABELS, PAPER_SOFT_LABEL_KINDS, SCHEDULE_CHOICES as _SCHEDULE_CHOICES, SCHEDULES,
                                   SOFT_LABEL_CHOICES, SOFT_LABEL_KINDS)

# The paper's ATLaS period K by setting (appendix "Implementation Details"): soft labels on every K-th epoch.
ALTERNATION_PERIODS: dict[str, int] = {"base2new": 2, "few_shot": 3, "cross_dataset": 3}


@dataclass(frozen=True)
class SoftLabelNames:
    """How each soft-label kind is printed. ``every_epoch``: soft labels in every epoch (Fig. 1's "+ LS", the
    ``train`` lines' ``coop+CSL``, the "soft + y (ISL)" rows); ``alternating``: the paper's + ATLaS rows;
    ``ablation``: the ablation table's "soft labels alone" rows; ``run``: ATLaS in the ``train`` command's lines."""

    every_epoch: str
    alternating: str
    ablation: str
    run: str


SOFT_LABEL_NAMES: dict[str, SoftLabelNames] = {
    "ls": SoftLabelNames("LS", "ATLaS", "vanilla LS", "ATLaS"),
    "csl": SoftLabelNames("CSL", "ATLaS-CSL", "CSL", "ATLaS-CSL"),
    "isl": SoftLabelNames("ISL", "ATLaS-ISL", "ISL", "ATLaS-ISL"),
    "mix": SoftLabelNames("MIX", "ATLaS-Mix", "MIX", "ATLaS-mix"),
}


@dataclass(frozen=True)
class LabelVariant:
    """A method variant of a results table: its label schedule, the soft labels it reads (None for schedules that
    read none) and its printed name (:func:`row_name` with the every-epoch names; ``baseline`` for one-hot)."""

    name: str
    schedule: LabelSchedule
    soft_labels: SoftLabelConfig | None = None


def alternation_period(setting: str) -> int:
    """The paper's ATLaS period K for ``setting`` (base2new | few_shot | cross_dataset)."""
    if setting not in ALTERNATION_PERIODS:
        raise ValueError(f"No ATLaS preset for setting {setting!r}; known: {sorted(ALTERNATION_PERIODS)}")
    return ALTERNATION_PERIODS[setting]


# The schedule class each name of :data:`~atlas_fast.vocabulary.SCHEDULES` builds.
SCHEDULE_CLASSES: dict[str, type[LabelSchedule]] = {
    cls.name: cls for cls in (OneHot, Alternating, Joint, OnlineLabelSmoothing, TeacherFreeKD)}


def label_variant(setting: str, soft_kind: str = "ls", schedule: str = "auto", *, period: int | None = None,
                  schedule_options: Mapping[str, Any] | None = None, **soft_overrides: Any) -> LabelVariant:
    """The variant with soft labels ``soft_kind`` under ``schedule`` (auto = atlas with soft labels, one-hot without),
    from ``setting``'s paper presets. ``period`` replaces the setting's K (ATLaS only), ``soft_overrides`` the
    soft-label hyper-parameters (``theta``, ``tau_c``, ``alpha``, ``delta``, ``w``, ``top_k``), ``schedule_options``
    the schedule's own (OLS ``alpha``; TF-KD ``a``, ``alpha``, ``tau``)."""
    if soft_kind not in SOFT_LABEL_CHOICES:
        raise ValueError(f"Unknown soft-label kind {soft_kind!r}; valid: {', '.join(SOFT_LABEL_CHOICES)}.")
    if schedule not in _SCHEDULE_CHOICES:
        raise ValueError(f"Unknown label schedule {schedule!r}; valid: {', '.join(_SCHEDULE_CHOICES)}.")
    chosen = SCHEDULE_CLASSES[schedule_name(schedule, soft_kind)]
    check_soft_labels(chosen, None if soft_kind == NO_SOFT_LABELS else soft_kind)
    if period is not None and chosen is not Alternating:
        raise ValueError(f"The ATLaS period K applies to the 'atlas' schedule only, not {chosen.name!r}.")
    options = dict(schedule_options or {})
    soft_labels = soft_label_preset(setting, soft_kind, **soft_overrides) if soft_kind != NO_SOFT_LABELS else None
    if chosen is Alternating:
        options = {"period": period if period is not None else alternation_period(setting), **options}
    built = chosen(**options)
    kind = soft_labels.kind if soft_labels is not None else None
    return LabelVariant(row_name(built.describe(), kind, every_epoch_names=True) or "baseline", built, soft_labels)


def schedule_name(schedule: str, soft_kind: str) -> str:
    """The schedule a choice names: ``auto`` is ATLaS with soft labels and one-hot without (``soft_kind`` none)."""
    return schedule if schedule != "auto" else ("onehot" if soft_kind == NO_SOFT_LABELS else "atlas")


def paper_variants(setting: str, kinds: Sequence[str] = PAPER_SOFT_LABEL_KINDS) -> list[LabelVariant]:
    """The rows of the paper's Table III for ``setting``: the plain method, then + ATLaS with each soft-label kind,
    with the paper's K, θ, τ_c, α and δ for that setting."""
    return [label_variant(setting, NO_SOFT_LABELS)] + [label_variant(setting, kind) for kind in kinds]


def row_name(schedule: Mapping[str, Any], soft_kind: str | None, every_epoch_names: bool = False) -> str:
    """A variant's row in the paper's tables, without the method: ``""`` for the plain method, ``+ ATLaS``,
    ``+ ATLaS-CSL``, ``+ soft + y (ISL)``, ``+ OLS``, ``+ TF-KD``; K is not named, except with ``every_epoch_names``:
    K = 1 is then ``+ LS`` / ``+ CSL`` / ``+ ISL``, as the paper's curves say. ``KeyError`` for an unknown kind."""
    name = schedule["name"]
    if name == "onehot":
        return ""
    if name == "atlas":
        names = SOFT_LABEL_NAMES[soft_kind]  # type: ignore[index]
        return f"+ {names.every_epoch if every_epoch_names and schedule['period'] == 1 else names.alternating}"
    if name == "joint":
        return f"+ soft + y ({SOFT_LABEL_NAMES[soft_kind].every_epoch})"  # type: ignore[index]
    return {"ols": "+ OLS", "tfkd": "+ TF-KD"}.get(name, f"+ {name}")


def row_order(schedule: Mapping[str, Any], soft_kind: str | None) -> tuple[int, int]:
    """Where a variant's rows go in a table: the plain method, ATLaS, joint, OLS, TF-KD; within them LS, CSL, ISL,
    mix (variants this version does not know last)."""
    name = schedule["name"]
    return (SCHEDULES.index(name) if name in SCHEDULES else 99,
            SOFT_LABEL_KINDS.index(soft_kind) if soft_kind in SOFT_LABEL_KINDS else 99)


def ablation_row_name(schedule: Mapping[str, Any], soft_kind: str | None) -> str:
    """A row of the paper's ablation table, without the method: ``""`` for the plain method, ``+ vanilla LS``
    (soft labels alone, K = 1), ``+ vanilla LS + y`` (joint), ``+ ATLaS`` (alternating), likewise for CSL and ISL."""
    name = schedule["name"]
    if name == "onehot":
        return ""
    names = SOFT_LABEL_NAMES[soft_kind]  # type: ignore[index]
    if name == "joint":
        return f"+ {names.ablation} + y"
    return f"+ {names.ablation}" if schedule["period"] == 1 else f"+ {names.alternating}"


def run_variant_name(method: str, schedule: Mapping[str, Any], soft_kind: str | None) -> str:
    """A run as the ``train`` command prints it: ``coop``, ``coop+ATLaS-CSL (K=2)``, ``coop+CSL`` (K = 1),
    ``coop+ISL+y`` (joint), ``coop+OLS``; ``mmrl++ + ATLaS-ISL (K=2)``."""
    name = schedule["name"]
    if name == "onehot":
        return method
    # a name ending in '+' (mmrl++) is set apart: 'mmrl++ + ATLaS-ISL (K=2)', not 'mmrl+++ATLaS-ISL (K=2)'
    host = f"{method} + " if method.endswith("+") else f"{method}+"
    if name == "atlas":
        names = SOFT_LABEL_NAMES[soft_kind]  # type: ignore[index]
        period = schedule["period"]
        return f"{host}{names.every_epoch}" if period == 1 else f"{host}{names.run} (K={period})"
    if name == "joint":
        return f"{host}{SOFT_LABEL_NAMES[soft_kind].every_epoch}+y"  # type: ignore[index]
    return f"{host}{name.upper()}"
