"""Grids of training runs (datasets x method variants x seeds), the building block of every experiment module.

A sweep is a plain loop over :class:`~atlas_fast.train.TrainConfig` values; this module only names the variants
the paper compares and runs the loop with one progress bar. Finished runs are skipped by :func:`train.run`, so a
killed sweep is resumed by running it again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from atlas_fast.report import SOFT_LABEL_NAMES
from atlas_fast.schedules import Atlas, LabelSchedule, OneHot
from atlas_fast.softlabels import SoftLabelConfig, atlas_period, atlas_preset
from atlas_fast.train import TrainConfig, run


@dataclass(frozen=True)
class Variant:
    """A method variant of a results table: its label schedule and soft labels (None for one-hot training)."""

    label: str
    schedule: LabelSchedule
    soft_labels: SoftLabelConfig | None = None


def atlas_variants(setting: str, kinds: Sequence[str] = ("ls", "csl", "isl")) -> list[Variant]:
    """The rows of the paper's Table III for ``setting``: the plain method, then + ATLaS with each soft-label kind,
    with the paper's K, θ, τ_c, α and δ for that setting."""
    period = atlas_period(setting)
    return [Variant("baseline", OneHot())] + [
        Variant(f"+ {SOFT_LABEL_NAMES[kind]}", Atlas(period), atlas_preset(setting, kind)) for kind in kinds]


def run_grid(base: TrainConfig, datasets: Sequence[str], variants: Sequence[Variant], seeds: Sequence[int],
             on_result: Callable[[dict[str, Any]], None] | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Train every (dataset, variant, seed) from ``base`` and return the records (finished runs are reused).

    ``on_result`` is called after each run (e.g. to print a line); inner progress bars follow ``base.progress``."""
    jobs = [(d, v, s) for d in datasets for v in variants for s in seeds]
    records = []
    with tqdm(jobs, desc="runs", unit="run", disable=not progress, dynamic_ncols=True) as bar:
        for dataset, variant, seed in bar:
            bar.set_postfix_str(f"{dataset} {variant.label} seed {seed}")
            config = dataclasses.replace(base, dataset=dataset, seed=seed, schedule=variant.schedule,
                                         soft_labels=variant.soft_labels)
            record = run(config)
            records.append(record)
            if on_result is not None:
                on_result(record)
    return records
