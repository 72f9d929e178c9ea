"""Paired statistics for the tables: a variant against its baseline, seed by seed.

Two variants trained with the same seed share the few-shot subset, the data order and the initialisation, so their
difference on that seed is one paired observation; the mean of the n per-seed differences, with a 95 % Student t
interval over them (``mean ± t_{0.975, n-1} · s / √n``, s the sample std), says whether the variant moved the
metric beyond what the seeds disagree on. With one seed there is no interval, and the tables say so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

LEVEL = 0.95


def counted(count: int, noun: str) -> str:
    """``1 seed``, ``3 seeds``: a count with its noun in the right number (titles and captions)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@dataclass(frozen=True)
class PairedDifference:
    """Mean of the per-seed differences (variant − baseline) and its 95 % t interval (None with one seed)."""

    mean: float
    low: float | None
    high: float | None
    seeds: int

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def direction(self) -> str:
        """``raises`` / ``lowers`` when the 95 % interval excludes 0, ``no difference at 95 %`` when it holds 0,
        ``one seed: no interval`` with one pair."""
        if not self.has_interval:
            return "one seed: no interval"
        if self.low > 0:
            return "raises"
        if self.high < 0:
            return "lowers"
        return "no difference at 95 %"

    def cell(self, digits: int = 2) -> str:
        """``+1.23 [+0.40, +2.06]`` (or ``+1.23 (1 seed)``)."""
        if not self.has_interval:
            return f"{self.mean:+.{digits}f} (1 seed)"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def paired_difference(variant: Sequence[float], baseline: Sequence[float], level: float = LEVEL
                      ) -> PairedDifference:
    """The mean paired difference ``variant[i] − baseline[i]`` and its t interval at ``level`` (scipy.stats)."""
    if len(variant) != len(baseline):
        raise ValueError(f"paired values must come in pairs: {len(variant)} variant vs {len(baseline)} baseline")
    if not variant:
        raise ValueError("no paired values (the variant and its baseline share no seed)")
    diffs = [float(v) - float(b) for v, b in zip(variant, baseline)]
    mean = statistics.fmean(diffs)
    if len(diffs) == 1:
        return PairedDifference(mean, None, None, 1)
    from scipy import stats

    half = float(stats.t.ppf(0.5 + level / 2, len(diffs) - 1)) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return PairedDifference(mean, mean - half, mean + half, len(diffs))


def paired_by_seed(variant: Mapping[int, float], baseline: Mapping[int, float]) -> PairedDifference | None:
    """:func:`paired_difference` over the seeds both have (None when they share none)."""
    seeds = sorted(set(variant) & set(baseline))
    if not seeds:
        return None
    return paired_difference([variant[s] for s in seeds], [baseline[s] for s in seeds])


def interval_note(seeds: int, reference: str = "its baseline") -> str:
    """The sentence under a table that carries paired differences."""
    if seeds <= 1:
        return f"Δ = difference to {reference} on the one seed there is: no interval"
    return (f"Δ = mean paired difference to {reference} over {counted(seeds, 'seed')} with a 95 % t interval "
            f"(scipy.stats, {seeds - 1} degree{'s' if seeds > 2 else ''} of freedom)")
