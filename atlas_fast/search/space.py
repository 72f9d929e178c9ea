"""What a search may change: ranges and choices over a run's fields, its ATLaS knobs and its method's options, checked
before anything is trained.

A space maps names to :class:`Range` or :class:`Choice`: a recipe field of
:class:`~atlas_fast.engine.config.TrainConfig`, an ATLaS knob (``K``, ``theta``, ``tau_c`` or ``inv_tau_c``, ...) or
a field of the method's config (docs/search.md lists them).

:func:`check_space` refuses, with a message naming the parameter, an empty or inverted range, a log range that
reaches 0, a name the method (or its soft labels) does not have, and values the run's config would refuse. A grid
is counted before it is built (:func:`grid_values`): one of more than :data:`MAX_GRID_POINTS` points is refused.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Union

from atlas_fast.errors import UsageError

TRAIN_FIELDS = {"lr": float, "epochs": int, "batch_size": int, "views": int, "shots": int}
SOFT_LABEL_FIELDS = ("theta", "tau_c", "inv_tau_c", "alpha", "w", "delta", "kind")
ATLAS_FIELDS = ("K",) + SOFT_LABEL_FIELDS
#: The most points a grid search may hold (each is a trial: far beyond any study worth training).
MAX_GRID_POINTS = 100_000
# The soft-label knobs each kind of soft labels reads (atlas_fast.atlas.softlabels).
KIND_READS = {"ls": {"theta"}, "csl": {"tau_c", "inv_tau_c"}, "isl": {"alpha", "delta"},
              "mix": {"tau_c", "inv_tau_c", "alpha", "delta", "w"}}


@dataclass(frozen=True)
class Range:
    """Numbers from ``low`` to ``high`` (both included): floats, or integers with ``integer``; ``log`` samples on a
    log scale, ``step`` on a grid of that spacing from ``low``."""

    low: float
    high: float
    log: bool = False
    step: float | None = None
    integer: bool = False

    def describe(self) -> str:
        kind = "int" if self.integer else "float"
        return f"{'log ' if self.log else ''}{kind} [{self.low:g}, {self.high:g}]" + (
            f" step {self.step:g}" if self.step else "")


@dataclass(frozen=True)
class Choice:
    """One of ``values`` (numbers, strings or booleans)."""

    values: tuple

    def describe(self) -> str:
        return "{" + ", ".join(str(v) for v in self.values) + "}"


Param = Union[Range, Choice]


def uniform(low: float, high: float, step: float | None = None) -> Range:
    """A float from ``low`` to ``high``."""
    return Range(float(low), float(high), step=step)


def log_uniform(low: float, high: float) -> Range:
    """A float from ``low`` to ``high`` on a log scale (e.g. a learning rate)."""
    return Range(float(low), float(high), log=True)


def integers(low: int, high: int, step: int = 1, log: bool = False) -> Range:
    """An integer from ``low`` to ``high``."""
    return Range(low, high, log=log, step=None if log else step, integer=True)


def choice(*values: Any) -> Choice:
    """One of ``values``."""
    return Choice(tuple(values))


def parse_param(text: str) -> tuple[str, Param]:
    """``NAME=SPEC`` from the command line: ``LOW:HIGH`` (float), ``LOW:HIGH:STEP``, ``log:LOW:HIGH``,
    ``int:LOW:HIGH``, ``logint:LOW:HIGH`` or ``A,B,C`` (a choice)."""
    name, sep, spec = text.partition("=")
    name, spec = name.strip(), spec.strip()
    if not sep or not name or not spec:
        raise UsageError(f"--param takes NAME=SPEC (e.g. alpha=0.1:1.0, lr=log:1e-4:1e-1, K=int:1:5, "
                         f"kind=ls,csl,isl), got {text!r}.")
    parts = spec.split(":")
    try:
        if parts[0] in ("log", "int", "logint") and len(parts) == 3:
            if parts[0] == "log":
                return name, log_uniform(float(parts[1]), float(parts[2]))
            return name, integers(int(parts[1]), int(parts[2]), log=parts[0] == "logint")
        if len(parts) in (2, 3) and "," not in spec:
            step = float(parts[2]) if len(parts) == 3 else None
            return name, uniform(float(parts[0]), float(parts[1]), step)
    except ValueError:
        raise UsageError(f"--param {text!r}: the bounds of a range are numbers (int:LOW:HIGH takes integers).") \
            from None
    if ":" in spec:
        raise UsageError(f"--param {text!r}: a range is LOW:HIGH, LOW:HIGH:STEP, log:LOW:HIGH or int:LOW:HIGH.")
    return name, Choice(tuple(_scalar(v.strip()) for v in spec.split(",") if v.strip()))


def _scalar(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def method_fields(method_config) -> list[str]:
    """The fields of a method config that a search may set."""
    return [f.name for f in dataclasses.fields(method_config)]


def valid_names(base, method_config) -> list[str]:
    """Every name a search over ``base`` (a TrainConfig) may use."""
    return list(TRAIN_FIELDS) + list(ATLAS_FIELDS) + method_fields(method_config)


def apply_values(base, values: Mapping[str, Any]):
    """``base`` (a TrainConfig) with the searched ``values`` in place (recipe fields, ATLaS knobs, method options)."""
    from atlas_fast.atlas.schedules import Alternating

    changes: dict[str, Any] = {}
    soft: dict[str, Any] = {}
    options = dict(base.method_options or {})
    for name, value in values.items():
        if name in TRAIN_FIELDS:
            changes[name] = TRAIN_FIELDS[name](value)
        elif name == "K":
            changes["schedule"] = Alternating(int(value))
        elif name == "inv_tau_c":
            soft["tau_c"] = 1.0 / float(value)
        elif name in SOFT_LABEL_FIELDS:
            soft[name] = value
        else:
            options[name] = value
    if soft:
        changes["soft_labels"] = dataclasses.replace(base.soft_labels, **soft)
    if options:
        changes["method_options"] = options
    return dataclasses.replace(base, **changes)


def check_space(space: Mapping[str, Param], base, method_config, dataset: str) -> None:
    """Refuse a space that cannot be searched from ``base``, naming the parameter (a UsageError): see the module
    docstring. ``method_config`` is the recipe's config of the base run on ``dataset``."""
    from atlas_fast.engine.spec import resolve_recipe

    if not space:
        raise UsageError("the search space is empty: give at least one parameter (e.g. --param alpha=0.1:1.0).")
    names = valid_names(base, method_config)
    for name, param in space.items():
        if name not in names:
            raise UsageError(f"{base.method} has no parameter {name!r} to search; valid: {', '.join(names)}.")
        _check_param(name, param)
    if "tau_c" in space and "inv_tau_c" in space:
        raise UsageError("search tau_c or inv_tau_c (= 1/tau_c), not both.")
    atlas = [name for name in space if name in ATLAS_FIELDS]
    if atlas and base.soft_labels is None:
        raise UsageError(f"{', '.join(atlas)}: ATLaS parameters need a run with soft labels; choose them with "
                         f"--atlas ls|csl|isl|mix (Python: soft_labels=soft_label_preset(...), schedule=Alternating(K)).")
    if "K" in space and base.schedule.name != "atlas":
        raise UsageError(f"K is the ATLaS period, but the run's schedule is {base.schedule.name!r}; use the atlas "
                         f"schedule.")
    if base.soft_labels is not None and "kind" not in space:
        reads = KIND_READS[base.soft_labels.kind]
        unread = [name for name in atlas if name in SOFT_LABEL_FIELDS and name not in reads]
        if unread:
            raise UsageError(f"{', '.join(unread)}: {base.soft_labels.kind} soft labels do not read "
                             f"{'it' if len(unread) == 1 else 'them'} (they read {', '.join(sorted(reads))}); "
                             f"search another knob, another --atlas kind, or the kind itself.")
    for name, param in space.items():  # every end of every range must make a run the engine accepts
        for value in (param.values if isinstance(param, Choice) else (param.low, param.high)):
            try:
                resolve_recipe(apply_values(base, {name: value}), dataset)
            except (ValueError, TypeError) as exc:
                raise UsageError(f"parameter {name}={value!r} is not a valid run: {exc}") from None


def _check_param(name: str, param: Param) -> None:
    if isinstance(param, Choice):
        if len(param.values) < 2:
            raise UsageError(f"parameter {name}: the choice {param.describe()} is empty or has one value (fix a "
                             f"value in the base config instead).")
        if len(set(map(repr, param.values))) != len(param.values):
            raise UsageError(f"parameter {name}: the choice {param.describe()} repeats a value.")
        bad = [v for v in param.values if not isinstance(v, (bool, int, float, str))]
        if bad:
            raise UsageError(f"parameter {name}: choices are numbers, strings or booleans, got {bad[0]!r}.")
        return
    if not isinstance(param, Range):
        raise UsageError(f"parameter {name}: expected a Range or Choice (atlas_fast.search.uniform, log_uniform, "
                         f"integers, choice), got {param!r}.")
    low, high = param.low, param.high
    if not (math.isfinite(low) and math.isfinite(high)):
        raise UsageError(f"parameter {name}: the range [{low}, {high}] must be finite.")
    if low > high:
        raise UsageError(f"parameter {name}: the range [{low:g}, {high:g}] is inverted (low > high).")
    if low == high:
        raise UsageError(f"parameter {name}: the range [{low:g}, {high:g}] is empty (one value: fix it in the base "
                         f"config instead).")
    if param.integer and (low != int(low) or high != int(high)):
        raise UsageError(f"parameter {name}: an integer range needs integer bounds, got [{low}, {high}].")
    if param.log and low <= 0:
        raise UsageError(f"parameter {name}: a log range must stay above 0, got [{low:g}, {high:g}].")
    if param.step is not None and (param.step <= 0 or param.step > high - low):
        raise UsageError(f"parameter {name}: step {param.step:g} does not fit the range [{low:g}, {high:g}].")


def grid_size(space: Mapping[str, Param]) -> dict[str, int]:
    """The number of grid points of every parameter, counted without building them; a range without a step (no grid)
    is a UsageError naming it."""
    counts = {}
    for name, param in space.items():
        if isinstance(param, Choice):
            counts[name] = len(param.values)
        elif param.integer and not param.log:
            counts[name] = (int(param.high) - int(param.low)) // int(param.step or 1) + 1
        elif param.step is not None:
            counts[name] = int(math.floor((param.high - param.low) / param.step + 1e-9)) + 1
        else:
            raise UsageError(f"parameter {name}: a grid search needs choices, integers or a range with a step, got "
                             f"{param.describe()}.")
    return counts


def grid_values(space: Mapping[str, Param]) -> dict[str, list]:
    """The values of every parameter for a grid search: choices, integer ranges and ranges with a step. The grid is
    sized first (:func:`grid_size`): one of more than :data:`MAX_GRID_POINTS` points is refused with its count,
    before anything is built."""
    counts = grid_size(space)
    total = math.prod(counts.values())
    if total > MAX_GRID_POINTS:
        each = ", ".join(f"{name} {count:,}" for name, count in counts.items())
        raise UsageError(f"the grid has {total:,} points ({each}), more than the {MAX_GRID_POINTS:,} a grid search "
                         f"may hold (a step too small?); make the steps coarser, or search with --sampler tpe.")
    grid = {}
    for name, param in space.items():
        if isinstance(param, Choice):
            grid[name] = list(param.values)
        elif param.integer and not param.log:
            grid[name] = list(range(int(param.low), int(param.high) + 1, int(param.step or 1)))
        else:
            grid[name] = [round(param.low + i * param.step, 12) for i in range(counts[name])]
    return grid


def describe_space(space: Mapping[str, Param]) -> dict[str, str]:
    return {name: param.describe() for name, param in space.items()}
