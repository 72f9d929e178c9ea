"""κ of Theorem 1 measured on finished runs: a run's training items and soft labels from the feature cache, its
learned tensors at the saved points (initialisation, snapshots, end), and :func:`atlas_fast.atlas.kappa.measure_kappa`
at each; plus the tables and sentences the experiment ``theorem1_kappa`` and the demo print from them.

The expectation is over the run's few-shot training items at their cached view 0 (``docs/theorem1-kappa.md``); the
soft labels are a run's of each kind, with the run's own hyper-parameters where it used that kind, else the presets.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from atlas_fast.atlas.softlabels import soft_label_preset
from atlas_fast.atlas.variants import SOFT_LABEL_NAMES, alternation_period
from atlas_fast.report.rows import variant_name
from atlas_fast.report.stats import paired_by_seed
from atlas_fast.vocabulary import SOFT_LABEL_KINDS
from atlas_fast.engine import TrainConfig

INIT, END = "init", "end"


def run_kappa(config: TrainConfig, record: dict[str, Any], kinds: Sequence[str] = SOFT_LABEL_KINDS,
              listings: dict | None = None) -> list[dict[str, Any]]:
    """κ of each soft label in ``kinds`` at every saved point of the finished run ``record`` of ``config``: its
    initialisation (re-made from the seed when no snapshot holds it), its snapshots and its final tensors. One row
    per (point, kind): dataset, seed, the run's variant, ``epochs`` (finished epochs at that point) and the fields of
    :class:`~atlas_fast.atlas.kappa.KappaMeasure`."""
    import torch

    from atlas_fast.atlas.kappa import measure_kappa
    from atlas_fast.atlas.softlabels import compute_soft_labels
    from atlas_fast.cache import FeatureCache
    from atlas_fast.engine.record import load_learned, split_snapshots
    from atlas_fast.engine.spec import plan_run

    spec = plan_run(config, listings=listings)
    backbone = spec.backbone()
    split = spec.data.train_split
    cache = FeatureCache(spec.config.cache_root, content_hash=spec.config.content_hash)
    features = cache.load(backbone, spec.dataset, split.train, views=[0], aug_seed=spec.config.aug_seed)[:, 0]
    labels = torch.tensor([d.label for d in split.train])
    soft = {}
    for kind in kinds:
        own = spec.config.soft_labels
        soft_config = own if own is not None and own.kind == kind else soft_label_preset(spec.config.setting, kind)
        rows = compute_soft_labels(soft_config, backbone, split, features,
                                   store_dir=Path(spec.config.cache_root) / "softlabels")
        soft[kind] = (rows, soft_config.theta)
    period = getattr(spec.config.schedule, "period", None) or alternation_period(spec.config.setting)
    final, snapshots = split_snapshots(load_learned(record["path"]))
    entry = spec.method
    torch.manual_seed(spec.config.seed)  # the run's own initialisation (engine.group.RunGroup)
    method = entry.build(backbone, split.classnames, spec.method_config).to(spec.device)
    points = {0: method.state_for_checkpoint(), **snapshots, spec.optim_recipe.epochs: final}
    name = variant_name(record["config"])
    rows = []
    for epochs, state in sorted(points.items()):
        method.load_checkpoint_state(state)
        for measure in measure_kappa(method, features, labels, soft, period):
            rows.append({"dataset": spec.dataset, "seed": spec.config.seed, "run": name, "epochs": epochs,
                         "point": INIT if epochs == 0 else END if epochs == spec.optim_recipe.epochs else str(epochs),
                         **measure.to_dict()})
    return rows


def own_run(kind: str) -> str:
    """The printed name of the ATLaS run that trains on soft label ``kind`` (``+ ATLaS-CSL``)."""
    return f"+ {SOFT_LABEL_NAMES[kind].alternating}"


def mean_over_seeds(rows: Sequence[dict[str, Any]], field: str = "kappa") -> dict[tuple, float]:
    """``field`` averaged over seeds per (dataset, run, epochs, kind)."""
    values: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        values[(row["dataset"], row["run"], row["epochs"], row["kind"])].append(float(row[field]))
    return {key: statistics.fmean(v) for key, v in values.items()}


def h_by_run(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[int, float]]:
    """H of each run per seed, by (dataset, variant name)."""
    from atlas_fast.engine.evaluate import harmonic_mean

    out: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for record in records:
        c, m = record["config"], record["metrics"]
        out[(c["dataset"], variant_name(c))][c["seed"]] = harmonic_mean(m["base"], m["new"])
    return out


def h_of_means(records: Sequence[dict[str, Any]], dataset: str, name: str) -> float:
    """H of the mean base and mean new accuracies over seeds of one run's variant: the H of the demo's table (one
    definition of H in every line the demo prints; the mean of per-seed H differs from it)."""
    from atlas_fast.engine.evaluate import harmonic_mean

    runs = [r["metrics"] for r in records
            if r["config"]["dataset"] == dataset and variant_name(r["config"]) == name]
    return harmonic_mean(statistics.fmean(m["base"] for m in runs), statistics.fmean(m["new"] for m in runs))


def kappa_sentence(rows: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]], dataset: str) -> str:
    """The verdict's sentence on κ for ``dataset``: each soft label's κ at initialisation and at the end of its own
    ATLaS run (mean over seeds), and whether ordering the soft labels by κ (lowest first: the tighter bound), at the
    initial context (measurable before any training) and at the runs' ends, gives the order of their runs' H
    (highest first), with how many steps of that H order hold at 95 %."""
    means = mean_over_seeds([r for r in rows if r["dataset"] == dataset])
    h = h_by_run(records)
    kinds = [k for k in SOFT_LABEL_KINDS if (dataset, own_run(k)) in h and any(key[3] == k for key in means)]
    if not kinds:
        return ""
    init = {k: next(v for key, v in means.items() if key[2] == 0 and key[3] == k) for k in kinds}
    end = {}
    for k in kinds:
        ends = [(key[2], v) for key, v in means.items() if key[1] == own_run(k) and key[3] == k]
        end[k] = max(ends)[1]
    h_mean = {k: round(h_of_means(records, dataset, own_run(k)), 2) for k in kinds}  # the table's H
    by_h = sorted(kinds, key=lambda k: -h_mean[k])
    name = {"ls": "LS", "csl": "CSL", "isl": "ISL", "mix": "mix"}
    values = ", ".join(f"{name[k]} {init[k]:.2f} -> {end[k]:.2f}" for k in kinds)

    def order(kappa: dict[str, float]) -> str:
        ranked = sorted(kinds, key=lambda k: kappa[k])
        if len(set(h_mean.values())) < len(kinds):
            return f"{', '.join(name[k] for k in ranked)} (their H ties: no order to compare)"
        return f"{', '.join(name[k] for k in ranked)} ({'the same order' if ranked == by_h else 'not the same order'})"

    steps = [paired_by_seed(h[(dataset, own_run(a))], h[(dataset, own_run(b))]) for a, b in zip(by_h, by_h[1:])]
    held = sum(1 for p in steps if p is not None and p.direction() == "raises")
    if steps and all(p is not None and p.has_interval for p in steps):
        holds = "holds" if held == 1 else "hold"
        support = f"of the {len(steps)} steps of the H order, {held} {holds} at 95 %, paired by seed"
    else:
        support = "one seed: the H order has no interval"
    return (f"κ on {dataset} (Lemma 1, σ̂²/σ² at the initial context -> at the end of the soft label's own ATLaS "
            f"run, mean over seeds): {values}. Highest H first (the table's: H of the mean base and new "
            f"accuracies): "
            f"{', '.join(f'{name[k]} {h_mean[k]:.2f}' for k in by_h)} ({support}); lowest κ first, at the initial "
            f"context (known before training): {order(init)}; at the end of the runs: {order(end)}.")


def with_snapshots(config: TrainConfig, fractions: Sequence[float]) -> TrainConfig:
    """``config`` saving its learned tensors at these fractions of its recipe's epochs (and at 0 and the end)."""
    from atlas_fast.data.datasets import dataset_spec
    from atlas_fast.engine.spec import resolve_recipe

    epochs = resolve_recipe(config, dataset_spec(config.dataset).name)[1].epochs  # the recipe's, or the override
    points = {0, epochs} | {min(epochs, max(0, round(epochs * f))) for f in fractions}
    return dataclasses.replace(config, snapshot_epochs=tuple(sorted(points)))
