"""The methods a capability test covers, read from the method registry (not kept by hand), and each method's small
setting for the tiny model (2-block towers, 32x32 images).

A test of a capability (batched groups equal runs alone, the pixel path end to end) is parametrised by
:func:`cases`: every registered method that declares the capability (``supports_batched_runs``, ``reads_pixels``,
see :class:`atlas_fast.methods.base.PromptMethod`) is a case, so a new method is tested without anyone adding it.

The rule that keeps the default run's cost: the default run keeps the **first registered method of each method file**
(``atlas_fast/methods/<file>.py``) among those that declare the capability, since a file's further methods share its
code path (DePT's variants, MMRL++, KDPL's hosts); every other capable method runs in the slow suite
(``python -m pytest -m slow``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from atlas_fast.methods import METHODS

# The teachers of the distilling methods: the tiny teacher model, random weights, no prompts of its own.
TINY_TEACHER = dict(teacher="atlas-tiny-teacher", teacher_pretrained="none")

# Method options (``--method-option``) that fit a method to the tiny model; a method not listed runs its recipe's
# config as it is (a default too deep for the tiny towers is refused at planning, naming the option to lower).
SMALL_OPTIONS: dict[str, dict[str, Any]] = {
    "ivlp": dict(n_ctx_text=2, n_ctx_vision=2, depth_text=2, depth_vision=2),
    "maple": dict(n_ctx=2, depth=2),
    "dept-maple": dict(n_ctx=2, depth=2),
    "promptsrc": dict(depth_text=2, depth_vision=2, gpa_mean=2, gpa_std=1),
    "tcp": dict(depth=2),
    "kdpl-coop": dict(TINY_TEACHER),
    "kdpl-cocoop": dict(TINY_TEACHER),
    "kdpl-maple": dict(n_ctx=2, depth=2, **TINY_TEACHER),
    "kdpl-promptsrc": dict(depth_text=2, depth_vision=2, **TINY_TEACHER),
    "coprompt": dict(depth=2),
    "mmrl": dict(depth=1, rep_dim=16),
    "mmrl++": dict(depth=1, rep_dim=16),
    # kd_weight 1: losses near 1, where the records' 1e-5 is float32's (the recipe's 1000 puts them near 600)
    "promptkd": dict(depth_vision=2, kd_weight=1.0, teacher_prompts="none", teacher_depth_text=2,
                     teacher_depth_vision=2, **TINY_TEACHER),
}

# Methods whose group and lone runs may differ by more than float reordering: PromptKD's training BatchNorm divides
# the roundings of a padded run's rows by the batch's spread and the bias before it drifts by float32's noise
# (tests/test_promptkd.py): learned tensors agree to 2e-4 (its BATCHED_GRAD_ATOL), ECE (percent) to 2e-3.
NOISY: frozenset[str] = frozenset({"promptkd"})


def capable(capability: Callable[[type], bool]) -> list[str]:
    """The registered methods (registry order) whose class has ``capability``."""
    return [name for name, cls in METHODS.items() if capability(cls)]


def default_subset(names: list[str]) -> list[str]:
    """The first of ``names`` (registry order) from each method file: the default run's representatives."""
    seen: set[str] = set()
    kept = []
    for name in names:
        file = METHODS[name].__module__
        if file not in seen:
            seen.add(file)
            kept.append(name)
    return kept


def cases(capability: Callable[[type], bool]) -> list:
    """``pytest.param`` per capable method: the default subset plain, the others marked slow."""
    names = capable(capability)
    representatives = set(default_subset(names))
    return [pytest.param(name, id=name, marks=() if name in representatives else pytest.mark.slow) for name in names]


def small_options(method: str, data_root: Path, classnames: list[str]) -> dict[str, Any]:
    """The method options of ``method``'s small setting; a method that reads class descriptions (a ``descriptions``
    field: CoPrompt) gets a file of one made-up sentence per class, written under ``data_root``."""
    from dataclasses import fields

    options = dict(SMALL_OPTIONS.get(method, {}))
    if "descriptions" in {f.name for f in fields(METHODS[method].config_class)}:
        path = Path(data_root) / "coprompt-descriptions.json"
        path.write_text(json.dumps({name.replace("_", " "): [f"a photo of a {name.replace('_', ' ')}."]
                                    for name in classnames}))
        options["descriptions"] = str(path)
    return options


def batches(cls: type) -> bool:
    return cls.supports_batched_runs


def batches_cached_features(cls: type) -> bool:
    return cls.supports_batched_runs and not cls.reads_pixels


def batches_pixels(cls: type) -> bool:
    return cls.supports_batched_runs and cls.reads_pixels


def reads_pixels(cls: type) -> bool:
    return cls.reads_pixels
